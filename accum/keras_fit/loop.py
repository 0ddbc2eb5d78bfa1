"""accum_train.fit's loop: model.fit's own, one engine update per step.

The order of events is ``model.fit``'s (Keras 3, TensorFlow trainer): the
callbacks' ``on_train_begin``; per epoch ``reset_metrics``,
``on_epoch_begin``, ``on_train_batch_begin``/``end`` around each update with
the running logs, the validation (``on_test_*``) and ``on_epoch_end`` with the
``val_`` logs; ``model.stop_training`` checked after each update and epoch;
``finalize_variable_values``; ``on_train_end``. One update is one step: a
progress bar and every callback count updates, never micro-batches.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import tensorflow as tf

from ..errors import Interrupted
from ..feed import empty_like, endless


def as_python(logs: dict) -> dict:
    """Logs as model.fit hands them to callbacks after a step: Python floats."""
    arrays = {name: np.asarray(value) for name, value in logs.items()}
    return {name: float(a) if a.size == 1 else a for name, a in arrays.items()}


def distribute(strategy, dataset: tf.data.Dataset, one_process_one_replica: bool):
    """An iterator over this process's elements: each pull gives every local replica its next element."""
    if one_process_one_replica:
        return iter(dataset)
    return iter(strategy.distribute_datasets_from_function(lambda context: dataset))


class Loop:
    """The epochs of one accum_train.fit call. ``train`` feeds the engine; ``feed``/``validation`` are
    inputs.Feed objects; ``cut`` and ``eval_cut`` how their batches are cut; ``checkpoints`` (or None)
    keeps a run directory's state (rundir.py)."""

    def __init__(self, model, engine, feed, cut, validation, eval_cut, *, strategy, checkpoints=None, stop=None):
        self.model, self.engine, self.feed, self.cut = model, engine, feed, cut
        self.validation, self.eval_cut = validation, eval_cut
        self.strategy = strategy
        self.simple = strategy.num_replicas_in_sync == 1 and len(cut.local) == 1
        self.checkpoints, self.stop = checkpoints, stop
        self.stream, self.ran_out = None, False

    def _iterator(self, epoch: int, first: int):
        if self.feed.continues and self.stream is not None:
            return self.stream  # with steps_per_epoch, a dataset's stream goes on from epoch to epoch
        dataset = self.feed.dataset(epoch, first, self.cut, again=self.ran_out)
        self.stream = distribute(self.strategy, dataset, self.simple)
        return self.stream

    def run(self, *, epochs, initial_epoch, callbacks, verbose, validation_freq, validation_steps, start=(0, 0)):
        """Train from epoch ``start[0]``, update ``start[1]`` of it (a History among ``callbacks`` records it)."""
        model = self.model
        steps = self.feed.updates(initial_epoch)
        callbacks = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=steps,
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
            iterator = self._iterator(epoch, step)
            updates = self.feed.updates(epoch)
            while updates is None or step < updates:
                callbacks.on_train_batch_begin(step)
                out, step_logs = self.engine.update(iterator, self.stop.signum if self.stop else 0)
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
                logs = as_python(step_logs)
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

    def evaluate(self, callbacks, validation_steps) -> dict:
        """The validation data's loss and metrics, exact over all of it (one all-reduce at the end)."""
        self.model.reset_metrics()
        callbacks.on_test_begin()
        dataset = self.validation.dataset(0, 0, self.eval_cut, pad=False)
        flagged = dataset.map(lambda *element: (element if len(element) > 1 else element[0], True))
        spec = dataset.element_spec
        iterator = distribute(self.strategy, endless(flagged, (empty_like(spec), False)), self.simple)
        step = 0
        while validation_steps is None or step < validation_steps:
            callbacks.on_test_batch_begin(step)
            if not self.engine.evaluate_step(iterator):
                break
            callbacks.on_test_batch_end(step, {})
            step += 1
        logs = as_python(self.engine.evaluate_end())
        callbacks.on_test_end(logs)
        return logs


def _due(epoch: int, validation_freq) -> bool:
    """model.fit's rule: every ``validation_freq`` epochs, or the 1-based epochs it lists."""
    if isinstance(validation_freq, int):
        return (epoch + 1) % validation_freq == 0
    return epoch + 1 in validation_freq
