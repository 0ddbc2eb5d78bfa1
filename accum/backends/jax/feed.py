"""accum_train.fit's data on JAX, in numpy: what the TensorFlow backend reads through tf.data (trainer/data/), read
here without TensorFlow. Arrays are laid out by arrays.Arrays, so an epoch's batches and their order are the
TensorFlow door's; a stream (a generator, a keras.utils.PyDataset, a tf.data.Dataset where TensorFlow is installed)
is read batch by batch as the updates pull it. Each batch is cut into micro-batches as batching.Cut cuts it, an
element ``(x, y, sample_weight)`` each (``None`` for no weights), in the order the engine pulls them (``pieces``:
per micro-step, one per replica); after the data, empty elements for ever, which the engine counts as no examples,
so that the loop learns where a stream of unknown length ends."""

from __future__ import annotations

import itertools

import keras
import numpy as np

from ... import keras_private
from ...errors import UserError
from ...trainer.data.arrays import Arrays
from ...trainer.data.batching import Cut, pieces
from ...trainer.data.conversion import WHERE, _leaves_as_arrays, class_weights_of
from ...trainer.data.lengths import cut_length, sequence_lengths, uncut_steps
from ...trainer.data.reader import plan


def rows(parts, picked):
    """Rows ``picked`` (a slice, or indices) of each array of ``parts`` (None, no sample weights, stays None)."""
    return keras.tree.map_structure(lambda a: None if a is None else a[picked], parts)


def examples(element) -> int:
    return len(keras.tree.flatten(element[0])[0])


def _then_empty(elements, like, pad: bool):
    """``elements``, then (``pad``) empty ones shaped as ``like`` for ever."""
    yield from elements
    empty = rows(like, slice(0, 0))
    while pad:
        yield empty


def trimmed(element, timed, length: int):
    """``element`` (x, y, sample_weight) with its ``timed`` leaves (the arrays' structure, True where cut on axis 1)
    cut to ``length`` steps."""
    cut = lambda a, t: a[:, :length] if t else a  # noqa: E731
    return tuple(part if t is None else keras.tree.map_structure(cut, part, t) for part, t in zip(element, timed))


class ArrayBatches(Arrays):
    """Arrays in memory, held as numpy (arrays.Arrays), each element gathered by index as the TensorFlow door's
    ArrayFeed gathers it. ``y`` is required: the objective trains on targets. ``trim``: trim_padding's multiple
    (0: off): on one device each micro-batch of like sequences cut to its own longest, rounded up to it
    (lengths.cut_length; a compiled micro-step per length), over devices every micro-batch of an update to the
    update's longest, so that they stack to one shape."""

    def __init__(self, x, y, sample_weight, class_weight, *, trim=0, **settings):
        if y is None:
            raise UserError(f"{WHERE}: x is given without y: pass the targets as y")
        super().__init__(x, y, sample_weight, class_weight, **settings)
        self.parts = (*self.arrays, None)[:3]  # (x, y, sample_weight or None)
        self.trim, self.steps, self.timed = int(trim), None, None
        if self.trim:
            self.lengths, timed = sequence_lengths(self.arrays, WHERE)
            self.steps = uncut_steps(self.arrays, timed)
            self.timed = (*timed, None)[:3]

    def dataset(self, epoch: int, first: int, cut: Cut, pad: bool = True, again: bool = False):
        """This process's elements for updates ``first``.. of ``epoch`` (0-based) (``pad``: then endless empty
        ones); ``again`` is a stream's."""
        order, segments = self.segments(epoch, first)
        layout = plan(segments, lambda _: cut.k, cut.replicas, cut.local)
        picked = [order[start:end] for start, end in zip(layout.starts, layout.ends)]
        if not self.trim:
            return _then_empty((rows(self.parts, indices) for indices in picked), self.parts, pad)
        updates = layout.where[:, 0].tolist()
        if cut.replicas == 1:  # each micro-batch of like sequences, cut to its own longest (by_length)
            picked = by_length(picked, updates, self.lengths)
            lengths = [cut_length(self.lengths[i].max(initial=0), self.trim, self.steps) for i in picked]
        else:  # the devices' micro-batches stack into one array: one length for the update
            longest = {}  # update: its longest sequence
            for update, indices in zip(updates, picked):
                longest[update] = max(longest.get(update, 0), int(self.lengths[indices].max(initial=0)))
            lengths = [cut_length(longest[update], self.trim, self.steps) for update in updates]
        taken = (trimmed(rows(self.parts, i), self.timed, n) for i, n in zip(picked, lengths))
        return _then_empty(taken, trimmed(self.parts, self.timed, self.trim), pad)


