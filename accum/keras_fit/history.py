"""What accum_train.fit returns: model.fit's History, which also reads as the dict of its per-epoch logs."""

from __future__ import annotations

from collections.abc import Mapping

import keras


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
