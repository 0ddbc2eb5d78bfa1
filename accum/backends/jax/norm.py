"""BatchNormalization on JAX as the TensorFlow backend's norm.py runs it: each micro-step normalises by its own
micro-batch's statistics, and the moving statistics move once per update, from the statistics of the whole batch.

While the objective traces a micro-step, each BatchNormalization layer's ``_moments`` (what its ``call`` asks for
the batch's mean and variance in training) is replaced on the instance by ``Pooled``'s: moments over the rows the
micro-batch holds (the rows engine.py padded it with weighted 0, with the layer's mask where it has one), and beside
them the micro-batch's count, sum and sum of squares about the moving mean, which the update adds up over its
micro-steps (and devices) like the gradient. The moving statistics Keras' ``call`` assigns in each micro-step are
put back; once per update ``fold`` moves them by the pooled batch's mean and variance with Keras' own momentum
formula, and keeps them where the update is skipped. Sums about the moving mean (fixed during an update) rather than
about 0, so that the sum of squares does not cancel.
"""

from __future__ import annotations

import contextlib
import math

import jax.numpy as jnp
import keras
import numpy as np

from ... import keras_private


class Pooled:
    """The trainable BatchNormalization layers of ``model`` and where their moving statistics sit among its
    non-trainable variables."""

    def __init__(self, model):
        at = {id(v): i for i, v in enumerate(model.non_trainable_variables)}
        self.layers = [
            (layer, at[id(layer.moving_mean)], at[id(layer.moving_variance)])
            for layer in keras_private.all_layers(model)
            if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable
        ]

    def zeros(self) -> list:
        """Nothing pooled: (count, sum, sum of squares) per layer, float32, one entry per channel."""
        # numpy's: made afresh for each update (its buffers are donated to it) without a dispatch each to JAX
        return [tuple(np.zeros(layer.moving_mean.shape, "float32") for _ in range(3)) for layer, _, _ in self.layers]

    @contextlib.contextmanager
    def recording(self, valid, pending: list):
        """Within: each layer's moments over the rows ``valid`` marks (1, else 0), its sums added to ``pending``
        (``zeros``' form) where a traced call records them."""
        for index, (layer, _, _) in enumerate(self.layers):
            layer._moments = _moments(layer, valid, pending, index)
        try:
            yield
        finally:
            for layer, _, _ in self.layers:
                del layer._moments  # Keras' own method again

    def kept(self, before: list, after: list) -> list:
        """``after`` (the non-trainable values a traced call left) with the moving statistics as in ``before``."""
        after = list(after)
        for _, mean, variance in self.layers:
            after[mean], after[variance] = before[mean], before[variance]
        return after

    def fold(self, non_trainable: list, pending: list, finite) -> list:
        """The moving statistics moved once by the pooled batch (Keras' formula, its momentum), where the update is
        ``finite`` and its batch held a row for them."""
        moved = list(non_trainable)
        for (layer, mean_at, variance_at), (count, total, squares) in zip(self.layers, pending):
            mean, variance = moved[mean_at], moved[variance_at]
            rows = jnp.maximum(count, 1.0)
            delta = total / rows  # the batch's mean less the moving mean
            batch_mean, batch_variance = mean + delta, squares / rows - jnp.square(delta)
            momentum, taken = layer.momentum, jnp.logical_and(finite, count > 0)
            new_mean = mean * momentum + batch_mean.astype(mean.dtype) * (1.0 - momentum)
            new_variance = variance * momentum + batch_variance.astype(variance.dtype) * (1.0 - momentum)
            moved[mean_at] = jnp.where(taken, new_mean, mean)
            moved[variance_at] = jnp.where(taken, new_variance, variance)
        return moved


def _moments(layer, valid, pending: list, index: int):
    """``layer._moments(inputs, mask)`` over the valid rows, recording their sums about the moving mean."""

    def moments(inputs, mask):
        axes = layer._reduction_axes
        weights = jnp.reshape(valid, valid.shape + (1,) * (inputs.ndim - 1)).astype(inputs.dtype)
        if mask is not None:  # one dimension less than the inputs, as Keras' own masked moments take it
            weights = weights * jnp.expand_dims(mask, -1).astype(inputs.dtype)
        # the weights' sum as if broadcast to the inputs, counted without making that broadcast: a copy of the
        # activations written and read three times more per micro-step than Keras' own moments (XLA's cost analysis)
        spread = math.prod(inputs.shape[a] for a in axes if weights.shape[a] == 1)
        kept_shape = [size for axis, size in enumerate(inputs.shape) if axis not in axes]
        count = jnp.broadcast_to(jnp.sum(weights, axis=axes) * spread, kept_shape)
        rows = jnp.maximum(count, 1.0)  # a micro-batch of padding alone: moments 0, which nothing counts
        mean = jnp.sum(weights * inputs, axis=axes) / rows
        variance = jnp.sum(weights * jnp.square(inputs - _kept(mean, axes, inputs)), axis=axes) / rows
        # the sums about the moving mean m0 from these moments, not from two more passes over the activations:
        # sum(x - m0) = count (mean - m0), sum((x - m0)^2) = count (variance + (mean - m0)^2)
        apart = mean - jnp.asarray(layer.moving_mean.value, inputs.dtype)
        sums = (count, count * apart, count * (variance + jnp.square(apart)))
        pending[index] = tuple(a + b.astype("float32") for a, b in zip(pending[index], sums))
        return mean, variance

    return moments


def _kept(values, axes, inputs):
    """Per-channel ``values`` shaped to broadcast against ``inputs`` (the reduced ``axes`` as 1)."""
    return jnp.reshape(values, [1 if axis in axes else size for axis, size in enumerate(inputs.shape)])
