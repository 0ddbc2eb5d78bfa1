"""Which examples each update takes: batch_size, batch_schedule and the epochs laid out as updates.

Every epoch reads its permutation of the training set (``order.epoch_order``)
front to back; an update takes the next ``batch`` examples of it, the batch in
force at that update, and the last update of an epoch takes what is left (a
short batch). With ``batch_schedule`` keyed by epoch the batch changes where
an epoch starts; keyed by step it changes after that many updates, wherever
the epoch is, and the new batch takes the examples that follow. The layout is
computed once from the config and the training set's size, so a resumed run
finds the same update at the same examples, and plan, metrics.jsonl and the
learning-rate schedule count the same updates.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """Updates of one epoch at one batch size: examples ``[start, end)`` of the epoch's order, from update
    ``first_step`` (0-based) on, ``batch_size`` each (the last one shorter if the epoch ends first)."""

    epoch: int
    first_step: int
    start: int
    end: int
    batch_size: int

    @property
    def updates(self) -> int:
        return math.ceil((self.end - self.start) / self.batch_size)


@dataclass(frozen=True)
class Phase:
    """Where a batch size comes into force: at update ``step`` (0-based), in ``epoch`` (0-based)."""

    step: int
    epoch: int
    batch_size: int


class Timeline:
    """The run's updates, epoch by epoch, as segments of one batch size."""

    def __init__(self, n_train: int, epochs: int, batch_size: int, changes=()):
        """``n_train`` examples per epoch, ``epochs`` of them, ``batch_size`` until the first of ``changes``:
        batch_schedule's entries (config.BatchChange, keyed by 1-based epoch or by updates done, in order, checked
        against the training set by ``Config.for_data``); under the schedule's rule, the changes it has made so far,
        by epoch (the epochs after the last one are laid out at the batch in force: what ``total_steps`` counts,
        the most updates the run can still take)."""
        self.n_train, self.epochs = n_train, epochs
        schedule = tuple(changes)
        by_step = bool(schedule) and schedule[0].step is not None
        # (where, batch): epoch-keyed changes as 0-based epochs, step-keyed ones as updates done
        changes = [(c.step if by_step else c.epoch - 1, c.batch_size) for c in schedule]
        self.segments: list[Segment] = []
        step, batch = 0, batch_size
        pending = list(changes)
        for epoch in range(epochs):
            while pending and not by_step and pending[0][0] <= epoch:
                batch = pending.pop(0)[1]
            start = 0
            while start < n_train:
                while pending and by_step and pending[0][0] <= step:
                    batch = pending.pop(0)[1]
                updates = math.ceil((n_train - start) / batch)
                if pending and by_step:
                    updates = min(updates, pending[0][0] - step)
                end = min(n_train, start + updates * batch)
                self.segments.append(Segment(epoch, step, start, end, batch))
                step, start = step + updates, end
        self.total_steps = step
        self._firsts = [s.first_step for s in self.segments]
        # an empty training set (a run rebuilt to evaluate or export) has no updates: every epoch starts at 0
        self._epoch_first = [next((s.first_step for s in self.segments if s.epoch == e), step) for e in range(epochs)]
        # where the batch size differs from the update before (the first segment included)
        new_sizes = [
            s for i, s in enumerate(self.segments) if i == 0 or s.batch_size != self.segments[i - 1].batch_size
        ]
        self.phases = [Phase(s.first_step, s.epoch, s.batch_size) for s in new_sizes]

    def segment(self, step: int) -> Segment:
        """The segment update ``step`` (0-based) belongs to."""
        return self.segments[bisect.bisect_right(self._firsts, step) - 1]

    def batch_size(self, step: int) -> int:
        return self.segment(step).batch_size

    def epoch_of(self, step: int) -> int:
        """The 0-based epoch of update ``step`` (0-based), which is also the number of complete epochs once
        ``step`` updates are done; ``epochs`` once every update is done."""
        return bisect.bisect_right(self._epoch_first, step) - 1 if step < self.total_steps else self.epochs

    def epoch_range(self, epoch: int) -> tuple[int, int]:
        """[first, end) updates of ``epoch`` (0-based)."""
        end = self._epoch_first[epoch + 1] if epoch + 1 < self.epochs else self.total_steps
        return self._epoch_first[epoch], end

    def offset(self, step: int) -> int:
        """Examples of its epoch read before update ``step`` (0-based)."""
        s = self.segment(step)
        return s.start + (step - s.first_step) * s.batch_size

    def examples_seen(self, step: int) -> int:
        """Training examples the first ``step`` updates used."""
        if step >= self.total_steps:
            return self.epochs * self.n_train
        return self.epoch_of(step) * self.n_train + self.offset(step)

    def rest_of_epoch(self, step: int) -> list[Segment]:
        """The segments from update ``step`` to the end of its epoch, the first cut to start at ``step``."""
        epoch = self.epoch_of(step)
        out = []
        for s in self.segments[bisect.bisect_right(self._firsts, step) - 1 :]:
            if s.epoch != epoch:
                break
            cut = max(0, step - s.first_step)  # updates of it already done
            out.append(Segment(epoch, s.first_step + cut, s.start + cut * s.batch_size, s.end, s.batch_size))
        return out
