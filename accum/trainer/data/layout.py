"""The updates of an epoch laid out as elements, whatever pipeline reads them: each element's [start, end) in the
epoch's order of examples and where it sits (update, first row of the batch), in the order the updates pull them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .batching import Cut, same_size
from .reader import Planned


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
