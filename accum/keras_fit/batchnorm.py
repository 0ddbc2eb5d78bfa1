"""The BatchNormalization layers of a model handed to accum_train.fit, pooled over each update's micro-batches.

accum_train.fit trains the caller's own model object (callbacks such as
ModelCheckpoint save it as it trains). For the length of the call, each
trainable BatchNormalization layer's ``call`` is replaced, on that instance
only, by the pooling one (``norm.pooled_call``): it normalises each
micro-batch with that micro-batch's statistics and pools the statistics
(``PendingStats``), which the engine folds into the moving mean and variance
once per update, from every micro-batch of every replica. The layer keeps its
class, config and weights: a model saved meanwhile is a plain Keras model, and
the instance is Keras' own again when fit returns.
"""

from __future__ import annotations

import contextlib
import functools

import keras

from ..errors import UserError
from ..models.keras_file import leaves
from ..models.norm import PendingStats, fold_statistics, pooled_call


class PooledBatchNorm:
    """The engine's norm-layer API (``deferred``, ``pending``, ``fold``, ``discard``) for one Keras layer."""

    def __init__(self, layer: keras.layers.BatchNormalization):
        self.layer = layer
        self.name = layer.name
        self.deferred = False
        self.pending = PendingStats(layer.name, tuple(layer.moving_mean.shape))

    # what pooled_call reads of the layer it stands for
    def __getattr__(self, name):
        return getattr(self.layer, name)

    def fold(self, values):
        """Move the moving statistics once by the pooled ones (summed over replicas)."""
        fold_statistics(self.layer.moving_mean, self.layer.moving_variance, self.layer.momentum, values)

    def discard(self):
        self.pending.clear()


def batch_norm_layers(model: keras.Model) -> list:
    """The model's BatchNormalization layers (nested models included) that train; renorm refused in one line."""
    found = []
    for layer in leaves(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            if layer.renorm:
                raise UserError(
                    f"accum_train.fit: BatchNormalization {layer.name!r} has renorm=True, whose corrections cannot "
                    f"be pooled over micro-batches: use renorm=False"
                )
            found.append(layer)
    return found


@contextlib.contextmanager
def pooled(model: keras.Model, strategy, adapters=None):
    """Within: the model's BatchNormalization layers pool their statistics; yields their norm-layer objects
    (created in ``strategy``'s scope, the pending sums replica-local; or ``adapters``, made by an earlier call)."""
    layers = batch_norm_layers(model)
    if adapters is None:
        with strategy.scope():
            adapters = [PooledBatchNorm(layer) for layer in layers]
    else:
        layers = [adapter.layer for adapter in adapters]
    try:
        for layer, adapter in zip(layers, adapters):
            keras_call = type(layer).call.__get__(layer)
            # an instance attribute: Keras' Operation.__call__ looks ``self.call`` up at each call
            object.__setattr__(layer, "call", functools.partial(pooled_call, adapter, keras_call))
        yield adapters
    finally:
        for layer in layers:
            if "call" in vars(layer):
                object.__delattr__(layer, "call")
