"""accum_train.fit's loop: model.fit's own, one accumulator update per step.

The order of events is ``model.fit``'s (Keras 3, TensorFlow trainer): the
callbacks' ``on_train_begin``; per epoch ``reset_metrics``,
``on_epoch_begin``, ``on_train_batch_begin``/``end`` around each update with
the running logs, the validation (``on_test_*``) and ``on_epoch_end`` with the
``val_`` logs; ``model.stop_training`` checked after each update and epoch;
``finalize_variable_values``; ``on_train_end``. One update is one step: a
progress bar and every callback count updates, never micro-batches.

Besides model.fit's logs, each update's carries ``noise_scale``, the gradient
noise scale's running estimate (accum/noise.py), when the updates can measure
it (two or more micro-batches in all). With ``micro_batch_size="auto"`` an
update that runs out of memory is retried from the same data at twice the
micro-batches: nothing of it was applied, and the metrics go back to where
they were before it.
"""

from __future__ import annotations

import math
import warnings

import keras
import numpy as np
import tensorflow as tf

from ..batching import largest_share
from ..errors import Interrupted, OutOfMemory
from ..feed import distribute, empty_like, endless
from ..noise import NoiseScale
from ..text import first_line
from .inputs import Cut


def as_python(logs: dict) -> dict:
    """Logs as model.fit hands them to callbacks after a step: Python floats."""
    arrays = {name: np.asarray(value) for name, value in logs.items()}
    return {name: float(a) if a.size == 1 else a for name, a in arrays.items()}


