"""Models: the seed's conv net and a small MLP (TensorLayer), or your own Keras 3
model from a .keras file, each as a ``Model`` the engine can train.

``build_model(cfg, ...)`` returns a ``Model``: the network, a ``forward(x, training)`` that gives logits, the
variables to train and to checkpoint, and the norm layers whose moving statistics the engine moves once per update
(the backend's ``AccumBatchNorm`` and ``pool``). One module per job: ``containers`` (``Model``, ``KerasModel``),
``builtin`` (the TensorLayer networks), ``keras_file`` (loading and checking your file), ``keras_loss`` (it
compiled with a Keras loss, taken apart), ``precision`` (mixed-precision compute).
"""

from __future__ import annotations

import keras

from ..config import MODEL_NAMES, SEED_CHANNELS, ModelConfig
from .builtin import SEED_STRIDES, mlp, seed_convnet, tensorlayer_model
from .containers import KerasModel, Model
from .keras_file import keras_file
from .precision import set_precision

__all__ = [
    "BUILDERS",
    "SEED_CHANNELS",
    "SEED_STRIDES",
    "KerasModel",
    "Model",
    "build_model",
]

BUILDERS = {"seed_convnet": tensorlayer_model(seed_convnet), "mlp": tensorlayer_model(mlp), "keras_file": keras_file}
if tuple(BUILDERS) != MODEL_NAMES:  # a registry out of step with the config is a bug
    raise ImportError(f"model registry {tuple(BUILDERS)} != config.MODEL_NAMES {MODEL_NAMES}")


def build_model(cfg: ModelConfig, seed: int, input_shape, num_classes: int, precision: str = "float32") -> Model:
    """Build the named network for the dataset's input shape and class count.

    Built-in weights are drawn from ``seed``; a keras_file model starts from
    its file's weights (the seed still fixes dropout masks and the data order).
    Keras' layers draw their seed generators' seeds from Python's ``random``
    when the file is loaded, hence Keras' own seeding (it includes TensorFlow's)."""
    keras.utils.set_random_seed(seed)
    return set_precision(BUILDERS[cfg.name](cfg, tuple(input_shape), int(num_classes)), precision)
