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
        self.epoch, self.history = [], {}
        for epoch, epoch_logs in self.earlier:
            self.on_epoch_end(epoch, epoch_logs)
        self.model.history = self

    def __getitem__(self, key):
        return self.history[key]

    def __iter__(self):
        return iter(self.history)

    def __len__(self):
        return len(self.history)
