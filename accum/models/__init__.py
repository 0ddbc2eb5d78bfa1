"""Models: the seed's conv net and a small MLP (TensorLayer, which only TensorFlow runs: the backend builds them,
``active().built_in``), or your own Keras 3 model from a .keras file, each as a ``Model`` the engine can train.

``build_model(cfg, ...)`` returns a ``Model``: the network, a ``forward(x, training)`` that gives logits, the
variables to train and to checkpoint, and the norm layers whose moving statistics the engine moves once per update
(the backend's ``AccumBatchNorm`` and ``pool``). One module per job: ``containers`` (``Model``, ``KerasModel``),
``keras_file`` (loading and checking your file), ``keras_loss`` (it compiled with a Keras loss, taken apart),
``precision`` (mixed-precision compute).
"""

from __future__ import annotations

import keras

from ..backends import active
from ..config import MODEL_NAMES, SEED_CHANNELS, ModelConfig
from .containers import BuiltInNet, KerasModel, Model
from .keras_file import keras_file
from .precision import set_precision

__all__ = ["BUILDERS", "SEED_CHANNELS", "KerasModel", "Model", "build_model"]

# None: a built-in net, which the backend builds (TensorLayer's, which only TensorFlow runs: JAX's refuses it)
BUILDERS = {"seed_convnet": None, "mlp": None, "keras_file": keras_file}
if tuple(BUILDERS) != MODEL_NAMES:  # a registry out of step with the config is a bug
    raise ImportError(f"model registry {tuple(BUILDERS)} != config.MODEL_NAMES {MODEL_NAMES}")


def build_model(cfg: ModelConfig, seed: int, input_shape, num_classes: int, precision: str = "float32") -> Model:
    """Build the named network for the dataset's input shape and class count.

    Built-in weights are drawn from ``seed``; a keras_file model starts from
    its file's weights (the seed still fixes dropout masks and the data order).
    Keras' layers draw their seed generators' seeds from Python's ``random``
    when the file is loaded, hence Keras' own seeding (it includes TensorFlow's)."""
    keras.utils.set_random_seed(seed)
    shape, classes = tuple(input_shape), int(num_classes)
    if BUILDERS[cfg.name]:
        return set_precision(BUILDERS[cfg.name](cfg, shape, classes), precision)
    net = BuiltInNet(cfg.name, cfg.norm, cfg.norm_channels, cfg.hidden, cfg.bn_momentum, cfg.groups)
    return set_precision(active().built_in(net, shape, classes), precision)
