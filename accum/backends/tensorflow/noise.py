"""The gradient noise scale in the graph (the estimate: accum/trainer/noise.py): each micro-step's terms, an
update's record of them after the all-reduce, and the running averages as tf.Variables a checkpoint holds."""

from __future__ import annotations

import tensorflow as tf

from ...trainer.noise import Estimate, update_sums


def micro_terms(gradients: list, size) -> tf.Tensor:
    """One micro-batch's terms (in graph): ``gradients`` one list per normaliser (None where a variable has
    none), ``size`` its b_i. Each pair's inner product over b_i^2, then 1/b_i, 1 and b_i; zeros when empty."""
    dense = [[None if g is None else tf.cast(tf.convert_to_tensor(g), tf.float32) for g in one] for one in gradients]
    products = []
    for a, first in enumerate(dense):
        for offset, second in enumerate(dense[a:]):
            if offset == 0:  # a squared norm: one L2Loss op per variable (half the sum of squares) where u * v is two
                halves = [tf.nn.l2_loss(u) for u in first if u is not None]
                products.append(2.0 * tf.add_n(halves) if halves else tf.constant(0.0))
                continue
            pairs = [tf.reduce_sum(u * v) for u, v in zip(first, second) if u is not None and v is not None]
            products.append(tf.add_n(pairs) if pairs else tf.constant(0.0))
    b = tf.maximum(tf.cast(size, tf.float32), 1.0)
    there = tf.cast(size > 0, tf.float32)
    return tf.concat([tf.stack(products) / (b * b), [1.0 / b, 1.0, b]], 0) * there


def update_terms(terms, factors: list, loss_scale, gradient) -> dict:
    """An update's record of the noise (in graph) from its all-reduced ``terms``: ``noise`` [sum |g_i|^2,
    sum 1/b_i, k] and ``noise_batch`` [|G_B|^2, B]. ``factors``: each normaliser's multiplier of its
    cache (scale / D_g); ``loss_scale``: what the caches were multiplied by; ``gradient``: G_B."""
    squares, inverses, micro_batches, total = update_sums(terms, factors, loss_scale)
    batch = 2.0 * tf.add_n([tf.nn.l2_loss(g) for g in gradient])
    return {"noise": tf.stack([squares, inverses, micro_batches]), "noise_batch": tf.stack([batch, total])}


class NoiseScale(Estimate):
    """The running estimate (trainer/noise.py's Estimate), its averages kept in tf.Variables a checkpoint holds."""

    def __init__(self, measured: bool = True):
        super().__init__(measured)
        # float64: thousands of updates add into them; outside any strategy's scope, as the run's step is (every
        # worker computes the same values from the same all-reduced sums)
        self.trace = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="noise_trace")
        self.signal = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="noise_signal")
        self.weight = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="noise_weight")
        # The averages as the updates leave them, on the host: the variables are only what a checkpoint saves
        # (``store``) and restores (``forget``). Folded in with eager ops and read back, they cost about 0.5 ms an
        # update, most of a small model's time outside its graph call (profiled, 2-core CPU).
        self._host = None  # (trace, signal, weight); None: as the variables hold them

    def variables(self) -> dict:
        return {"noise_trace": self.trace, "noise_signal": self.signal, "noise_weight": self.weight}

    def store(self) -> None:
        """Write the averages into their variables: before a checkpoint saves them."""
        for variable, value in zip((self.trace, self.signal, self.weight), self._state()):
            variable.assign(value)

    def forget(self) -> None:
        """Take the averages from the variables again: after a checkpoint restored them."""
        self._host = None

    def _state(self) -> tuple:
        if self._host is None:
            self._host = tuple(float(v.numpy()) for v in (self.trace, self.signal, self.weight))
        return self._host
