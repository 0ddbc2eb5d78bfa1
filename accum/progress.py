"""The callbacks a training loop makes as it goes (``accum_train.Progress``): subclass it to watch a run
from Python; the CLI's progress bar is one. No TensorFlow here: importing accum_train stays light."""

from __future__ import annotations


class Progress:
    """Callbacks from the training loop of ``accum_train.run``; each default does nothing.

    Subclass it and override what you need; the loop calls them from the process that trains (the chief
    worker, under several)."""

    def epoch_start(self, epoch: int, epochs: int, micro_batches: int, done: int) -> None:
        """Epoch ``epoch`` (from 1) of ``epochs`` starts: it has ``micro_batches`` micro-batches in all, of
        which ``done`` already ran (more than 0 when a resumed run starts mid-epoch)."""

    def updates(self, micro_done: int, loss: float, examples_per_s: float) -> None:
        """Updates were applied and logged: ``micro_done`` micro-batches of the epoch have run, ``loss`` is the
        mean training loss of the updates just logged and ``examples_per_s`` the epoch's rate so far."""

    def epoch_end(self, record: dict) -> None:
        """The epoch ended; ``record`` is its line of metrics.jsonl: ``epoch``, ``step`` (updates done),
        ``train_loss``, the scores (``test_loss`` and ``test_accuracy``, ``validation_`` ones with
        ``data.validation``; a Keras loss's run: each of its compiled metrics), ``noise_scale``,
        ``elapsed_s`` and ``examples_per_s``."""

    def message(self, text: str) -> None:
        """One line for the user (the split, a resume, a warning)."""
