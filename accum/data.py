"""Data order and batching.

The order of epoch ``e`` is a pure function of (seed, e), so a resumed run
sees exactly the batches an uninterrupted one would. Images are gathered and
scaled on the tf.data side, one batch at a time.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import tensorflow as tf


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The permutation of epoch ``epoch`` (0-based)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def to_inputs(images, labels):
    """uint8 images [n,H,W] or [n,H,W,C] -> float32 [n,H,W,C] in [0, 1]; labels -> int32."""
    x = tf.cast(images, tf.float32) / 255.0
    if x.shape.rank == 3:
        x = x[..., tf.newaxis]
    return x, tf.cast(labels, tf.int32)


def batches(images: tf.Tensor, labels: tf.Tensor, order: np.ndarray, batch_size: int):
    """Batches of a given order of indices, gathered and converted on the tf.data side."""
    indices = tf.data.Dataset.from_tensor_slices(order.astype(np.int64)).batch(batch_size)
    return indices.map(lambda idx: to_inputs(tf.gather(images, idx), tf.gather(labels, idx)),
                       num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)


def first_batch(data, seed: int, batch_size: int):
    """The first update's batch (epoch 0): what memory probes and the gradient check look at."""
    order = epoch_order(seed, 0, len(data.train.labels))[:batch_size]
    return to_inputs(data.train.images[order], data.train.labels[order])


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
