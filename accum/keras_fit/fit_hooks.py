"""accum_train.fit's loop: model.fit's own, one accumulator update per step.

The order of events is ``model.fit``'s (Keras 3, TensorFlow trainer): the
callbacks' ``on_train_begin``; per epoch ``reset_metrics``,
``on_epoch_begin``, ``on_train_batch_begin``/``end`` around each update with
the running logs, the validation (``on_test_*``) and ``on_epoch_end`` with the
``val_`` logs; ``model.stop_training`` checked after each update and epoch;
``finalize_variable_values``; ``on_train_end``. One update is one step: a
progress bar and every callback count updates, never micro-batches.

Besides model.fit's logs, each update's carries ``noise_scale``, the gradient
noise scale's running estimate (accum/trainer/noise.py), when the updates can measure
it (two or more micro-batches in all). Updates go through the run's memory
guard (accum/trainer/memory.py): with ``micro_batch_size="auto"`` an update that runs
out of memory (on any worker) is retried from the same data at twice the
micro-batches, nothing of it applied and the metrics put back as they were.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from types import SimpleNamespace

import keras
import numpy as np

from .. import keras_private
from ..backends import active
from ..trainer.data.batching import Cut, same_size
from ..trainer.data.reader import Planned, Reader
from ..trainer.noise import rule_change
from ..trainer.trainer import Trainer


def as_python(logs: dict) -> dict:
    """Logs as model.fit hands them to callbacks after a step (Keras' own conversion): Python floats where a value
    converts to one (F1Score's per-class array stays one), a metric's dict of results flattened into its keys."""
    return keras_private.pythonify_logs(keras.tree.map_structure(np.asarray, logs))


class FitHooks:
    """accum_train.fit's side of the loop (loop.Loop). ``engine`` (engine.Accumulator) trains, ``evaluation``
    (scoring.Evaluation) validates; ``feed``/``validation`` are inputs.Feed objects; ``cut`` how a batch
    becomes elements (its k may grow: ``auto``); ``nominal`` the batch size the micro-steps divide by;
    ``checkpoints`` (or None) keeps a run directory's state (rundir.py); ``trainer`` (trainer.Trainer, made by
    ``call``) runs the loop."""

    def __init__(self, model, engine, evaluation, feed, cut, validation, nominal, *, auto=False, verbose=1):
        self.model, self.engine, self.evaluation = model, engine, evaluation
        self.feed, self.cut, self.validation = feed, cut, validation
        self.nominal, self.auto = int(nominal), auto
        self.strategy = engine.strategy
        self.trainer = None
        self.k_for = None  # with batch_schedule: the micro-batches per share of each batch size in force
        # batch_schedule's noise-scale rule (config.BatchRule) and its changes so far, checkpointed as JSON
        # [[1-based epoch, batch size], ...] (the CLI's form)
        self.rule, self.micro_batch_size = None, None
        self.say = print if verbose else (lambda line: None)  # the lines a call says beside its progress bar
        self.rule_changes = active().state_variable("[]", "string", "rule_changes")
        # trim_padding's micro-batches are sequences of like length, not the random draws the estimate assumes
        self.noise = active().NoiseScale(measured=not getattr(feed, "trim", 0))
        self.checkpoints = None
        self.ran_out_before = False
        # the updates as the loop and the guard read them (feed.Reader, the CLI's too): the epoch's stream, cut for
        # the accumulator's k; a retry (auto) opens it again from the update, the metrics put back as they were
        self.reader = Reader(
            engine,
            self._open,
            k=lambda: engine.k if self.auto else self.cut.k,
            keep=engine.metrics.variables if auto else (),
        )
        self.epoch = 0

    @property
    def measures_noise(self) -> bool:
        """Whether the updates can measure the noise scale (two micro-batches or more in all), or may come to; not
        with trim_padding, whose micro-batches are sequences of like length, not the random draws it assumes."""
        if not self.noise.measured:
            return False
        return self.auto or self.cut.k * self.cut.replicas >= 2

    def _open(self, first: int, k: int):
        """The current epoch's elements from its update ``first`` on, cut for ``k`` (feed.Reader's ``open``)."""
        if k != self.cut.k:  # the guard doubled it: the elements are cut for the new k from here on
            self.cut = Cut(k, self.cut.replicas, self.cut.local)
        dataset = self.feed.dataset(self.epoch, first, self.cut, again=self.ran_out_before)
        return SimpleNamespace(iterator=active().elements(self.strategy, dataset), planned=self._planned)

    def _planned(self, step: int) -> Planned:
        """Update ``step`` of the epoch: a batch of arrays in ``Cut.pulls`` micro-steps, a stream's in k."""
        pulls, size = self.cut.k, None
        if self.feed.sizes:
            n = self.feed.batch_length(self.epoch, step)
            pulls = self.cut.pulls(n)
            size = same_size(n, pulls, self.cut.replicas)
        return Planned(step, self.nominal, self.nominal, pulls, self.cut.k, size)

    def call(self, spec, directory, *, epochs, initial_epoch, callbacks, verbose, validation_freq, validation_steps):
        """One call of accum_train.fit through the Trainer (trainer/trainer.py), on either backend: ``spec`` the
        trainer's (trainer.TrainSpec), ``directory`` its run directory (rundir.py; None: none); model.fit's History,
        from the first update of the run where ``directory`` resumes one."""
        model, engine = self.model, self.engine
        self.trainer = Trainer(spec, engine, model, self.noise, self.nominal, self.say)
        self.checkpoints, self.validation_freq, self.validation_steps = directory, validation_freq, validation_steps
        self.epochs, self.logs, self.training_logs = epochs, {}, None
        history = FitHistory()

        def drive(stop):
            """From epoch ``start[0]``, update ``start[1]`` of it: model.fit's course around the Trainer's loop."""
            start = (0, 0)
            if directory is not None:
                if self.rule:  # the batches the rule had grown to, from its checkpointed changes
                    changes = json.loads(self.rule_changes.numpy().decode())
                    self.feed.schedule = self.feed.schedule[:1] + tuple((epoch - 1, size) for epoch, size in changes)
                history.earlier, start = directory.earlier_epochs(), directory.start
            if self.auto:  # the k the probe chose, or a resume had come to
                self.cut = Cut(engine.k, self.cut.replicas, self.cut.local)
            self.callbacks = keras.callbacks.CallbackList(
                [*(callbacks or []), history],  # last, as model.fit's: it sees what others add
                add_history=True,
                add_progbar=verbose != 0,
                verbose=verbose,
                epochs=epochs,
                steps=self.feed.updates(initial_epoch),
                model=model,
            )
            model.stop_training = False
            self.callbacks.on_train_begin()
            begin = max(keras_private.initial_epoch(model, initial_epoch), start[0])
            self.trainer.train(self, begin, start[1] if begin == start[0] else 0, epochs, stop)
            if isinstance(model.optimizer, keras.optimizers.Optimizer) and epochs > 0:
                model.optimizer.finalize_variable_values(model.trainable_weights)
            self.callbacks.on_train_end(logs=self.training_logs)

        # memory.choose_subdivisions' take(m): the first batch's first m examples, as (x, y) (no sample weights: the
        # probe measures a micro-step's memory, not its loss)
        first = keras.utils.unpack_x_y_sample_weight(self.feed.first_batch())[:2]
        try:
            self.trainer.run(directory, drive, lambda m: keras.tree.map_structure(lambda t: t[:m], first))
        finally:  # the last epoch's pipeline let go as the call ends, not at Python's next full collection: the
            # reader and these hooks hold each other (its ``open`` is theirs), a cycle only that collection frees
            self.reader.close()
        return history

    @property
    def stopping(self) -> bool:
        return bool(self.model.stop_training)

    def epoch_begin(self, epoch: int, resumed_at: int | None):
        if self.ran_out_before and self.feed.once:  # a generator: read once, and it has ended
            _ran_out()
            return None
        step = resumed_at or 0
        if not step:
            self.model.reset_metrics()  # a resumed epoch keeps the metrics its checkpoint restored
        if self.k_for is not None:
            self._follow_batch(self.feed.batch_size_of(epoch), self.feed.updates(epoch))
        self.callbacks.on_epoch_begin(epoch)
        self.epoch = epoch
        if self.feed.continues and self.reader.opened is not None:
            self.reader.go_on(step)  # with steps_per_epoch, a dataset's stream goes on from epoch to epoch
        else:
            self.reader.close()
        return self.reader, step, self.feed.updates(epoch)

    def _follow_batch(self, size: int, updates: int) -> None:
        """batch_schedule's batch ``size`` in force from this epoch (of ``updates`` updates): its k, its cut, the
        most micro-batches the guard may reach, and the progress bar's count."""
        k = self.k_for(size)
        if k != self.engine.k:
            self.engine.set_subdivisions(k)  # an input of the update's graph: no new trace
        self.nominal, self.cut = size, Cut(k, self.cut.replicas, self.cut.local)
        self.trainer.follow_batch(size)
        self.callbacks.set_params({**self.callbacks.params, "steps": updates})

    def _follow_noise(self, epoch: int) -> None:
        """The rule at the end of ``epoch`` (0-based): the batch of the epochs after it, from the noise scale
        measured so far, before the epoch's checkpoint keeps the change (the CLI's run_parts.Run.follow_noise)."""
        if self.rule is None:  # a stream's feed has no batch size to read
            return
        done, before = epoch + 1, self.feed.batch_size_of(epoch + 1)
        change = rule_change(self.rule, self.noise.value(), done, self.epochs, before, self.micro_batch_size)
        if change is None:
            return
        after, said = change
        if after != before:
            self.feed.schedule += ((done, after),)
            self.rule_changes.assign(json.dumps([[e + 1, size] for e, size in self.feed.schedule[1:]]))
        self.say(said)

    def update_begin(self, reader, step: int) -> None:
        self.callbacks.on_train_batch_begin(step)

    def update_end(self, epoch: int, step: int, out: dict, noise) -> None:
        self.logs = logs = as_python(out["logs"])
        if self.measures_noise:
            logs["noise_scale"] = math.nan if noise is None else noise
        self.callbacks.on_train_batch_end(step - 1, logs)

    def after_update(self, epoch: int, step: int, out: dict, final: bool) -> None:
        if self.checkpoints is not None:
            self.checkpoints.after_update(epoch, step, out, self.logs, final, self.nominal)

    def ran_out(self, end) -> None:
        self.ran_out_before = True
        self.reader.close()
        if end is not None:
            _ran_out()

    def failed(self, reader, step: int, err) -> None:
        pass  # model.fit's own error: the user's data or model

    def epoch_end(self, epoch: int, step: int) -> None:
        epoch_logs = dict(self.logs)
        # the noise scale is an update's estimate, with no validation twin: kept out of the epoch's logs, where
        # Keras' CSVLogger would add an empty val_noise_scale column; History (FitHistory) and metrics.jsonl keep it
        noise = {"noise_scale": epoch_logs.pop("noise_scale")} if "noise_scale" in epoch_logs else {}
        freq = self.validation_freq  # model.fit's rule: every that many epochs, or the 1-based epochs it lists
        if self.validation is not None and ((epoch + 1) % freq == 0 if isinstance(freq, int) else epoch + 1 in freq):
            val_logs = self.evaluate(self.callbacks, self.validation_steps)
            epoch_logs.update({f"val_{name}": value for name, value in val_logs.items()})
        self.callbacks.on_epoch_end(epoch, epoch_logs)
        self.training_logs = epoch_logs
        if hasattr(self.feed, "end_of_epoch"):
            self.feed.end_of_epoch()
        self._follow_noise(epoch)
        if self.checkpoints is not None:
            self.checkpoints.after_epoch(epoch, {**epoch_logs, **noise})

    def evaluate(self, callbacks, validation_steps) -> dict:
        """The validation data's loss and metrics, exact over all of it (one all-reduce at the end)."""
        self.model.reset_metrics()
        callbacks.on_test_begin()
        dataset = self.validation.dataset(0, 0, self.cut, pad=False)
        iterator = active().elements(self.strategy, dataset, flagged=True)
        step = 0  # where the count is known, no batch is begun past the last one
        limit = min((n for n in (self.validation.updates(0), validation_steps) if n is not None), default=None)
        while limit is None or step < limit:
            callbacks.on_test_batch_begin(step)
            if not self.evaluation.step(iterator, self.cut.k):
                break
            callbacks.on_test_batch_end(step, as_python(self.evaluation.so_far()))  # model.fit's running logs
            step += 1
        logs = as_python(self.evaluation.end())
        callbacks.on_test_end(logs)
        return logs


