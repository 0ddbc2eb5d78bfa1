"""Arrays in memory (arrays.Arrays) as accum_train.fit's feed on tf.data: stored once and never copied per epoch, each
element gathering its own examples from them (``feed.by_plan``) in the order arrays.py lays out. The feed's part
that speaks tf.data, apart from sources.py's dispatch, which imports no TensorFlow."""

from __future__ import annotations

import tensorflow as tf

from ...datasets.base import stored
from .arrays import Arrays
from .batching import Cut
from .conversion import WHERE
from .feed import Held, any_length, by_plan, endless


class ArrayFeed(Arrays):
    """Arrays in memory (arrays.Arrays), read through tf.data; ``trim``: cut each micro-batch's time axis to a multiple
    of it (trim_padding)."""

    def __init__(self, x, y, sample_weight, class_weight, *, trim=0, **settings):
        super().__init__(x, y, sample_weight, class_weight, **settings)
        arrays = self.arrays
        # once, in host memory: what every epoch gathers from; a copy, as the caller's arrays may change while
        # fit trains (a callback's in-place edit), and what it trains on must not
        self.stored = tf.nest.map_structure(lambda a: stored(a, copy=True), arrays)
        self.parallel_gather = tf.data.AUTOTUNE
        self.trim = int(trim)  # 0, or cut each micro-batch's time axis to a multiple of it (trim_padding)
        self.held = self.timed = self.steps = None
        if self.trim:  # each batch's examples longest first (feed.by_plan asks for by_length)
            self.held = Held(arrays, self.trim, WHERE)
            self.timed, self.steps, self.by_length = self.held.timed, self.held.steps, self.held.by_length

    @property
    def element_spec(self):
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), self.stored)
        return any_length(spec, self.timed) if self.trim else spec

    def gather(self, indices):
        """Examples ``indices`` (a tensor) of every array (feed.gathered's ``gather``); with ``trim``, the time axis
        cut after the longest of them, rounded up to a multiple of ``trim``."""
        rows = tf.nest.map_structure(lambda t: tf.gather(t, indices), self.stored)
        return self.held.cut(rows, indices) if self.trim else rows

    def dataset(self, epoch: int, first: int, cut: Cut, pad: bool = True, again: bool = False) -> tf.data.Dataset:
        """This process's elements for updates ``first``.. of ``epoch`` (0-based) (``pad``: then endless
        empty ones)."""
        order, segments = self.segments(epoch, first)
        elements = by_plan(self, order, epoch, segments, lambda _: cut.k, cut.replicas, cut.local)[0]
        return endless(elements) if pad else elements
