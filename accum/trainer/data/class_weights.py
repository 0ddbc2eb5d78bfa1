"""model.fit's class_weight as each example's weight, in NumPy: for arrays on every backend (the TensorFlow feed's
ArrayFeed, the JAX door). A stream's batches get the same rule in tf.data's graph (conversion.class_weights_tensor)."""

from __future__ import annotations

import numpy as np


def class_weights_of(y, class_weight: dict) -> np.ndarray:
    """float32 weights as model.fit derives them: one-hot targets by their argmax, [N, 1] squeezed, rounded to
    integers; classes not named weigh 1."""
    labels = np.asarray(y)
    if labels.ndim > 1:
        labels = np.argmax(labels, axis=-1) if labels.shape[-1] != 1 else np.squeeze(labels, axis=-1)
    labels = np.round(labels.astype(np.float32)).astype(np.int64)
    size = max(int(c) for c in class_weight) + 1
    table = np.ones(size, np.float32)
    for c, w in class_weight.items():
        table[int(c)] = w
    inside = (labels >= 0) & (labels < size)
    return np.where(inside, table[np.clip(labels, 0, size - 1)], np.float32(1.0))
