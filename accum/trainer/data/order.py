"""Data order: which examples each update sees.

The order of epoch ``e`` is a pure function of (seed, e), so a resumed run
sees exactly the batches an uninterrupted one would. The dataset's splits
turn an order into batches (datasets/base.py).
"""

from __future__ import annotations

import numpy as np

from ...defaults import MIN_BATCHNORM_MICRO_BATCH
from ...text import counted
from .batching import largest_micro_batch, largest_share


def noisy_batchnorm(examples: int, k: int) -> int:
    """The smallest micro-batch of ``examples`` (one replica's) cut ``k`` ways where it is under
    MIN_BATCHNORM_MICRO_BATCH (BatchNorm's statistics over it are noisy), else 0. The sizes differ by at most one
    (batching.micro_bounds)."""
    smallest = examples // min(k, examples) if examples > 0 else 0
    return smallest if 0 < smallest < MIN_BATCHNORM_MICRO_BATCH else 0


def epoch_order(seed: int, epoch: int, n: int, shuffle: bool | str = True, batch_size: int = 1) -> np.ndarray:
    """The permutation of epoch ``epoch`` (0-based); without ``shuffle`` the stored order; "batch": batches permuted."""
    if shuffle == "batch":
        blocks = epoch_order(seed, epoch, -(-n // batch_size))
        return np.concatenate([np.arange(b * batch_size, min((b + 1) * batch_size, n)) for b in blocks])
    return np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)


def first_batch(data, seed: int, batch_size: int, shuffle: bool = True):
    """The first update's batch (epoch 0): what memory probes and the gradient check look at."""
    if hasattr(data.train, "first"):  # a stream: its epoch 0 front to back
        return data.train.first(batch_size)
    return data.train.take(epoch_order(seed, 0, len(data.train), shuffle)[:batch_size])


def describe_split(batch_size: int, k: int | None, replicas: int | None = None) -> str:
    """The line a run starts with: how each batch is cut (``k`` None: the baseline, each share in one pass)."""
    if replicas is None:
        smallest, largest = batch_size // k, largest_micro_batch(batch_size, 1, k)
        sizes = f"{largest}" if smallest == largest else f"{smallest}-{largest}"
        return f"batch_size={batch_size} as {counted(k, 'micro-batch', 'micro-batches')} of {sizes} examples"
    share = largest_share(batch_size, replicas)
    cut = (
        "each in one pass (baseline)"
        if k is None
        else f"each as {k} micro-batches of up to {largest_micro_batch(batch_size, replicas, k)} examples"
    )
    return (
        f"batch_size={batch_size} over {replicas} replicas ({batch_size // replicas}-{share} examples each), "
        f"{cut}; one gradient all-reduce per update"
    )