class FitHistory(keras.callbacks.History, Mapping):
    """keras.callbacks.History (``.history``, ``.epoch``, ``.model``, ``.params``), and a read-only mapping of
    its ``history`` dict: ``history["loss"]`` as accum_train.fit returned before it returned a History.

    ``earlier``: (epoch, logs) of the epochs a run directory already holds, so that a resumed call returns
    the history of the whole run."""

    earlier = ()

    def on_train_begin(self, logs=None):
        self.epoch, self.history, self.noise = [], {}, {}
        for epoch, epoch_logs in self.earlier:
            super().on_epoch_end(epoch, epoch_logs)
        self.model.history = self

    def on_train_batch_end(self, batch, logs=None):
        # the last update's noise scale, which the epoch's logs leave out (fit_hooks.FitHooks.epoch_end)
        self.noise = {"noise_scale": logs["noise_scale"]} if logs and "noise_scale" in logs else {}

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, {**(logs or {}), **self.noise})

    def __getitem__(self, key):
        return self.history[key]

    def __iter__(self):
        return iter(self.history)

    def __len__(self):
        return len(self.history)


def _ran_out() -> None:
    warnings.warn(  # model.fit's words
        "Your input ran out of data; interrupting training. Make sure that your dataset or generator can "
        "generate at least `steps_per_epoch * epochs` batches.",
        stacklevel=5,  # the line of ``call`` that runs the loop
    )
