"""A Keras 3 model object handed to ``accum_train.fit``, made trainable by the engine.

The engine trains a clone: every layer is rebuilt from its config (inside the
strategy's scope when there is one, so that its variables are mirrored), the
BatchNormalization layers as ``KerasAccumBatchNorm`` (statistics pooled over
the micro-batches and replicas of an update), a softmax output layer without
its softmax (the engine differentiates logits). The weights are copied in
before training and back out after it: the object the caller holds ends with
the trained weights and keeps its own layers (its BatchNormalization is
Keras' own again, with the pooled moving statistics).
"""

from __future__ import annotations

import keras

from ..api import WHERE
from ..errors import UserError
from .containers import KerasModel
from .keras_file import _is_softmax, _output_layer, _without_softmax, leaves
from .norm import KerasAccumBatchNorm


def from_logits(model: keras.Model) -> bool:
    """Whether the model outputs logits (its last layer is no softmax)."""
    return not _is_softmax(_output_layer(model))


def check_model(model) -> None:
    """A built Functional or Sequential keras.Model with one input and one output; else one line."""
    if not isinstance(model, keras.Model):
        raise UserError(f"{WHERE}: model is a {type(model).__name__}, not a keras.Model: pass a Keras 3 model")
    try:
        inputs, outputs = model.inputs, model.outputs
    except (AttributeError, ValueError):
        inputs = outputs = None
    if not inputs or not outputs:
        raise UserError(
            f"{WHERE}: model {model.name!r} is not built (a subclassed model, or a Sequential without an "
            f"input shape): build it on keras.Input(shape=...) as a Functional or Sequential model"
        )
    if len(inputs) != 1 or len(outputs) != 1:
        raise UserError(
            f"{WHERE}: model {model.name!r} has {len(inputs)} inputs and {len(outputs)} outputs: accum_train.fit "
            f"feeds one input tensor and reads one output of class scores"
        )
    for layer in leaves(model):
        if isinstance(layer, keras.layers.BatchNormalization) and layer.renorm:
            raise UserError(
                f"{WHERE}: BatchNormalization {layer.name!r} has renorm=True, whose corrections cannot be "
                f"pooled over micro-batches: use renorm=False"
            )


class Adopted:
    """The engine's clone of a user's model (``model``, a KerasModel) and the way back to the original."""

    def __init__(self, original: keras.Model):
        last = _output_layer(original)
        self.pairs = []  # (original layer, clone) for every layer with weights to carry over

        def clone(layer):
            if layer is last and _is_softmax(layer):
                new = _without_softmax(layer)
            elif isinstance(layer, keras.layers.BatchNormalization):
                new = KerasAccumBatchNorm.from_config(layer.get_config())
            else:
                new = layer.__class__.from_config(layer.get_config())
            self.pairs.append((layer, new))
            return new

        network = keras.models.clone_model(original, clone_function=clone, recursive=True)
        for old, new in self.pairs:  # built by clone_model: same shapes, the original's values
            new.set_weights(old.get_weights())
        norm_layers = [layer for layer in leaves(network) if isinstance(layer, KerasAccumBatchNorm)]

        def forward(x, training: bool):
            return network(x, training=training)

        self.model = KerasModel(network=network, forward=forward, norm_layers=norm_layers)

    def copy_back(self) -> None:
        """The clone's weights (moving statistics included) into the original's layers."""
        for old, new in self.pairs:
            old.set_weights(new.get_weights())
