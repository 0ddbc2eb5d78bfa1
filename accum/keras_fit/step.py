"""accum_train.fit's update: k micro-batches pulled from the input pipeline, one all-reduce, one apply.

``FitUpdate.update(iterator)`` is ONE graph call per update. Inside it a
``tf.range`` loop pulls the update's ``k`` micro-steps from the (distributed)
iterator one at a time, as Keras' own ``steps_per_execution`` loop pulls its
steps, and runs each on every replica (``strategy.run``): the forward pass,
the compiled loss taken apart (objective.py), one backward pass per
normaliser into the replica-local gradient caches, the compiled metrics
updated. Only one micro-batch of activations is alive at a time, and nothing
in the loop is a collective. Then, on every replica, the engine's one
all-reduce carries the caches, the loss sums and normalisers, the BatchNorm
sums and (under several replicas) the metrics' state; each normaliser's
gradient is divided once by its global total, the weight regularizers' own
gradient is added once, and the optimizer applies the result once (or the
update is skipped when not finite, exactly as the CLI's engine does).

The metrics stay exact under several replicas at no extra collective: the
metric variables' replica-local increments ride in the same all-reduce, each
replica computes the results from the global totals, and then replica 0 keeps
the totals and the others zero, so that Keras' own cross-replica read of a
metric (a sum over replicas) still gives the global value.
"""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf

from ..gradient_cache import REPLICA_LOCAL, GradientCache
from ..models.containers import _storage
from ..update import Update, _first, _signal
from . import keras_private
from .objective import TOTAL, Objective, Parts


class Totals:
    """Replica-local sums of an update's (or an evaluation's) loss: per normaliser the sum (over its scale)
    and the normaliser's total, per compiled loss [sum, normaliser], and the examples."""

    def __init__(self, groups, outputs: int):
        self.groups = tuple(groups)
        self.sums = {g: tf.Variable(0.0, trainable=False, name=f"sum_{g}", **REPLICA_LOCAL) for g in groups}
        self.counts = {
            g: tf.Variable(0.0, trainable=False, name=f"count_{g}", **REPLICA_LOCAL) for g in groups if g != TOTAL
        }
        self.outputs = tf.Variable(tf.zeros([max(outputs, 1), 2]), trainable=False, name="outputs", **REPLICA_LOCAL)
        self.examples = tf.Variable(0.0, trainable=False, name="examples", **REPLICA_LOCAL)

    def add(self, parts: Parts, scale) -> None:
        """``scale(group)``: what each sum is divided by (the engine's nominal batch size, or 1)."""
        for g in self.groups:
            self.sums[g].assign_add(parts.sums[g] / scale(g))
        for g, count in self.counts.items():
            count.assign_add(parts.counts[g])
        if parts.outputs:
            self.outputs.assign_add(tf.stack([tf.stack(pair) for pair in parts.outputs]))
        self.examples.assign_add(parts.examples)

    def zeros(self) -> dict:
        """What ``plus`` starts from (the loop-carried form of the totals)."""
        return {
            "sums": {g: tf.constant(0.0) for g in self.groups},
            "counts": {g: tf.constant(0.0) for g in self.counts},
            "outputs": tf.zeros(self.outputs.shape),
            "examples": tf.constant(0.0),
        }

    def plus(self, carried: dict, parts: Parts, scale) -> dict:
        """``carried`` with one micro-batch's parts added (as ``add`` adds them to the variables)."""
        outputs = carried["outputs"]
        if parts.outputs:
            outputs = outputs + tf.stack([tf.stack(pair) for pair in parts.outputs])
        return {
            "sums": {g: carried["sums"][g] + parts.sums[g] / scale(g) for g in self.groups},
            "counts": {g: carried["counts"][g] + parts.counts[g] for g in self.counts},
            "outputs": outputs,
            "examples": carried["examples"] + parts.examples,
        }

    def add_values(self, carried: dict) -> None:
        """A loop's carried totals into the variables."""
        for g in self.groups:
            self.sums[g].assign_add(carried["sums"][g])
        for g, count in self.counts.items():
            count.assign_add(carried["counts"][g])
        self.outputs.assign_add(carried["outputs"])
        self.examples.assign_add(carried["examples"])

    def values(self) -> dict:
        return {
            "sums": [self.sums[g].read_value() for g in self.groups],
            "counts": [self.counts[g].read_value() for g in self.groups if g != TOTAL],
            "outputs": self.outputs.read_value(),
            "examples": self.examples.read_value(),
        }

    def clear(self) -> None:
        for variable in [*self.sums.values(), *self.counts.values(), self.examples]:
            variable.assign(0.0)
        self.outputs.assign(tf.zeros(self.outputs.shape))


