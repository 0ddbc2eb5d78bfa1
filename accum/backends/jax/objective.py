"""A compiled Keras loss as a micro-batch's sum and normaliser, on JAX's arrays: the plain case of the TensorFlow
backend's keras_objective.py (read its docstring for why a batch's loss is ``S / D`` and why accumulation adds the
``S`` and the ``D`` apart).

One output, one loss of Keras' mean reductions (``sum_over_batch_size``, or ``mean_with_sample_weight``), no mask,
no loss the layers add, no weight regularizer: what this step of issue 76 covers. ``check`` refuses the rest
before anything is traced, and ``parts`` what only a trace shows (a mask, a layer's loss). Rows a micro-batch was
padded with (engine.py stacks micro-batches of unequal size) carry ``valid`` 0: they add nothing to ``S`` or ``D``.
"""

from __future__ import annotations

import jax.numpy as jnp
import keras

from ... import keras_private
from ...errors import UserError

MEANS = ("sum_over_batch_size", "mean_with_sample_weight")
LATER = "is not on Keras' JAX backend yet (issue 76): train it with KERAS_BACKEND=tensorflow"


def refused(what: str, where: str) -> UserError:
    return UserError(f"{where}: {what} {LATER}")


class KerasObjective:
    """``model``'s compiled loss, taken apart per micro-batch: ``parts`` gives (S, D) as Keras would reduce it."""

    def __init__(self, model: keras.Model, where: str = "accum_train.fit"):
        self.model, self.where = model, where
        self.check()
        (self.entry,) = keras_private.flat_losses(model)

    def check(self) -> None:
        model, where = self.model, self.where
        if keras_private.compile_loss(model) is None or model.optimizer is None:
            raise refused(f"model {model.name!r} uncompiled or compiled without a loss", where)
        entries = keras_private.flat_losses(model)
        if len(entries) != 1:
            raise refused(f"a compiled loss over {len(entries)} outputs (model {model.name!r})", where)
        reduction = entries[0].loss.reduction
        if reduction not in MEANS:
            raise refused(f"loss {entries[0].loss.name!r} with reduction={reduction!r}", where)
        if keras_private.compile_metrics(model) is not None:
            raise refused(f"model {model.name!r} compiled with metrics", where)
        if isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
            raise refused("a LossScaleOptimizer (mixed_float16)", where)
        if model.non_trainable_variables:  # BatchNormalization's statistics, a Dropout's seed, frozen weights
            names = ", ".join(layer.name for layer in model.layers if layer.non_trainable_variables)
            raise refused(f"a model with non-trainable variables ({names})", where)
        if any(getattr(v, "regularizer", None) is not None for v in model.trainable_variables):
            raise refused(f"a weight regularizer (model {model.name!r})", where)

    def parts(self, trainable, non_trainable, x, y, sample_weight, valid):
        """(S, D) of one micro-batch (``valid``: 1 for its rows, 0 for padding), as jnp scalars, float32."""
        y_pred, _, losses = self.model.stateless_call(trainable, non_trainable, x, training=True, return_losses=True)
        if losses:
            added = f"a loss that model {self.model.name!r}'s layers add (add_loss, an activity regularizer)"
            raise refused(added, self.where)
        if keras_private.get_keras_mask(y_pred) is not None:
            raise refused(f"a masked output (model {self.model.name!r})", self.where)
        taken = []

        def take(index, entry):
            def apart(y_true, y_out, weights):
                taken.append(self._apart(entry.loss, y_true, y_out, weights, valid))
                return jnp.zeros(())

            return apart

        with keras_private.each_output_loss(self.model, take) as compiled:
            compiled.call(y, y_pred, sample_weight)
        total, count = taken[0]
        weight = 1.0 if self.entry.loss_weights is None else self.entry.loss_weights
        return (total * weight).astype("float32"), count.astype("float32")

    @staticmethod
    def _apart(loss, y_true, y_pred, sample_weight, valid):
        """(S, D): ``loss(y_true, y_pred, sample_weight) == S / D`` over the valid rows, as Loss.__call__ and
        reduce_weighted_values reduce (the weights brought to the values' rank first, D their sum under
        mean_with_sample_weight)."""
        y_pred = keras.ops.convert_to_tensor(y_pred, dtype=loss.dtype)
        y_true = keras.ops.convert_to_tensor(y_true, dtype=loss.dtype)
        values = keras.ops.convert_to_tensor(loss.call(y_true, y_pred), dtype=loss.dtype)
        if values.ndim == 0:
            raise refused(f"loss {loss.name!r}, which reduces the batch itself", "accum_train.fit")
        weights = valid.astype(values.dtype)
        if sample_weight is not None:
            weights = (
                weights
                * keras_private.squeeze_or_expand_to_same_rank(
                    keras.ops.convert_to_tensor(sample_weight, dtype=values.dtype), weights
                )[0]
            )
        values, weights = keras_private.squeeze_or_expand_to_same_rank(values, weights)
        total = jnp.sum(values * weights)
        if loss.reduction == "mean_with_sample_weight" and sample_weight is not None:
            return total, jnp.sum(weights)
        per_example = 1
        for size in values.shape[1:]:
            per_example *= size
        return total, jnp.sum(valid) * per_example
