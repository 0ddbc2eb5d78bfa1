"""Scores: what an update or an evaluation reports besides its gradient, and the one evaluation path.

``Evaluation`` measures a model over data in inference mode with the objective the accumulator trains with
(objective.py): the same sums and normalisers, added up over every micro-batch and replica and divided once
(one all-reduce at the end), so a masked loss or a short last batch is the set's own, not a mean of batch
means. fit's validation pulls its micro-batches from the input pipeline; a run's test and validation splits
(``Scorer``) are read in batches held in memory. What else is kept besides the loss:

- ``KerasMetrics``: a Keras model's compiled metrics and loss trackers, as model.fit keeps them (exact across
  replicas at no extra collective: their replica-local state rides in the one all-reduce);
- ``Correct``: the built-in classifier's correct predictions (accuracy is counted, then divided on the host).

A micro-batch cut by trim_padding is padded back for the compiled metrics (``uncut``).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from ... import keras_private
from ...trainer.data.batching import as_data
from .gradient_cache import REPLICA_LOCAL
from .graphs import graph, in_turn
from .objective import Parts, Totals, combine, output_values, scale_of
from .update import _first


class KerasMetrics:
    """The model's metrics (model.metrics: the loss tracker, the per-output loss trackers, the compiled metrics)
    as model.fit keeps them, updated by the micro-steps and read once per update (or evaluation)."""

    def __init__(self, model: keras.Model, strategy=None):
        self.model = model
        self.sync = (strategy or tf.distribute.get_strategy()).num_replicas_in_sync > 1
        self.variables = [keras_private.storage(v) for v in model.metrics_variables]
        self.loss = keras_private.loss_tracker(model)
        self.per_output = keras_private.output_loss_trackers(model)
        self.custom = type(model).compute_metrics is not keras.Model.compute_metrics

    def update(self, x, y, y_pred, sample_weight, steps=None) -> None:
        """One micro-batch into the compiled metrics (replica context); ``steps``: its time axis' length before
        trim_padding's cut, which the metrics see it at (``uncut``)."""
        compiled = keras_private.compile_metrics(self.model)
        if not self.custom and compiled is None:
            return  # the loss trackers alone, which ``results`` updates
        if steps is not None:
            y, y_pred, sample_weight = uncut(y, y_pred, sample_weight, steps)
        if self.custom:
            self.model.compute_metrics(x, y, y_pred, sample_weight)
        else:
            compiled.update_state(y, y_pred, sample_weight)

    def local(self) -> list:
        return [v.read_value() for v in self.variables] if self.sync else []

    def reset(self) -> None:
        self.model.reset_metrics()

    def results(self, reduced: list, loss, totals: dict, loss_values) -> dict:
        """Replica context, after the all-reduce: the trackers take the update's (or evaluation's) exact loss
        as model.fit weighs a batch's (the total by its examples); the logs as model.fit's get_metrics_result."""
        for variable, total in zip(self.variables, reduced):
            variable.assign(total)
        if self.loss is not None:
            self.loss.update_state(loss, sample_weight=totals["examples"])
        for tracker, value in zip(self.per_output, loss_values):
            # model.fit weighs these by the batch's static size, unknown (None: each batch weighs 1) unless
            # every batch has the same size
            tracker.update_state(value)
        logs = self.model.get_metrics_result()
        logs = tf.nest.map_structure(tf.identity, logs)  # read before the totals move on (a metric's dict too)
        if self.sync:  # replica 0 keeps the totals: a cross-replica read (their sum) is the global value
            first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
            with tf.control_dependencies(list(logs.values())):
                for variable in self.variables:
                    variable.assign(tf.where(first, variable.read_value(), tf.zeros_like(variable.read_value())))
        return logs


class Correct:
    """The built-in classifier's correct predictions (the argmax of its logits against integer labels)."""

    def __init__(self):
        self.correct = tf.Variable(0.0, trainable=False, name="correct", **REPLICA_LOCAL)
        self.variables = [self.correct]

    def update(self, x, y, y_pred, sample_weight, steps=None) -> None:
        hits = tf.equal(tf.argmax(y_pred, axis=-1, output_type=tf.int32), tf.cast(y, tf.int32))
        self.correct.assign_add(tf.reduce_sum(tf.cast(hits, tf.float32)))

    def local(self) -> list:
        return [self.correct.read_value()]

    def reset(self) -> None:
        self.correct.assign(0.0)

    def results(self, reduced: list, loss, totals: dict, loss_values) -> dict:
        self.correct.assign(0.0)
        return {"loss": loss, "correct": reduced[0], "examples": totals["examples"]}


