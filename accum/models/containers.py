"""What the engine needs of a network: ``Model`` (TensorLayer) and ``KerasModel`` (a keras_file).

A model gives a ``forward(x, training)`` that returns logits, the variables to
train and to checkpoint, stable names for weights.npz, and the norm layers
whose moving statistics the engine moves once per update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import keras

from ..keras_private import storage


@dataclass(frozen=True)
class BuiltInNet:
    """What the backend builds a built-in net from: model.* of the config, read once by the front end."""

    name: str  # seed_convnet or mlp
    norm: str  # batchnorm, groupnorm or none
    channels: tuple[int, ...]  # of each normalised layer (model.norm_channels)
    hidden: int  # the MLP's hidden units
    bn_momentum: float
    groups: int


@dataclass
class Model:
    """A TensorLayer network and what the engine needs to train it."""

    network: Any  # tl.models.Model here; keras.Model in KerasModel
    forward: Callable  # (images float32 [n, *input_shape], training: bool) -> logits [n, num_classes]
    norm_layers: list[Any]  # AccumBatchNorm, or PooledBatchNorm adapters of a Keras model's layers

    @property
    def trainable_variables(self):
        return list(self.network.trainable_weights)

    @property
    def variables(self):
        """Everything that defines the model: weights and moving statistics (what a checkpoint holds)."""
        return list(self.network.all_weights)

    def named_weights(self) -> dict:
        """Stable names (from explicit layer names) -> variables, for weights.npz."""
        return {v.name.split(":")[0]: v for v in self.variables}


@dataclass
class KerasModel(Model):
    """A keras_file network. Its variables are handed out as the tf.Variables
    under Keras' own (the same storage), so the engine, the optimizer and
    tf.train.Checkpoint see what they see for TensorLayer. ``peeled`` pairs
    the output layer trained without its softmax (from_logits=false) with the
    file's original, which export puts back."""

    peeled: list[tuple[Any, Any]] = field(default_factory=list)

    @property
    def trainable_variables(self):
        return [storage(v) for v in self.network.trainable_variables]

    @property
    def variables(self):
        # includes the state of dropout's seed generators: a resumed run draws the same masks
        return [storage(v) for v in self.network.variables]

    def named_weights(self) -> dict:
        """LAYER/WEIGHT names (nested models as MODEL/LAYER/WEIGHT) -> variables, for weights.npz.

        Built from the layer tree, not from Keras' variable paths, which depend
        on where a layer was first built (a clone's prefix, or none after a load)."""
        names: dict = {}

        def add(name, variable):
            unique, n = name, 0
            while unique in names:  # two weights of one name (a layer with inner layers): _1, _2, ...
                n += 1
                unique = f"{name}_{n}"
            names[unique] = storage(variable)

        def walk(layer, prefix):
            if isinstance(layer, keras.Model):
                for inner in layer.layers:
                    walk(inner, f"{prefix}{layer.name}/")
                return
            for v in layer.variables:
                tail = v.path.rsplit(f"{layer.name}/", 1)[-1] if f"{layer.name}/" in v.path else v.name
                add(f"{prefix}{layer.name}/{tail}", v)

        for layer in self.network.layers:
            walk(layer, "")
        named = {id(v) for v in names.values()}
        for v in self.network.variables:  # any variable no layer owns
            if id(storage(v)) not in named:
                add(v.path, v)
        return names


def leaves(model: keras.Model) -> list:
    """Every layer of a Keras model, nested Functional and Sequential models opened."""
    layers = []
    for layer in model.layers:
        layers += leaves(layer) if isinstance(layer, keras.Model) else [layer]
    return layers
