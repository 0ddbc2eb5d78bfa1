"""The gradient noise scale, measured from the micro-batches every update already has (McCandlish et al. 2018,
"An Empirical Model of Large-Batch Training", Appendix A.1), and the batch size that follows it.

B_noise = tr(Sigma) / |G|^2: the per-example gradient variance summed over parameters, over the squared norm
of the true gradient. Past it, a larger batch buys fewer and fewer saved updates. The estimate needs
gradients over two batch sizes; an update holds both: its micro-batches' and its whole batch's.

Micro-batch i holds b_i examples (sizes differ by one, a short batch, each replica's), g_i is its mean gradient
over its own examples, G_B the batch's mean gradient over B = sum b_i examples. With examples drawn
independently, E|g_i|^2 = |G|^2 + S / b_i and E|G_B|^2 = |G|^2 + S / B (S = tr(Sigma)). With m = mean_i |g_i|^2
and h = mean_i 1 / b_i over the k non-empty micro-batches, E m = |G|^2 + S h, so for one update, unbiased:

    S_hat  = (m - |G_B|^2) / (h - 1/B)        G2_hat = |G_B|^2 - S_hat / B

(h - 1/B > 0 whenever k >= 2: an update of one micro-batch has no estimate.) The engine sums |g_i|^2, 1/b_i and
k in its graph and they ride in the update's one all-reduce (engine.py ``_noise_terms``); |G_B| is the norm it
computes anyway, before clipping. Here, on the host: S_hat and G2_hat each averaged over updates, an
exponential average with DECAY per update (Adam's bias correction), and their ratio (the ratio of averages,
not an average of ratios: one update's G2_hat is noisy and often negative). Skipped and dropped updates count
nothing. The averages are checkpointed, so a resumed run reads the values an uninterrupted one would.
"""

from __future__ import annotations

import math

import tensorflow as tf

# Each update's estimate weighs 1 - DECAY in the average: about the last 1 / (1 - DECAY) = 20 updates count.
DECAY = 0.95


def one_update(squares: float, inverses: float, count: float, batch_squared: float, n: int):
    """(S_hat, G2_hat) of one update from its sums (sum |g_i|^2, sum 1/b_i, k) and |G_B|^2 over n examples;
    None when it has no estimate (fewer than two non-empty micro-batches)."""
    if count < 2 or n < 2:
        return None
    m, h = squares / count, inverses / count
    spread = h - 1.0 / n
    if spread <= 0:
        return None
    trace = (m - batch_squared) / spread
    return trace, batch_squared - trace / n


class NoiseScale:
    """The running estimate: exponential averages of S_hat and G2_hat (tf.Variables, checkpointed)."""

    def __init__(self):
        # float64: thousands of updates add into them; outside any strategy's scope, as the run's step is (every
        # worker computes the same values from the same all-reduced sums)
        self.trace = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="noise_trace")
        self.signal = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="noise_signal")
        self.weight = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="noise_weight")

    def variables(self) -> dict:
        return {"noise_trace": self.trace, "noise_signal": self.signal, "noise_weight": self.weight}

    def add(self, out: dict, n: int) -> float | None:
        """Fold in one update's record (the engine's: ``noise`` sums, ``grad_norm``, ``applied``) of ``n``
        examples; the noise scale after it."""
        if "noise" not in out or not bool(out["applied"]):
            return self.value()
        squares, inverses, count = (float(v) for v in out["noise"])
        estimate = one_update(squares, inverses, count, float(out["grad_norm"]) ** 2, int(n))
        if estimate is not None and all(math.isfinite(v) for v in estimate):
            trace, signal = estimate
            self.trace.assign(DECAY * self.trace + (1 - DECAY) * trace)
            self.signal.assign(DECAY * self.signal + (1 - DECAY) * signal)
            self.weight.assign(DECAY * self.weight + (1 - DECAY))
        return self.value()

    def averages(self) -> tuple[float, float] | None:
        """(tr(Sigma), |G|^2), bias-corrected; None before any update had an estimate."""
        weight = float(self.weight.numpy())
        if weight <= 0:
            return None
        return float(self.trace.numpy()) / weight, float(self.signal.numpy()) / weight

    def value(self) -> float | None:
        """B_noise = tr(Sigma) / |G|^2 (examples); None with no estimate yet, or while |G|^2's average is not
        positive (the gradient lost in its noise: the batch that would see it is beyond measuring)."""
        averages = self.averages()
        if averages is None or averages[1] <= 0 or averages[0] < 0:
            return None
        return averages[0] / averages[1]


def grown_batch(noise_scale: float | None, batch_size: int, micro_batch_size: int, max_batch_size: int) -> int:
    """batch_schedule rule noise_scale: the batch from now on. The estimate rounded to whole micro-batches,
    never smaller than the batch in force and at most max_batch_size; the batch in force with no estimate."""
    if noise_scale is None or not math.isfinite(noise_scale):
        return batch_size
    rounded = max(1, round(noise_scale / micro_batch_size)) * micro_batch_size
    return max(batch_size, min(rounded, max_batch_size))