class Evaluation:
    """The objective's loss and the metrics over data, in inference mode: ``step`` (pulled micro-batches) or
    ``batch`` (held ones) as often as the data goes, then ``end`` (one all-reduce). ``groups``: the normalisers
    of the data (the objective's by default); ``prepare(element, n)``: a pulled element as (x, y, weights)."""

    def __init__(self, objective, metrics, groups=None, strategy=None, prepare=as_data, jit=False):
        self.objective, self.metrics, self.prepare = objective, metrics, prepare
        # XLA (compile's jit_compile): each micro-batch's forward pass and loss, as model.fit's test step
        self._parts = tf.function(self._evaluate, jit_compile=True, autograph=False) if jit else self._evaluate
        self.groups = tuple(groups if groups is not None else objective.groups)
        self.strategy = strategy or tf.distribute.get_strategy()
        with self.strategy.scope():
            self.totals = Totals(self.groups, len(objective.kinds))
        run = self.strategy.run
        self._step = graph(self._pull)
        self._batch = graph(lambda data: run(self._micro, args=(data,)), reduce_retracing=True)
        self._end = graph(lambda: run(self._end_replica))
        self._so_far = graph(lambda: run(self._end_replica, args=(False,)))

    def step(self, iterator, pulls: int) -> bool:
        """One batch's ``pulls`` micro-steps per replica from ``iterator``, whose elements are (element, real);
        False at the end of the data (the first element of the batch is not real)."""
        return bool(_first(self.strategy, self._step(iterator, tf.constant(int(pulls)))))

    def batch(self, data) -> None:
        """A batch held in memory, (x, y) or (x, y, sample_weight)."""
        self._batch(tuple(data))

    def end(self) -> dict:
        """The loss and metrics over everything seen since the last ``end`` (one all-reduce)."""
        return _first(self.strategy, self._end())

    def so_far(self) -> dict:
        """``end``'s logs as they stand, nothing cleared: what model.fit gives its test batch callbacks."""
        return _first(self.strategy, self._so_far())

    def _micro(self, element, prepare=as_data):
        x, y, sample_weight = prepare(element, None)
        flat, (predictions, masks) = self._parts(x, y, sample_weight)
        parts, predictions = Parts(*flat), keras_private.masked(predictions, masks)
        shares = {g: parts.sums[g] / scale_of(g, 1) for g in self.groups}
        self.totals.add(self.totals.plus(self.totals.zeros(), parts, shares))
        if self.metrics is not None:
            self.metrics.update(x, y, predictions, sample_weight, self.objective.steps)

    def _evaluate(self, x, y, sample_weight):
        parts, predictions = self.objective.evaluate(x, y, sample_weight, False, self.groups)
        return parts.flat(), (predictions, keras_private.masks_of(predictions))

    def _pull(self, iterator, pulls):
        element, real = next(iterator)  # a round of the stream's end says so in its flag
        self.strategy.run(self._micro, args=(element, self.prepare))
        in_turn(pulls - 1, lambda i: self.strategy.run(self._micro, args=(next(iterator)[0], self.prepare)))
        return real

    def _end_replica(self, clear=True):
        metrics = self.metrics.local() if self.metrics is not None else []
        reduced = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, {"totals": self.totals.values(), "metrics": metrics}
        )
        totals = reduced["totals"]
        _, loss = combine(totals, self.groups, 1)
        penalty = self.objective.regularization()
        if penalty is not None:
            loss = loss + penalty
        if clear:
            self.totals.clear()
        if self.metrics is None:
            return {"loss": loss, "examples": totals["examples"]}
        state = [] if clear else self.metrics.variables
        kept = [v.read_value() for v in state]  # results() moves the metrics: put back when only reading them
        logs = self.metrics.results(reduced["metrics"], loss, totals, output_values(totals, self.objective.kinds))
        if not clear:
            with tf.control_dependencies(tf.nest.flatten(logs)):
                logs = tf.nest.map_structure(tf.identity, logs)
                for variable, value in zip(state, kept):
                    variable.assign(value)
        return logs


