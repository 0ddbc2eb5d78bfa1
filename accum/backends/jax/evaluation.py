"""model.fit's logs on JAX: each update's (``KerasMetrics``, the loss trackers and compiled metrics Keras keeps) and
the validation's (``Evaluation``), the TensorFlow backend's scoring.py on jnp.

An update's ``loss`` goes into Keras' own loss tracker weighted by the batch's examples, as Keras' JAX trainer
weights it, and each output's loss into its ``<output>_loss`` tracker; the compiled metrics were moved inside the
update's jitted call (objective.py). The validation's loss and per-output losses are exact over all of its data:
each micro-batch's sums and normalisers (objective.py's ``parts`` in inference mode) are added up, and divided
once at the end, as the TensorFlow backend's Evaluation divides them after its one all-reduce."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ... import keras_private
from .engine import stacked


class KerasMetrics:
    """``model``'s loss tracker, per-output loss trackers and compiled metrics, as model.fit's logs report them.
    ``variables``: their state, which a retried update puts back as it was."""

    def __init__(self, model):
        self.loss = keras_private.loss_tracker(model)
        self.outputs = keras_private.output_loss_trackers(model)
        self.compiled = keras_private.compile_metrics(model)
        trackers = [self.loss, *self.outputs, *([self.compiled] if self.compiled is not None else [])]
        self.variables = [v for tracker in trackers for v in tracker.variables]
        self._track = jax.jit(_tracked)

    def logged(self, out: dict) -> dict:
        """The logs after update ``out`` (the engine's record): its loss and each output's added, by its examples."""
        trackers = [self.loss, *self.outputs]
        states = [(t.total.value, t.count.value) for t in trackers]
        states, results = self._track(states, out["loss"], out["output_losses"], out["examples"])
        for tracker, state in zip(trackers, states):
            keras_private.write([tracker.total, tracker.count], state)
        return self.results(dict(zip(["loss", *(t.name for t in self.outputs)], results)))

    def results(self, losses: dict) -> dict:
        """``losses``, then each compiled metric's result (model.fit's order)."""
        return {**losses, **(self.compiled.result() if self.compiled is not None else {})}


def _tracked(states: list, loss, output_losses, n):
    """Each loss tracker (a keras.metrics.Mean: total, count) moved by its loss (``loss``, then each output's)
    weighted by the update's ``n`` examples, as its ``update_state(loss, sample_weight=n)`` moves it, and its result:
    in one jitted call, not a dozen eager ones an update (about 2 ms of host time an update on the README's
    convnet)."""
    losses = [loss, *(output_losses[i] for i in range(len(states) - 1))]
    moved = [(total + value * n, count + n) for (total, count), value in zip(states, losses)]
    return moved, [jnp.where(count == 0, 0.0, total / count) for total, count in moved]


class Evaluation:
    """The objective's loss and the metrics over data, in inference mode: ``step`` as often as the data goes, then
    ``end``; ``so_far`` in between (what model.fit gives its test batch callbacks)."""

    def __init__(self, objective, metrics: KerasMetrics, replicas: int = 1):
        self.objective, self.metrics, self.model = objective, metrics, objective.model
        self.replicas = replicas  # the elements a micro-step pulls: one per replica (evaluated here on one device)
        self.names = [tracker.name for tracker in metrics.outputs]
        self._parts = jax.jit(self._parts_fn)
        self.totals = None

    def _parts_fn(self, trainable, held, batch):
        sums, counts, held, extra = self.objective.parts(trainable, held, *batch, training=False)
        return jnp.stack([sums, counts]), extra["outputs"], held[1]

    def step(self, iterator, pulls: int) -> bool:
        """One batch's ``pulls`` micro-batches per replica from ``iterator``, whose elements are (element, real);
        False at the end of the data (the first element of the batch is not real)."""
        element, real = next(iterator)
        if not real:
            return False
        taken = [element] + [next(iterator)[0] for _ in range(pulls * self.replicas - 1)]
        for part in taken:
            if part is not None:
                self._micro(part)
        return True

    def _micro(self, element) -> None:
        model, variables = self.model, self.objective.metric_variables
        batch = jax.tree.map(lambda a: a[0], stacked([element]))  # one micro-batch, its rows all valid
        held = ([v.value for v in model.non_trainable_variables], [v.value for v in variables])
        held += (self.objective.norms.zeros(),)
        groups, outputs, moved = self._parts([v.value for v in model.trainable_variables], held, batch)
        keras_private.write(variables, moved)
        self.totals = (groups, outputs) if self.totals is None else (self.totals[0] + groups, self.totals[1] + outputs)

    def so_far(self) -> dict:
        """The loss, each output's and the metrics over everything seen since the last ``end``."""
        if self.totals is None:
            return self.metrics.results({"loss": 0.0, **dict.fromkeys(self.names, 0.0)})
        (sums, counts), (output_sums, output_counts) = self.totals
        losses = {"loss": jnp.sum(sums / jnp.where(counts == 0, 1.0, counts))}
        per_output = output_sums / jnp.where(output_counts == 0, 1.0, output_counts)
        losses.update(zip(self.names, per_output[: len(self.names)]))
        return self.metrics.results(losses)

    def end(self) -> dict:
        """``so_far``'s logs, the sums cleared for the next pass."""
        logs = self.so_far()
        self.totals = None
        return logs
