"""The updates as the loop and the memory guard read them, whatever feed and backend is behind them: ``Planned``,
one update as a feed lays it out; the updates of an epoch laid out as elements, whatever pipeline reads them
(``Layout``: each element's [start, end) in the epoch's order of examples and where it sits, (update, first row of the
batch), in the order the updates pull them); and ``Reader``, which opens a door's pipeline and pulls each update from
it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .batching import Cut, same_size


@dataclass(frozen=True)
class Planned:
    """One update as the feed lays it out: ``step`` (0-based), the batch size in force, the global batch
    ``n`` (the last one of an epoch may be short) and the micro-steps it pulls."""

    step: int
    batch_size: int
    n: int
    pulls: int
    k: int  # micro-batches per share the layout was made for (pulls: fewer when the batch is short)
    size: int | None = None  # the examples of every element, when all hold the same number (batching.same_size)


@dataclass
class Layout:
    """Every element of the updates planned: [start, end) of the epoch's positions, and where (update, row of
    the batch); elements in pull order."""

    updates: list
    starts: np.ndarray
    ends: np.ndarray
    where: np.ndarray


def lay_out(batches, updates=()) -> Layout:
    """The one layout builder, for the run's feed and accum_train.fit's arrays: ``batches`` holds, per update in
    order, (step, the batch's first position in the epoch's order, its elements' [start, end) in the batch in
    pull order: batching.pieces)."""
    starts, ends, where = [], [], []
    for step, first, bounds in batches:
        for start, end in bounds:
            starts.append(first + start)
            ends.append(first + end)
            where.append((step, start))
    as_array = lambda values: np.asarray(values, np.int64).reshape(-1)  # noqa: E731
    return Layout(list(updates), as_array(starts), as_array(ends), np.asarray(where, np.int64).reshape(-1, 2))


def plan(segments, k_for, replicas: int, local, chunk_first: bool = False) -> Layout:
    """The layout of ``segments`` (timeline.Segment), ``k_for(batch_size)`` micro-batches per share: a short batch
    pulls ``min(k, largest share)``."""
    updates, batches = [], []
    for segment in segments:
        cut = Cut(k_for(segment.batch_size), replicas, tuple(local))
        for u in range(segment.updates):
            first = segment.start + u * segment.batch_size
            n = min(segment.batch_size, segment.end - first)
            pulls = cut.pulls(n)
            step = segment.first_step + u
            size = None if chunk_first else same_size(n, pulls, replicas)  # a stream may end short of n
            updates.append(Planned(step, segment.batch_size, n, pulls, cut.k, size))
            batches.append((step, first, cut.bounds(n, chunk_first)))
    return lay_out(batches, updates)


def positions(layout: Layout) -> np.ndarray:
    """The epoch positions of every element, concatenated in pull order."""
    lengths = layout.ends - layout.starts
    total = int(lengths.sum())
    offsets = np.repeat(layout.starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return (np.arange(total, dtype=np.int64) + offsets).astype(np.int64)


class Reader:
    """The updates of a run or a fit call as the loop and the memory guard read them, one door's pipeline behind
    them (the CLI's from from_config/run_parts.Run.reader, accum_train.fit's from fit_hooks.FitHooks).

    ``at(step)`` gives the iterator and the Planned update; the pipeline is opened again (``open(step, k)``, the
    door's: an object with ``iterator`` and ``planned(step)``, None past what it holds) when it cannot serve: at
    the start, for an update that is not the next one it holds, after an update that did not finish (``forget``:
    its elements were pulled, a retry pulls them again), and when the engine's k is not the one it was cut for
    (auto doubled it). ``follow(batch_size)``: called before the first update at each batch size (the CLI sets k
    for it); ``k()``: the micro-batches per share in force (the engine's by default); ``keep``: variables a retry
    puts back as they were before it (fit's metrics)."""

    def __init__(self, engine, open, follow=None, k=None, keep=()):
        self.engine, self.open, self.follow, self.keep = engine, open, follow, list(keep)
        self.k = k or (lambda: engine.k)
        self.opened, self.next = None, None  # the pipeline, and the update whose elements it gives next
        self.in_force = None  # the batch size ``follow`` was called for last
        self.saved = None

    def at(self, step: int):
        """(iterator, Planned) of update ``step`` (0-based): pull ``pulls`` elements per local replica."""
        planned = self.opened.planned(step) if self.opened is not None and step == self.next else None
        if planned is None:
            planned = self._open(step)
        if self.follow is not None and planned.batch_size != self.in_force:
            self.follow(planned.batch_size)
            self.in_force = planned.batch_size
        if planned.k != self.k():  # cut for another k: cut again from here
            planned = self._open(step)
        if self.keep:
            self.saved = [v.numpy() for v in self.keep]
        return self.opened.iterator, planned

    def _open(self, step: int):
        self.opened, self.next = self.open(step, self.k()), step
        return self.opened.planned(step)

    def update(self, step: int, stop: int = 0) -> dict:
        """Update ``step`` straight from the pipeline (no memory guard): the engine's record."""
        iterator, planned = self.at(step)
        out = self.engine.update_from(iterator, planned.n, planned.pulls, stop, planned.size)
        self.pulled()
        return out

    def pulled(self) -> None:
        """The update ``at`` gave has pulled its elements and finished."""
        self.next += 1

    def go_on(self, step: int) -> None:
        """The open pipeline goes on at update ``step`` (a stream read on from epoch to epoch)."""
        self.next = step

    def close(self) -> None:
        """The next ``at`` opens the pipeline again."""
        self.opened = None

    def forget(self) -> None:
        """The update did not finish: the next ``at`` opens the pipeline again, ``keep`` put back as it was."""
        self.close()
        for variable, value in zip(self.keep, self.saved or ()):
            variable.assign(value)

    def indices(self, step: int) -> np.ndarray:
        """The split's indices this process reads for update ``step`` and the one after (a broken file is
        looked for among them: the pipeline reads ahead); none from a stream."""
        feed = self.opened
        if feed is None or feed.stream:
            return np.zeros(0, np.int64)
        mine = [u for u, planned in enumerate(feed.updates) if planned.step in (step, step + 1)]
        return np.concatenate([feed.indices(u) for u in mine]) if mine else np.zeros(0, np.int64)