class Loop:
    """The epochs of one accum_train.fit call. ``engine`` (engine.Accumulator) trains, ``evaluation``
    (scoring.Evaluation) validates; ``feed``/``validation`` are inputs.Feed objects; ``cut`` how a batch
    becomes elements (its k may grow: ``auto``); ``nominal`` the batch size the micro-steps divide by;
    ``checkpoints`` (or None) keeps a run directory's state (rundir.py)."""

    def __init__(self, model, engine, evaluation, feed, cut, validation, *, nominal, auto=False, noise=None):
        self.model, self.engine, self.evaluation = model, engine, evaluation
        self.feed, self.cut, self.validation = feed, cut, validation
        self.nominal, self.auto = int(nominal), auto
        self.strategy = engine.strategy
        self.noise = noise or NoiseScale()
        self.checkpoints = self.stop = None
        self.stream, self.ran_out = None, False

    @property
    def measures_noise(self) -> bool:
        """Whether the updates can measure the noise scale (two micro-batches or more in all), or may come to."""
        return self.auto or self.cut.k * self.cut.replicas >= 2

    def _open(self, epoch: int, first: int) -> None:
        """The stream of ``epoch``'s elements from its update ``first`` (``self.stream``)."""
        self.stream = distribute(self.strategy, self.feed.dataset(epoch, first, self.cut, again=self.ran_out))

    def run(self, *, epochs, initial_epoch, callbacks, verbose, validation_freq, validation_steps, start=(0, 0)):
        """Train from epoch ``start[0]``, update ``start[1]`` of it (a History among ``callbacks`` records it)."""
        model = self.model
        callbacks = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=self.feed.updates(initial_epoch),
            model=model,
        )
        model.stop_training = False
        callbacks.on_train_begin()
        logs, training_logs = {}, None
        first_epoch, first_update = start
        for epoch in range(max(initial_epoch, first_epoch), epochs):
            resumed_mid_epoch = epoch == first_epoch and first_update > 0
            if not resumed_mid_epoch:
                model.reset_metrics()  # a resumed epoch keeps the metrics its checkpoint restored
            callbacks.on_epoch_begin(epoch)
            step = first_update if resumed_mid_epoch else 0
            if not (self.feed.continues and self.stream is not None):
                self._open(epoch, step)  # with steps_per_epoch, a dataset's stream goes on from epoch to epoch
            updates = self.feed.updates(epoch)
            while updates is None or step < updates:
                callbacks.on_train_batch_begin(step)
                out = self._update(epoch, step)
                if float(out["examples"]) == 0:  # the data ended
                    self.stream, self.ran_out = None, True
                    if updates is not None:
                        warnings.warn(
                            "Your input ran out of data; interrupting training. Make sure that your dataset can "
                            "generate at least `steps_per_epoch * epochs` batches (ds.repeat()).",
                            stacklevel=2,
                        )
                    break
                step += 1
                logs = as_python(out["logs"])
                noise = self.noise.add(out)
                if self.measures_noise:
                    logs["noise_scale"] = math.nan if noise is None else noise
                callbacks.on_train_batch_end(step - 1, logs)
                signalled = int(out["stop"])
                if not signalled and self.stop is not None and self.engine.one_process:
                    signalled = self.stop.signum  # no one to agree with: stop after the update in hand
                if self.checkpoints is not None:
                    self.checkpoints.after_update(epoch, step, out, logs, signalled)
                if signalled:  # only with a run directory: it has just checkpointed this update
                    raise Interrupted(signalled, self.checkpoints.run_dir, int(self.checkpoints.step.numpy()))
                if model.stop_training:
                    break
            epoch_logs = dict(logs)
            if self.validation is not None and _due(epoch, validation_freq):
                val_logs = self.evaluate(callbacks, validation_steps)
                epoch_logs.update({f"val_{name}": value for name, value in val_logs.items()})
            callbacks.on_epoch_end(epoch, epoch_logs)
            training_logs = epoch_logs
            if hasattr(self.feed, "end_of_epoch"):
                self.feed.end_of_epoch()
            if self.checkpoints is not None:
                self.checkpoints.after_epoch(epoch, epoch_logs)
            if model.stop_training:
                break
        if isinstance(model.optimizer, keras.optimizers.Optimizer) and epochs > 0:
            model.optimizer.finalize_variable_values(model.trainable_weights)
        callbacks.on_train_end(logs=training_logs)

    def _update(self, epoch: int, step: int) -> dict:
        """Update ``step`` of ``epoch``: the accumulator's record. With ``auto``, running out of memory retries
        the same batch at twice the micro-batches (the caches cleared, the metrics as they were before it)."""
        stop = self.stop.signum if self.stop else 0
        while True:
            if self.stream is None:
                self._open(epoch, step)
            saved = [v.numpy() for v in self.engine.metrics.variables] if self.auto else None
            try:
                return self.engine.update_from(self.stream, self.nominal, self.cut.k, stop)
            except tf.errors.ResourceExhaustedError as err:
                largest = largest_share(self.nominal, self.cut.replicas)
                if not self.auto:
                    raise OutOfMemory(
                        f"accum_train.fit: update {step + 1} ran out of memory with micro-batches of up to "
                        f"{math.ceil(largest / self.cut.k)} examples ({first_line(err)}): pass a smaller "
                        f"micro_batch_size, or micro_batch_size='auto'"
                    ) from None
                if self.cut.k >= largest:
                    raise OutOfMemory(
                        f"accum_train.fit: update {step + 1} ran out of memory with one example per micro-batch "
                        f"({first_line(err)}): use a smaller model"
                    ) from None
                self.engine.reset()
                for variable, value in zip(self.engine.metrics.variables, saved):
                    variable.assign(value)
                self.cut = Cut(min(2 * self.cut.k, largest), self.cut.replicas, self.cut.local)
                self.stream = None  # the elements of this update are pulled anew, cut for the new k
                self.engine.set_subdivisions(self.cut.k)

    def evaluate(self, callbacks, validation_steps) -> dict:
        """The validation data's loss and metrics, exact over all of it (one all-reduce at the end)."""
        self.model.reset_metrics()
        callbacks.on_test_begin()
        dataset = self.validation.dataset(0, 0, self.cut, pad=False)
        flagged = dataset.map(lambda *element: (element if len(element) > 1 else element[0], True))
        iterator = distribute(self.strategy, endless(flagged, (empty_like(dataset.element_spec), False)))
        step = 0
        while validation_steps is None or step < validation_steps:
            callbacks.on_test_batch_begin(step)
            if not self.evaluation.step(iterator, self.cut.k):
                break
            callbacks.on_test_batch_end(step, {})
            step += 1
        logs = as_python(self.evaluation.end())
        callbacks.on_test_end(logs)
        return logs


def _due(epoch: int, validation_freq) -> bool:
    """model.fit's rule: every ``validation_freq`` epochs, or the 1-based epochs it lists."""
    if isinstance(validation_freq, int):
        return (epoch + 1) % validation_freq == 0
    return epoch + 1 in validation_freq
