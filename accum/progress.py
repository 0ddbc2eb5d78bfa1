"""The callbacks a training loop makes as it goes (``accum_train.Progress``): subclass it to watch a run
from Python; the CLI's progress bar is one. No TensorFlow here: importing accum_train stays light."""

from __future__ import annotations


class Progress:
    """Callbacks from the loop. The default does nothing."""

    def epoch_start(self, epoch: int, epochs: int, micro_batches: int, done: int) -> None: ...

    def updates(self, micro_done: int, loss: float, examples_per_s: float) -> None: ...

    def epoch_end(self, record: dict) -> None: ...

    def message(self, text: str) -> None: ...