class Scorer:
    """Scores of ``model`` trained on ``objective`` (objective.classifier, or a KerasObjective) over ``data``'s
    splits, in batches of ``batch_size()`` examples (a callable: a run's micro-batch may change as it trains)."""

    def __init__(self, model, objective, data, batch_size: Callable[[], int]):
        self.model, self.objective, self.data, self.batch_size = model, objective, data, batch_size
        self.keras = hasattr(objective, "probe")  # a Keras loss: its loss and compiled metrics, no classes
        self.metrics = KerasMetrics(model.network) if self.keras else Correct()
        self.evaluation = Evaluation(objective, self.metrics)
        self._classes = graph(lambda x: tf.argmax(model.forward(x, False), 1, output_type=tf.int32))
        self._made = {}  # (id of a split, batch size): (the split, its batches)

    def _batches(self, split):
        """``split``'s batches in order, made once per split and batch size and iterated again at every score:
        made anew, each epoch traced its pipeline again."""
        key = (id(split), self.batch_size())
        if key not in self._made:
            self._made[key] = (split, split.batches(np.arange(len(split)), key[1]))  # the split held: its id stays
        return self._made[key][1]

    def _over(self, split) -> dict:
        self.metrics.reset()
        for batch in self._batches(split):
            self.evaluation.batch(batch)
        return {name: np.asarray(value) for name, value in self.evaluation.end().items()}

    def evaluate(self, split=None) -> tuple[float, float]:
        """(mean loss, accuracy) of the built-in classifier on the test split (or ``split``)."""
        split = self.data.test if split is None else split
        logs = self._over(split)
        return float(logs["loss"]), int(logs["correct"]) / len(split)

    def task_scores(self, split) -> dict:
        """A Keras loss's run: the loss and every compiled metric over ``split``."""
        return {name: float(value) for name, value in self._over(split).items()}

    def classes(self, split=None):
        """(labels, predicted classes) of each batch of the test split (or ``split``): a confusion matrix."""
        split = self.data.test if split is None else split
        for x, y in self._batches(split):
            yield y.numpy(), self._classes(x).numpy()

    def scores(self) -> dict:
        """test_loss and test_accuracy (none without test examples), and validation_loss and
        validation_accuracy with data.validation; a Keras loss's run: test_ and validation_ of each of its scores."""
        scores = {}
        splits = (("test", self.data.test), ("validation", self.data.validation))
        for prefix, split in splits:
            if split is None or not len(split):
                continue
            if self.keras:
                scores.update({f"{prefix}_{name}": value for name, value in self.task_scores(split).items()})
            else:
                scores[f"{prefix}_loss"], scores[f"{prefix}_accuracy"] = self.evaluate(split)
        return scores


def uncut(y, y_pred, sample_weight, steps: int):
    """A cut micro-batch's targets, outputs and sample weights as the compiled metrics take them: every leaf whose
    time axis was cut (of unknown length where traced) padded back to ``steps``, the steps cut away masked. Keras'
    mean metrics average each example over its time axis, and count it by its weights' mean over that axis: two
    micro-batches of different lengths would weigh their steps differently, where model.fit's uncut batch weighs
    every step alike."""

    def cut(t):
        return t is not None and t.shape.rank is not None and t.shape.rank >= 2 and t.shape[1] is None

    def pad(t):
        return tf.pad(t, [[0, 0], [0, steps - tf.shape(t)[1]]] + [[0, 0]] * (t.shape.rank - 2))

    def output(t):
        if not cut(t):
            return t
        mask = keras_private.get_keras_mask(t)
        padded = pad(t)
        keras_private.set_keras_mask(padded, pad(tf.ones(tf.shape(t)[:2], tf.bool) if mask is None else mask))
        return padded

    def other(t):
        return pad(t) if cut(t) else t

    return (
        tf.nest.map_structure(other, y),
        tf.nest.map_structure(output, y_pred),
        tf.nest.map_structure(other, sample_weight),
    )
