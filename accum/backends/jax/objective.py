"""A compiled Keras loss as a micro-batch's sums and normalisers, on JAX's arrays: the TensorFlow backend's
keras_objective.py on jnp (read its docstring for why a batch's loss is ``S / D`` and why accumulation adds the
``S`` and the ``D`` apart).

``parts`` gives a micro-batch's ``S`` and ``D`` as two vectors, one entry per normaliser group, so that the whole
batch's loss is ``sum(S_g / D_g)`` over the groups, each ``S_g`` and ``D_g`` summed over the micro-batches first.
The groups: ``total`` holds the ``sum`` losses, whose whole-batch loss is ``S`` itself (``D`` = 0, read as 1);
``examples`` the losses whose ``D`` is a fixed count per example (a mean with no sample-weighted divisor, no mask),
each ``S`` divided by that count so that they share ``D`` = the examples; and each output whose ``D`` depends on the
data (a mean divided by its sample weights, a mask) a group of its own. A ``D`` that sums to 0 (every weight 0, no
valid token) is read as 1, as Keras' ``divide_no_nan`` reads it. Loss weights are in ``S``. Rows a micro-batch was
padded with (engine.py stacks micro-batches of unequal size) carry ``valid`` 0: they add nothing to ``S`` or ``D``.

Not covered yet, refused in one line: losses the layers add, weight regularizers, BatchNormalization's renorm.
Non-trainable variables are carried: frozen weights stay as they are, a Dropout's seed state moves on with each
micro-step's draw, BatchNormalization's moving statistics move once per update (norm.py).
``check`` refuses what it can before anything is traced, ``parts`` what only a trace shows (a layer's loss).
"""

from __future__ import annotations

import jax.numpy as jnp
import keras

from ... import keras_private
from ...errors import Refused
from .norm import Pooled

REDUCTIONS = ("sum_over_batch_size", "mean_with_sample_weight", "sum")
LATER = "is not on Keras' JAX backend yet (issue 76): train it with KERAS_BACKEND=tensorflow"


def refused(key: str, what: str, where: str) -> Refused:
    """What the JAX door does not take yet, in one line, as the refusal of ``key`` (docs/limitations.md's row)."""
    return Refused(key, f"{where}: {what} {LATER}")


