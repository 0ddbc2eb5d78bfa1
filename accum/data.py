"""Data order: which examples each update sees.

The order of epoch ``e`` is a pure function of (seed, e), so a resumed run
sees exactly the batches an uninterrupted one would. The dataset's splits
turn an order into batches (datasets/base.py).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The permutation of epoch ``epoch`` (0-based)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def first_batch(data, seed: int, batch_size: int):
    """The first update's batch (epoch 0): what memory probes and the gradient check look at."""
    return data.train.take(epoch_order(seed, 0, len(data.train))[:batch_size])


def examples_seen(step: int, steps_per_epoch: int, n_train: int, batch_size: int) -> int:
    """Training examples consumed by the first ``step`` updates."""
    epochs, rest = divmod(step, steps_per_epoch)
    return epochs * n_train + min(rest * batch_size, n_train)


def describe_split(batch_size: int, k: int, replicas: Optional[int] = None) -> str:
    """The line a run starts with: how each batch is cut."""
    if replicas is None:
        return f"batch_size={batch_size} as {k} micro-batches of {batch_size // k}-{math.ceil(batch_size / k)} examples"
    share = math.ceil(batch_size / replicas)
    return (f"batch_size={batch_size} over {replicas} replicas ({batch_size // replicas}-{share} examples each), "
            f"each as {k} micro-batches of up to {math.ceil(share / k)} examples; one gradient all-reduce per update")
