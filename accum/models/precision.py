"""Mixed precision for a built model: 16-bit compute, float32 weights and logits.

Keras' mixed policies go on a keras_file model's layers; the TensorLayer
built-ins get their forward passes wrapped to cast inputs and weights for the
call. Weights, their gradients, BatchNorm statistics and everything the
engine keeps stay float32.
"""

from __future__ import annotations

import contextlib

import keras
from keras import ops

from ..backends import active
from .containers import KerasModel, Model, leaves


def float8_scales(model: keras.Model) -> list[str]:
    """The names of a model's variables that quantize("float8") made for training (scales, amax histories): they
    take each step's new value in place of a gradient, which micro-batches cannot add up (fit's and the CLI's
    refusal, Refused key float8-training)."""
    return [v.name for v in model.trainable_variables if getattr(v, "overwrite_with_gradient", False)]


def _cast_weights_forward(layer, dtype):
    """layer.forward in ``dtype``: its input and its float32 weights cast for the call (their gradients come
    back float32 through the cast). TL keeps the weights as attributes (self.W, self.b) apart from its
    weight lists, so swapping the attributes for the length of one call changes nothing else."""
    original = layer.forward
    # its float32 variables (TL's are tf.Variables: what has ``assign`` and a dtype)
    names = [k for k, v in vars(layer).items() if hasattr(v, "assign") and getattr(v, "dtype", None) == "float32"]

    def forward(inputs, *args, **kwargs):
        saved = {k: layer.__dict__[k] for k in names}
        try:
            for k, v in saved.items():
                layer.__dict__[k] = ops.cast(v, dtype)
            floating = keras.backend.is_float_dtype(inputs.dtype)
            return original(ops.cast(inputs, dtype) if floating else inputs, *args, **kwargs)
        finally:
            layer.__dict__.update(saved)

    return forward


def _float32_forward(layer, dtype):
    """layer.forward in float32 (GroupNorm: no fused op), its output back in ``dtype``."""
    original = layer.forward
    return lambda inputs, *args, **kwargs: ops.cast(original(ops.cast(inputs, "float32"), *args, **kwargs), dtype)


def set_precision(model: Model, precision: str) -> Model:
    """Compute in bfloat16/float16 with float32 variables (a Keras mixed policy); logits come out float32."""
    if precision == "float32":
        return model
    dtype = keras.DTypePolicy(precision).compute_dtype
    if isinstance(model, KerasModel):
        for layer in leaves(model.network):
            if not isinstance(layer, keras.layers.InputLayer):
                layer.dtype_policy = keras.DTypePolicy(precision)  # a global policy does nothing to a file's layers
    else:
        for layer in model.network.all_layers:
            if not isinstance(layer, active().AccumBatchNorm):  # the fused op takes 16-bit activations as they come
                layer.forward = (_float32_forward if isinstance(layer, active().GroupNorm) else _cast_weights_forward)(
                    layer, dtype
                )
    forward = model.forward
    model.forward = lambda images, training: ops.cast(forward(images, training), "float32")
    return model


@contextlib.contextmanager
def call_precision(model, precision):
    """A Keras model's layers under ``precision``'s policy for one call (None: as they are): accum_train.fit's
    ``precision``."""
    if precision is None:
        yield
        return
    saved = [(layer, layer.dtype_policy) for layer in leaves(model) if not isinstance(layer, keras.layers.InputLayer)]
    try:
        for layer, _ in saved:
            layer.dtype_policy = keras.DTypePolicy(precision)
        yield
    finally:
        for layer, policy in saved:
            layer.dtype_policy = policy