def by_length(picked: list, updates: list, lengths) -> list:
    """``picked`` (each micro-batch's indices, of update ``updates[i]``) with each update's examples ordered by
    length, shortest first, and dealt back into micro-batches of the same sizes: sequences of like length share a
    micro-batch, which trim_padding then cuts short (the update, a sum over the whole batch, is the same)."""
    out, start = [], 0
    while start < len(picked):
        end = start
        while end < len(picked) and updates[end] == updates[start]:
            end += 1
        together = np.concatenate(picked[start:end])
        together = together[np.argsort(lengths[together], kind="stable")]
        bounds = np.cumsum([0, *(len(i) for i in picked[start:end])])
        out += [together[a:b] for a, b in itertools.pairwise(bounds)]
        start = end
    return out


class StreamBatches:
    """Batches as a source gives them, read as the updates pull them: ``read()`` gives an iterator over them from
    the start (a generator's goes on where it stands). ``cardinality``: its batches, where known; ``once``: read
    once (a generator), each epoch going on where the last stopped; ``continues``: with ``steps_per_epoch``, one
    stream from epoch to epoch (model.fit's reading of a dataset); ``end_of_epoch``: a PyDataset's."""

    sizes, schedule, batch_size, examples, steps, timed = False, (), None, None, None, None

    def __init__(
        self,
        read,
        name: str,
        *,
        steps_per_epoch,
        class_weight,
        cardinality=None,
        once=False,
        ends=None,
        missing=None,
        restart=None,
        trim=0,
    ):
        self.trim = int(trim)  # trim_padding's multiple (0: off): each micro-batch cut to its longest, rounded up
        self.read, self.name, self.class_weight, self.ends, self.restart = read, name, class_weight, ends, restart
        # what a batch without targets is told (a KerasHub task's: its preprocessor was given no labels)
        self.missing = missing or f"{name}'s batches hold no targets: make them (x, y) or (x, y, sample_weight)"
        self.steps_per_epoch, self.cardinality, self.once = steps_per_epoch, cardinality, once
        self.continues = steps_per_epoch is not None and not once
        self.first = None  # the first batch, read once (a generator's is put back in front of the rest)
        self.opened = False

    def first_batch(self):
        if self.first is None:
            source = self.read()
            self.first = self._batch(next(iter(source), None))
            if self.once:  # the one stream, its first batch put back in front
                stream = itertools.chain([self.first], (self._batch(batch) for batch in source))
                self.read = lambda: stream
            elif self.restart is not None:  # a PyDataset's workers, which went on reading ahead
                self.restart()
            if self.trim:  # the length before the cut (``steps``), which the objective counts a mean over
                self._lengths(self.first)
        return self.first

    def _batch(self, batch):
        """One batch as numpy (x, y, sample_weight or None), checked as model.fit reads one; class weights made
        sample weights."""
        if batch is None:
            raise UserError(f"{WHERE}: {self.name} gives no batch: it must give at least one")
        parts = list(batch) if isinstance(batch, tuple) else [batch]
        while parts and parts[-1] is None:  # (x, None) and (x, y, None) are (x,) and (x, y), as in model.fit
            parts.pop()
        if len(parts) < 2 or parts[1] is None:
            raise UserError(f"{WHERE}: {self.missing}")
        x, y, *weights = _leaves_as_arrays(tuple(parts), f"a batch of {self.name}")
        weights = weights[0] if weights else None
        if self.class_weight is not None:
            scaled = class_weights_of(keras.tree.flatten(y)[0], self.class_weight)
            weights = (
                scaled if weights is None else scaled * np.asarray(weights, np.float32).reshape(len(scaled), -1)[:, 0]
            )
        return x, y, weights

    def updates(self, epoch: int) -> int | None:
        return self.steps_per_epoch if self.steps_per_epoch is not None else self.cardinality

    def _lengths(self, batch):
        """Each sequence's length in ``batch``. Every batch must have the first one's length before the cut
        (``steps``), which a mean over every position divides by."""
        given = tuple(part for part in batch if part is not None)
        lengths, timed = sequence_lengths(given, WHERE)
        steps = uncut_steps(given, timed)
        if self.steps is None:
            self.steps = steps
        elif steps != self.steps:
            raise UserError(
                f"{WHERE}: trim_padding on Keras' JAX backend needs every batch of {self.name} to be one length on "
                f"axis 1 before the cut (the first is {self.steps}, a later one {steps}): pad them to one length"
            )
        self.timed = (*timed, None)[: len(batch)]
        return lengths

    def _trimmed(self, batch, lengths=None):
        """``batch`` with its time axis cut after its longest sequence (of ``lengths``, where measured), rounded up
        to the multiple."""
        lengths = self._lengths(batch) if lengths is None else lengths
        return trimmed(batch, self.timed, cut_length(lengths.max(initial=0), self.trim, self.steps))

    def _elements(self, batch, cut: Cut):
        """``batch``'s elements in the order the engine pulls them. With trim_padding on one device its sequences
        are ordered by length, dealt into the micro-batches and each cut to its own longest, as ArrayBatches cuts
        them (by_length); over devices, whose micro-batches stack into one array, the batch keeps one length."""
        bounds = pieces(examples(batch), cut.k, cut.replicas, cut.local)
        if self.trim and cut.replicas == 1:
            lengths = self._lengths(batch)
            order = np.argsort(lengths, kind="stable")
            picked = (order[start:end] for start, end in bounds)
            return (self._trimmed(rows(batch, i), lengths[i]) for i in picked)
        batch = self._trimmed(batch) if self.trim else batch
        return (rows(batch, slice(start, end)) for start, end in bounds)

    def dataset(self, epoch: int, first: int, cut: Cut, pad: bool = True, again: bool = False):
        """This process's elements from update ``first`` of ``epoch`` on (``pad``: then endless empty ones;
        ``again``: the stream ran out before this epoch and starts over, as model.fit's does)."""
        like = self.first_batch()
        if self.trim:
            like = self._trimmed(like)
        batches = (self._batch(b) for b in self.read()) if not self.once else self.read()
        skip = first
        if self.once:  # the one stream, as it stands: passed over to ``first`` when first opened (a resume)
            skip = first + (epoch * self.steps_per_epoch if self.steps_per_epoch else 0) if not self.opened else 0
            self.opened = True
            batches = itertools.islice(batches, skip, None)
            if self.steps_per_epoch is not None:
                batches = itertools.islice(batches, self.steps_per_epoch - first)
        else:
            if self.continues and not again:  # one stream from epoch to epoch: the epochs before read from it too
                skip += epoch * self.steps_per_epoch
            batches = itertools.islice(batches, skip, None)

        elements = itertools.chain.from_iterable(self._elements(batch, cut) for batch in batches)
        return _then_empty(elements, like, pad)

    def end_of_epoch(self) -> None:
        if self.ends is not None:
            self.ends()


def stream_of(
    source, what: str, name: str, *, steps_per_epoch, class_weight, shuffle, missing=None, trim=0
) -> StreamBatches:
    """The StreamBatches of a source of batches of kind ``what`` (conversion.kind's): a tf.data.Dataset read afresh
    each epoch, a PyDataset through Keras' own adapter (its workers, its shuffling, its ``on_epoch_end``), a
    generator once."""
    settings = dict(steps_per_epoch=steps_per_epoch, class_weight=class_weight, missing=missing, trim=trim)
    if what == "dataset":
        known = int(source.cardinality())
        return StreamBatches(source.as_numpy_iterator, name, cardinality=known if known >= 0 else None, **settings)
    if what == "pydataset":
        adapter = keras_private.py_dataset_adapter(source, shuffle=bool(shuffle))
        restart = lambda: keras_private.restart_py_dataset_workers(adapter)  # noqa: E731
        return StreamBatches(
            adapter.get_numpy_iterator,
            name,
            cardinality=adapter.num_batches,
            ends=adapter.on_epoch_end,
            restart=restart,
            **settings,
        )
    return StreamBatches(lambda: source, name, once=True, **settings)