class Metrics:
    """The model's metrics (model.metrics: the loss tracker, the per-output loss trackers, the compiled metrics)
    as model.fit keeps them, updated by the micro-steps and read once per update."""

    def __init__(self, model: keras.Model, strategy, kinds: list):
        self.model = model
        self.sync = strategy.num_replicas_in_sync > 1
        self.variables = [_storage(v) for v in model.metrics_variables]
        self.loss = keras_private.loss_tracker(model)
        self.per_output = keras_private.output_loss_trackers(model)
        self.kinds = kinds
        self.custom = type(model).compute_metrics is not keras.Model.compute_metrics

    def update(self, x, y, y_pred, sample_weight) -> None:
        """One micro-batch into the compiled metrics (replica context)."""
        if self.custom:
            self.model.compute_metrics(x, y, y_pred, sample_weight)
        elif keras_private.compile_metrics(self.model) is not None:
            keras_private.compile_metrics(self.model).update_state(y, y_pred, sample_weight)

    def local(self) -> list:
        return [v.read_value() for v in self.variables] if self.sync else []

    def results(self, reduced: list, loss, totals: dict, loss_values) -> dict:
        """Replica context, after the all-reduce: the trackers take the update's (or evaluation's) exact loss
        as model.fit weighs a batch's (the total by its examples); the logs as model.fit's get_metrics_result."""
        for variable, total in zip(self.variables, reduced):
            variable.assign(total)
        examples = totals["examples"]
        if self.loss is not None:
            self.loss.update_state(loss, sample_weight=examples)
        for tracker, value in zip(self.per_output, loss_values):
            # model.fit weighs these by the batch's static size, unknown (None: each batch weighs 1) unless
            # every batch has the same size
            tracker.update_state(value)
        logs = self.model.get_metrics_result()
        logs = {name: tf.identity(value) for name, value in logs.items()}  # read before the totals move on
        if self.sync:  # replica 0 keeps the totals: a cross-replica read (their sum) is the global value
            first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
            with tf.control_dependencies(list(logs.values())):
                for variable in self.variables:
                    variable.assign(tf.where(first, variable.read_value(), tf.zeros_like(variable.read_value())))
        return logs


def output_values(totals: dict, kinds: list) -> list:
    """Each compiled loss's unweighted value over the update: sum / normaliser (a sum loss: its sum)."""
    outputs = totals["outputs"]
    return [
        outputs[i, 0] if kind == "sum" else tf.math.divide_no_nan(outputs[i, 0], outputs[i, 1])
        for i, kind in enumerate(kinds)
    ]


