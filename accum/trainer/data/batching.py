"""The batch arithmetic: how a batch of ``n`` examples is cut into shares and micro-batches.

One place for it, imported wherever a batch is cut (the accumulator's held
batches, the run's feed, accum_train.fit's input pipeline): each of
``replicas`` takes a contiguous share of the batch, and cuts its share into
``k`` contiguous micro-batches whose sizes differ by at most one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def micro_bounds(i, n, k):
    """[start, end) of part i of k over n examples: sizes differ by at most one (Python ints or tensors)."""
    return (i * n) // k, ((i + 1) * n) // k


def largest_share(batch_size: int, replicas: int = 1) -> int:
    """The largest replica share of a batch of ``batch_size`` (shares differ by at most one)."""
    return math.ceil(batch_size / replicas)


def k_for_micro_batch(batch_size: int, micro_batch_size: int, replicas: int = 1) -> int:
    """The fewest micro-batches per replica share that keep each within ``micro_batch_size`` examples (at least
    one, and no more than the share has examples)."""
    share = largest_share(batch_size, replicas)
    return max(1, min(math.ceil(share / micro_batch_size), share))


def largest_micro_batch(batch_size: int, replicas: int, k: int) -> int:
    """The largest micro-batch when each of ``replicas`` cuts its share of ``batch_size`` into ``k``."""
    return math.ceil(largest_share(batch_size, replicas) / k)


def pieces(n, k: int, replicas: int, local, chunk_first: bool = False) -> list:
    """[start, end) in a batch of ``n`` (an int or a tensor) of each element a process pulls, in pull order: per
    micro-step, per local replica (ids ``local``). Each replica's share cut into ``k`` micro-batches; with
    ``chunk_first`` (a stream, read front to back) micro-step i's chunk of the batch, shared by the replicas."""
    out = []
    for i in range(k):
        for r in local:
            if chunk_first:
                c0, c1 = micro_bounds(i, n, k)
                s0, s1 = micro_bounds(r, c1 - c0, replicas)
                out.append((c0 + s0, c0 + s1))
            else:  # replica r's contiguous share of the batch
                s0, s1 = micro_bounds(r, n, replicas)
                m0, m1 = micro_bounds(i, s1 - s0, k)
                out.append((s0 + m0, s0 + m1))
    return out


def same_size(n: int, k: int, replicas: int = 1):
    """The examples of every element of a batch of ``n`` cut into ``k`` micro-batches per replica share, when
    they all hold the same number (then known while the update is traced); else None."""
    sizes = {end - start for start, end in pieces(n, k, replicas, range(replicas))}
    size = sizes.pop() if len(sizes) == 1 else 0
    return size or None


@dataclass(frozen=True)
class Cut:
    """How a batch becomes this process's elements: ``k`` micro-steps, ``replicas`` in all, these local ones.

    The one rule of both doors: a batch whose size is known (arrays, the CLI's splits, the nominal batch of a
    stream) is pulled in ``pulls(n)`` micro-steps, k or fewer when a share holds fewer examples; a batch whose size
    is known only once read (accum_train.fit's streams: ``n`` a tensor) in k, some of them maybe empty. A stream
    read front to back is cut chunk first (``pieces``), in both doors."""

    k: int
    replicas: int
    local: tuple[int, ...]

    def pulls(self, n: int) -> int:
        """The micro-steps of a batch of ``n`` examples: k, or the largest share's examples if fewer."""
        return min(self.k, largest_share(n, self.replicas))

    def bounds(self, n, stream: bool = False):
        """[start, end) of each element of a batch of ``n`` examples (an int, or a tensor: k micro-steps), in pull
        order; ``stream``: chunk first."""
        pulls = self.pulls(n) if isinstance(n, int) else self.k
        return pieces(n, pulls, self.replicas, self.local, chunk_first=stream)


def as_data(element, n=None):
    """A batch as the objective takes it, (x, y, sample weights or None), from (x, y), (x, y, sample_weight) or
    a dataset's (x, (y, sample_weight)) (whose targets are one array, or a dict by output: never a pair)."""
    x, y, *weights = element
    if not weights and isinstance(y, tuple) and len(y) == 2:
        y, weights = y[0], [y[1]]
    return x, y, (weights[0] if weights else None)


def eval_batch_size(batch_size: int, subdivisions: int, micro_batch_size: int | None = None) -> int:
    """Evaluation holds no gradients: twice a training micro-batch fits where one did (at least 100)."""
    micro = micro_batch_size or largest_micro_batch(batch_size, 1, subdivisions)
    return max(2 * micro, 100)
