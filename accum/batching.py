"""The batch arithmetic: how a batch of ``n`` examples is cut into shares and micro-batches.

One place for it, imported wherever a batch is cut (the engines, the data
order, accum_train.fit's input pipeline): each of ``replicas`` takes a
contiguous share of the batch, and cuts its share into ``k`` contiguous
micro-batches whose sizes differ by at most one.
"""

from __future__ import annotations

import math


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