class FitUpdate(Update):
    """The update of a compiled Keras model over ``k`` micro-steps pulled from an iterator.

    ``scale``: the nominal (global) batch size. Each micro-batch differentiates
    its sums divided by it (the magnitude of a batch mean, what a 16-bit loss
    scale expects) and the cache is multiplied by scale / normaliser once."""

    def __init__(
        self,
        model,
        objective: Objective,
        optimizer,
        norm_layers,
        *,
        k,
        scale,
        groups,
        eval_groups,
        strategy,
        parallel=1,
        **shared,
    ):
        variables = [_storage(v) for v in model.trainable_variables]
        super().__init__(variables, optimizer, norm_layers=norm_layers, strategy=strategy, **shared)
        self.model, self.objective, self.k = model, objective, int(k)
        self.groups, self.scale = groups, float(scale)
        # micro-steps in flight at once (``_carried``): only on one device, where nothing else shares the cores
        self.parallel = max(1, min(int(parallel), self.k)) if self.replicas == 1 and self.one_process else 1
        with self.strategy.scope():
            self.caches = {g: GradientCache(self.variables) for g in self.groups}
            self.totals = Totals(self.groups, len(objective.entries))
            self.eval_totals = Totals(eval_groups, len(objective.entries)) if eval_groups else None
        self.metrics = Metrics(model, self.strategy, objective.kinds)
        self.used = [False] * len(self.variables)
        self._update = tf.function(self._update_all)
        self._evaluate = tf.function(self._evaluate_all)
        self._evaluate_end = tf.function(lambda: self.strategy.run(self._evaluate_end_replica))

    # -- host side

    def update(self, iterator, stop=0):
        """One update: (record {loss, applied, examples, stop, ...}, logs), this process's first replica's."""
        return _first(self.strategy, self._update(iterator, _signal(stop)))

    def evaluate_step(self, iterator) -> bool:
        """One batch's k micro-steps of evaluation into the totals and metrics; False at the end of the data."""
        return bool(_first(self.strategy, self._evaluate(iterator)))

    def evaluate_end(self) -> dict:
        """The evaluation's loss and metrics over everything ``evaluate_step`` saw (one all-reduce)."""
        return _first(self.strategy, self._evaluate_end())

    # -- inside the graph

    def _gradients(self, data):
        """One micro-batch: its loss parts and, per normaliser, the gradients of its (scaled) sum."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape(persistent=len(self.groups) > 1) as tape:
            y_pred = self.model(x, training=True)
            parts = self.objective.parts(x, y, y_pred, sample_weight, self.groups)
            targets = {g: self._scaled(parts.sums[g] / self._scale(g)) for g in self.groups}
        gradients = {g: tape.gradient(targets[g], self.variables) for g in self.groups}
        del tape
        for grads in gradients.values():
            self.used = [u or grad is not None for u, grad in zip(self.used, grads)]
        self.metrics.update(x, y, y_pred, sample_weight)
        return parts, gradients

    def _micro(self, data):
        parts, gradients = self._gradients(data)
        for g in self.groups:
            self.caches[g].add(gradients[g])
        self.totals.add(parts, self._scale)

    def _carried(self, iterator):
        """The k micro-steps with their sums carried through the loop as tensors and written once, so that up to
        ``parallel`` of them run at once (one device only: a replica cannot pull from a distributed iterator).
        Each next micro-batch is pulled by the micro-step before it: the micro-batches keep their order, and
        every sum adds in micro-batch order."""
        pending = [layer.pending for layer in self.norm_layers]

        def body(i, element, grads, totals, stats):
            # first: the next micro-step can start once its micro-batch is here, while this one still runs
            following = tf.cond(i + 1 < self.k, iterator.get_next, lambda: element)
            with contextlib.ExitStack() as stack:
                collected = [stack.enter_context(p.collect()) for p in pending]
                parts, gradients = self._gradients(element)
            grads = {
                g: [
                    total if d is None else total + tf.convert_to_tensor(d, tf.float32)
                    for total, d in zip(grads[g], gradients[g])
                ]
                for g in self.groups
            }
            totals = self.totals.plus(totals, parts, self._scale)
            stats = list(stats)
            for j, calls in enumerate(collected):
                for sums in calls:
                    stats[j] = [total + value for total, value in zip(stats[j], sums)]
            return i + 1, following, grads, totals, stats

        start = (
            tf.constant(0),
            iterator.get_next(),
            {g: [tf.zeros(v.shape, tf.float32) for v in self.variables] for g in self.groups},
            self.totals.zeros(),
            [[tf.zeros(v.shape, v.dtype) for v in p.variables()] for p in pending],
        )
        _, _, grads, totals, stats = tf.while_loop(
            lambda i, *_: i < self.k, body, start, parallel_iterations=self.parallel
        )
        for g in self.groups:
            self.caches[g].add(grads[g])
        self.totals.add_values(totals)
        for p, sums in zip(pending, stats):
            p.add_sums(sums)

    def _scale(self, group) -> float:
        return 1.0 if group == TOTAL else self.scale

    def _update_all(self, iterator, stop):
        if self.parallel > 1:
            self._carried(iterator)
        else:
            for _ in tf.range(self.k):
                self.strategy.run(self._micro, args=(next(iterator),))
        return self.strategy.run(self._finish_replica, args=(stop,))

    def _combine(self, totals: dict, groups):
        """(factor per normaliser, the loss) from the reduced totals of ``groups``."""
        counts = iter(totals["counts"])
        factors = [
            tf.constant(1.0) if g == TOTAL else tf.math.divide_no_nan(self._scale(g), next(counts)) for g in groups
        ]
        loss = tf.add_n([f * s for f, s in zip(factors, totals["sums"])])
        return factors, loss

    def _regularization(self):
        """The weight regularizers' value and gradients (once per update, the same on every replica)."""
        with tf.GradientTape() as tape:
            value = self.objective.regularization()
        if value is None:
            return tf.constant(0.0), [None] * len(self.variables)
        return value, tape.gradient(value, self.variables)

    def _finish_replica(self, stop):
        flat = [slot for g in self.groups for slot in self.caches[g].gradients()]
        extra = {"totals": self.totals.values(), "metrics": self.metrics.local()}
        reduced = self._all_reduce(self._payload(tf.constant(0.0), flat, False, stop, extra))
        totals = reduced["extra"]["totals"]
        factors, loss = self._combine(totals, self.groups)
        size = len(self.variables)
        grads = [
            tf.add_n([factors[j] * reduced["grads"][j * size + i] for j in range(len(self.groups))])
            for i in range(size)
        ]
        grads = self._unscaled(grads)
        penalty, penalty_grads = self._regularization()
        grads = [g if p is None else g + tf.cast(p, tf.float32) for g, p in zip(grads, penalty_grads)]
        used = [u or p is not None for u, p in zip(self.used, penalty_grads)]
        loss = loss + penalty
        # an update that holds no example (a stream's end) changes nothing: dropped as a retry is
        reduced["retry"] = tf.where(totals["examples"] > 0, reduced["retry"], 1.0)
        out = self._settle(loss, grads, reduced, used)
        out["examples"] = totals["examples"]
        for cache in self.caches.values():
            cache.clear()
        self.totals.clear()
        logs = self.metrics.results(
            reduced["extra"]["metrics"], loss, totals, output_values(totals, self.objective.kinds)
        )
        return out, logs

    def _evaluate_micro(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self.model(x, training=False)
        self.eval_totals.add(self.objective.parts(x, y, y_pred, sample_weight, self.eval_totals.groups), self._scale)
        self.metrics.update(x, y, y_pred, sample_weight)

    def _evaluate_all(self, iterator):
        data, real = next(iterator)  # a round of the stream's end says so in its flag
        self.strategy.run(self._evaluate_micro, args=(data,))
        for _ in tf.range(self.k - 1):
            data, _ = next(iterator)
            self.strategy.run(self._evaluate_micro, args=(data,))
        return real

    def _evaluate_end_replica(self):
        ctx = tf.distribute.get_replica_context()
        reduced = ctx.all_reduce(
            tf.distribute.ReduceOp.SUM, {"totals": self.eval_totals.values(), "metrics": self.metrics.local()}
        )
        totals = reduced["totals"]
        _, loss = self._combine(totals, self.eval_totals.groups)
        penalty = self.objective.regularization()
        if penalty is not None:
            loss = loss + penalty
        self.eval_totals.clear()
        return self.metrics.results(reduced["metrics"], loss, totals, output_values(totals, self.objective.kinds))
