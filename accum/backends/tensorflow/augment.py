"""Random crops and flips of the training images (data.augment), reproducible, drawn inside the micro-step's graph
(a JAX backend would draw them with jax.random inside its jitted step).

Every draw is a stateless function of (seed, update, position in the global batch): a resumed run, a retried
update (subdivisions: auto) and a worker that holds only its part of the batch all see exactly the images one
uninterrupted single-device run sees. The draws are made for the whole global batch and each process keeps its own
rows, so the split across workers changes nothing.
"""

from __future__ import annotations

import tensorflow as tf


class Augment:
    def __init__(self, flip: bool, crop: int, seed: int):
        self.flip, self.crop, self.seed = flip, crop, seed

    @property
    def active(self) -> bool:
        return self.flip or self.crop > 0

    def rows(self, x, step, n, begin=0):
        """``x``, rows [begin, begin + len(x)) of update ``step``'s global batch of ``n`` (in a graph: the
        micro-step's, or eagerly)."""
        return self._augment(x, tf.cast(step, tf.int64), tf.cast(n, tf.int32), tf.cast(begin, tf.int32))

    def _augment(self, x, step, n, begin):
        rows = tf.shape(x)[0]
        seed = tf.stack([tf.constant(self.seed, tf.int64), step])
        if self.crop:
            pad, height, width = self.crop, x.shape[1], x.shape[2]
            # one (top, left) per example of the global batch: shifts of -crop..crop pixels
            corner = tf.random.stateless_uniform([n, 2], seed, 0, 2 * pad + 1, tf.int32)[begin : begin + rows]
            padded = tf.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
            padded = tf.gather(padded, corner[:, :1] + tf.range(height)[None], axis=1, batch_dims=1)
            x = tf.gather(padded, corner[:, 1:] + tf.range(width)[None], axis=2, batch_dims=1)
        if self.flip:
            mirrored = tf.random.stateless_uniform([n], seed + [0, 1 << 40], 0, 2, tf.int32)[begin : begin + rows] > 0
            x = tf.where(mirrored[:, None, None, None], tf.reverse(x, [2]), x)
        return x