class KerasObjective:
    """``model``'s compiled loss, taken apart per micro-batch: ``parts`` gives (S, D) as Keras would reduce it."""

    def __init__(self, model: keras.Model, where: str = "accum_train.fit", steps: int | None = None):
        self.model, self.where = model, where
        # trim_padding: the time axis' length before the cut (lengths.uncut_steps), which a mean over every
        # position still divides by
        self.steps = steps
        self.check()
        self.entries = keras_private.flat_losses(model)
        self.norms = Pooled(model)

    def check(self) -> None:
        model, where = self.model, self.where
        if keras_private.compile_loss(model) is None or model.optimizer is None:
            raise refused("jax-no-loss", f"model {model.name!r} uncompiled or compiled without a loss", where)
        for entry in keras_private.flat_losses(model):
            if entry.loss.reduction not in REDUCTIONS:
                raise refused(
                    "loss-reduction", f"loss {entry.loss.name!r} with reduction={entry.loss.reduction!r}", where
                )
        renorm = [layer.name for layer in keras_private.all_layers(model) if getattr(layer, "renorm", False)]
        if renorm:  # its corrections follow moving statistics that move per batch: not pooled here
            raise refused("batchnorm-renorm", f"BatchNormalization with renorm=True ({', '.join(renorm)})", where)
        if any(getattr(v, "regularizer", None) is not None for v in model.trainable_variables):
            raise refused("jax-weight-regularizer", f"a weight regularizer (model {model.name!r})", where)

    @property
    def metric_variables(self) -> list:
        """The compiled metrics' variables (none without metrics), which each micro-step updates."""
        compiled = keras_private.compile_metrics(self.model)
        return [] if compiled is None else list(compiled.variables)

    def parts(self, trainable, held, x, y, sample_weight, valid, training=True):
        """(S, D, held, extra) of one micro-batch (``valid``: 1 for its rows, 0 for padding): S and D float32
        vectors, one entry per normaliser group, in the same order for every micro-batch of the same shapes.
        ``held``: the non-trainable variables' values and the compiled metrics' (``metric_variables``), as the
        micro-step leaves them: a seed state moved on, the metrics updated with this micro-batch's valid rows;
        and BatchNormalization's sums so far (norm.Pooled), this micro-batch's added. ``extra``: its ``size`` as
        the noise scale counts it (its one normaliser's count, else its examples: trainer/noise.py), and
        ``outputs``, each loss's own unweighted S and D (a [2, losses] array) for model.fit's per-output
        logs. ``training``: False for the validation's inference-mode forward pass."""
        before, metrics, pending = held
        pending = list(pending)  # BatchNormalization's sums (norm.py), added to by the call
        with self.norms.recording(valid, pending):
            y_pred, non_trainable, losses = self.model.stateless_call(
                trainable, before, x, training=training, return_losses=True
            )
        non_trainable = self.norms.kept(before, non_trainable)  # moved once per update instead (norm.fold)
        if losses:
            added = f"a loss that model {self.model.name!r}'s layers add (add_loss, an activity regularizer)"
            raise refused("jax-added-loss", added, self.where)
        taken = [None] * len(self.entries)
        # the time axis as cut (trim_padding): x's inputs of two axes or more all have it (lengths._time_steps)
        cut = next((a.shape[1] for a in keras.tree.flatten(x) if jnp.ndim(a) >= 2), None) if self.steps else None

        def take(index, entry):
            def apart(y_true, y_out, weights):
                taken[index] = self._apart(entry.loss, y_true, y_out, weights, valid, self.steps, cut)
                return jnp.zeros(())

            return apart

        with keras_private.each_output_loss(self.model, take) as compiled:
            compiled.call(y, y_pred, sample_weight)
        groups = {}  # name: [S, D]; "total" and "examples" shared, one group per output whose D is the data's
        outputs = []  # each loss's own unweighted [S, D] (D 0 for a sum), which model.fit logs as <output>_loss

        def add(name, total, count):
            if name in groups:
                groups[name][0] = groups[name][0] + total
            else:
                groups[name] = [total, count]

        for i, (entry, (total, count, per_example)) in enumerate(zip(self.entries, taken)):
            weighted = total * (1.0 if entry.loss_weights is None else entry.loss_weights)
            if entry.loss.reduction == "sum":
                add("total", weighted, jnp.zeros(()))
                outputs.append([total, jnp.zeros(())])
            elif per_example is not None:  # D = examples * per_example: the sum over per_example, the count once
                add("examples", weighted / per_example, jnp.sum(valid))
                outputs.append([total, jnp.sum(valid) * per_example])
            else:
                add(f"output_{i}", weighted, count)
                outputs.append([total, count])
        names = sorted(groups)
        sums, counts = (jnp.stack([groups[name][j] for name in names]).astype("float32") for j in (0, 1))
        # the micro-batch's size as the noise scale counts it: the count of its one normaliser, else its examples
        size = counts[0] if len(names) == 1 and names != ["total"] else jnp.sum(valid).astype("float32")
        extra = {"size": size, "outputs": jnp.stack([jnp.stack(o) for o in outputs]).astype("float32").T}
        return (
            sums,
            counts,
            (non_trainable, self._metrics(metrics, y, y_pred, sample_weight, valid, cut), pending),
            extra,
        )

    def _metrics(self, values, y, y_pred, sample_weight, valid, cut=None):
        """The compiled metrics' ``values`` updated as model.fit updates them with this micro-batch, its padding rows
        weighted 0: every metric is given the valid rows as weights (1 on a row counts as no weight: each metric is a
        weighted sum), ``weighted_metrics`` times the sample weights. A time axis that trim_padding cut to ``cut``
        steps is padded back to ``steps``, the steps cut away weighted 0 (Keras' mean metrics average an example
        over its time axis, so every micro-batch must have model.fit's length; an unweighted metric, which counts
        the padding, is refused by trim.py's check)."""
        if not values:
            return values
        if cut is not None and cut != self.steps:
            back = lambda t: t if t is None or jnp.ndim(t) < 2 or t.shape[1] != cut else _padded(t, self.steps)  # noqa: E731
            if sample_weight is None:  # the steps cut away weighed 0, the rest 1
                sample_weight = jnp.ones(jnp.shape(keras.tree.flatten(y)[0])[:2], "float32")
            y, y_pred, sample_weight = (keras.tree.map_structure(back, part) for part in (y, y_pred, sample_weight))

        def weighed(given):
            if given is None:
                return valid
            rows = jnp.reshape(valid, valid.shape + (1,) * (jnp.ndim(given) - 1))
            return given * rows.astype(given.dtype)

        # as on model.fit's JAX trainer, whose metrics take the outputs as they leave its gradient's function: a new
        # array, without the mask the loss saw (Keras on TensorFlow keeps it)
        y_pred = keras.tree.map_structure(lambda out: out * 1, y_pred)
        variables, compiled = self.metric_variables, keras_private.compile_metrics(self.model)
        with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
            pairs = keras_private.each_compiled_metric(compiled, y, y_pred, sample_weight)
            for metric, y_true, y_out, weights in pairs:
                metric.update_state(y_true, y_out, weighed(weights))
        return [
            value if (new := scope.get_current_value(variable)) is None else new
            for variable, value in zip(variables, values)
        ]

    @staticmethod
    def _apart(loss, y_true, y_pred, sample_weight, valid, steps=None, cut=None):
        """(S, D, per_example): ``loss(y_true, y_pred, sample_weight) == S / D`` over the valid rows, as
        Loss.__call__, apply_mask and reduce_weighted_values reduce (the mask merged into the weights, which are
        brought to the values' rank first). ``per_example``: the values per example where ``D`` is the valid rows
        times it (no mask, no sample-weighted divisor), else None. ``steps``: trim_padding's length before the cut,
        ``cut`` the micro-batch's: a time axis of ``cut`` steps counts ``steps`` of them."""
        in_mask = keras_private.get_keras_mask(y_pred)
        y_pred = keras.ops.convert_to_tensor(y_pred, dtype=loss.dtype)
        y_true = keras.ops.convert_to_tensor(y_true, dtype=loss.dtype)
        values = loss.call(y_true, y_pred)
        masks = [m for m in (in_mask, keras_private.get_keras_mask(values)) if m is not None]
        values = keras.ops.convert_to_tensor(values, dtype=loss.dtype)
        if values.ndim == 0:
            raise refused("loss-reduction", f"loss {loss.name!r}, which reduces the batch itself", "accum_train.fit")
        rows = lambda like: jnp.reshape(valid, valid.shape + (1,) * (like.ndim - 1)).astype(values.dtype)  # noqa: E731
        mask = weights = None
        if masks:  # 0 or 1 per entry, the padding rows' 0 whatever the layers made of their zeros
            mask = jnp.logical_and(*masks) if len(masks) == 2 else masks[0]
            weights = mask = mask.astype(values.dtype) * rows(mask)
        if sample_weight is not None:
            given = keras.ops.convert_to_tensor(sample_weight, dtype=values.dtype)
            if mask is not None:
                mask, given = keras_private.squeeze_or_expand_to_same_rank(mask, given)
            weights = given if mask is None else given * mask
        if weights is None:
            weights = rows(values)
        else:
            values, weights = keras_private.squeeze_or_expand_to_same_rank(values, weights)
            weights = weights * rows(weights)
        total = jnp.sum(values * weights)
        if loss.reduction == "mean_with_sample_weight" and (sample_weight is not None or mask is not None):
            return total, jnp.sum(weights), None
        if mask is not None:  # Keras weighs each valid entry size(mask) / valid: D is the valid entries per element
            return total, jnp.sum(mask) * (values.size / mask.size), None
        per_example = 1
        for axis, size in enumerate(values.shape[1:], 1):  # a time axis cut by trim_padding counts uncut
            per_example *= steps if axis == 1 and steps and size == cut else size
        return total, None, per_example


def _padded(t, steps: int):
    """``t`` with zeros after its axis 1, to ``steps`` of it."""
    return jnp.pad(t, [(0, 0), (0, steps - t.shape[1])] + [(0, 0)] * (jnp.ndim(t) - 2))
