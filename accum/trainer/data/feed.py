"""The run's input pipeline: each update's micro-batches, pulled one at a time by the update itself.

``Feed`` lays out the rest of an epoch (``plan``): for each update its
global batch ``n`` and the micro-steps it pulls, and for each micro-step one
element per local replica, in the order the update pulls them. An element is
one micro-batch of the split's *stored* values (uint8 images stay uint8) and
``where``: (update, the micro-batch's first row in the global batch), what the
augmentation draws from. The update converts and augments an element inside
its micro-step (``Run.prepare``), so the pipeline never holds a batch, nor
anything in float32: one micro-batch being gathered and one waiting.

The cut is every caller's (accum.batching): each replica takes a contiguous
share of the batch and cuts it into ``pulls = min(k, largest share)``
micro-batches (one device: ``min(k, n)``, as the engine cut a batch it held).
A stream (data.name: python) is read front to back, so there each micro-step
takes a contiguous chunk of the batch and the replicas share the chunk: the
same micro-batches on one replica, and elements in stream order on several;
its rows gathered a chunk at a time, cut by the cutter of fit's batches too.

Where the data live: the split's arrays are one constant in host memory
(``tf.device("CPU:0")``), the gathers run in tf.data's host threads, and the
update's ``next(iterator)`` hands one micro-batch at a time to the device
that computes it. On a GPU the whole batch is never an input of the graph,
so it never lands on the device. The element stream is followed by empty
elements for ever (``endless``): under several workers tf.distribute then
needs no collective per pull to learn whether one is left.

``trim_padding``'s cut in the pipeline (its policy, on any backend: lengths.py): a batch's examples are put in order of
length and each micro-batch is cut after its longest sequence (arrays held in memory by index, ``Held``: fit's arrays
and the CLI's npz; fit's streams in their pipeline, ``cut_stream``): the update is still the whole batch's, as it sums
over the batch whatever the grouping, provided that the padding cut away changes neither the loss nor its gradient
(the backend's ``check_trim``).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...datasets.base import as_is, untuned
from .batching import Cut, micro_bounds, pieces, same_size
from .conversion import kind
from .lengths import sequence_lengths, uncut_steps
from .reader import Layout, Planned, lay_out, plan, positions


def empty_like(spec):
    """An element with no examples for ``spec``, its unknown axes of size 1: a model runs on it (an LSTM cannot
    step through a time axis of 0, which a padded_batch's unknown length would otherwise get)."""
    return tf.nest.map_structure(
        lambda s: tf.zeros([0] + [d if d is not None else 1 for d in s.shape[1:]], s.dtype), spec
    )


def sized(element, size: int):
    """An element, (data, where), whose data are known to hold ``size`` examples, with that size in their static
    shape: a micro-step traced for one micro-batch size runs leaner gradients (no shape arithmetic at every step of an
    LSTM's loop, for one). The same values up to rounding: TensorFlow may pick other kernels for a known shape
    (BatchNorm's sums do), so paths compared bit for bit trace alike. A wrong size fails the update
    (tf.ensure_shape)."""
    data, where = element
    return tf.nest.map_structure(lambda t: tf.ensure_shape(t, [size, *t.shape[1:]]) if t.shape.rank else t, data), where


def endless(elements: tf.data.Dataset, value=None) -> tf.data.Dataset:
    """``elements``, then empty ones for ever (``value``: what to follow them with instead)."""
    tail = empty_like(elements.element_spec) if value is None else value
    return elements.concatenate(tf.data.Dataset.from_tensors(tail).repeat())


def gathered(gather, order: np.ndarray, layout: Layout, parallel=None) -> tf.data.Dataset:
    """Elements read by index (``gather(indices)``: the stored values of those examples; ``parallel``: the gathers
    run side by side, the split's ``parallel_gather``)."""
    lengths = layout.ends - layout.starts
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    with tf.device("CPU:0"):
        indices = tf.constant(np.asarray(order, np.int64)[positions(layout)])
    bounds = tf.data.Dataset.from_tensor_slices((splits[:-1], splits[1:], layout.where))
    return bounds.map(
        as_is(lambda a, b, where: (gather(indices[a:b]), where)),
        **({"num_parallel_calls": parallel, "deterministic": True} if parallel else {}),
    )


def cut_stream(blocks: tf.data.Dataset, cut: Cut, wheres=None, trim: int = 0, timed=None) -> tf.data.Dataset:
    """The one stream cutter, both doors': ``blocks`` read front to back (accum_train.fit's batches as the user gives
    them; the CLI's stream a micro-step's chunk at a time, ``streamed``), each cut into this process's elements,
    (data, where), in pull order, as ``cut`` cuts a batch known once read; ``wheres``: each block's [m, 2] where
    (none by default). ``trim``: a block's rows longest first, each element's ``timed`` leaves cut after its
    longest sequence (trim_padding)."""

    def split(block, at):
        n = tf.shape(tf.nest.flatten(block)[0])[0]
        if trim:
            block, lengths = by_length(block)
        spans = tf.stack([tf.stack(span) for span in cut.bounds(n, stream=True)])

        def piece(span, at):
            data = tf.nest.map_structure(lambda t: t[span[0] : span[1]], block)
            return (cut_after(data, timed, lengths[span[0] : span[1]], trim) if trim else data), at

        return tf.data.Dataset.from_tensor_slices((spans, at)).map(piece)

    if wheres is None:  # a block of one part is that part, as tf.data passes it
        nowhere = tf.zeros([cut.k * len(cut.local), 2], tf.int64)
        return blocks.flat_map(lambda *block: split(block if len(block) > 1 else block[0], nowhere))
    return tf.data.Dataset.zip((blocks, wheres)).flat_map(split)


def streamed(split, epoch: int, layout: Layout, replicas: int, local) -> tf.data.Dataset:
    """Elements of a stream, read front to back: the layout's are chunk first (``plan``), a micro-step's chunk of
    the batch shared by the replicas, so the rows are gathered a chunk at a time and each chunk cut in the replicas'
    shares (``cut_stream``): a chunk is the most the pipeline holds, never a batch."""
    if not len(layout.starts):
        batched = tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape], s.dtype), split.spec)
        return tf.data.Dataset.from_tensors((empty_like(batched), tf.zeros([2], tf.int64))).take(0)
    at = np.cumsum([0] + [update.pulls * len(local) for update in layout.updates])[:-1]  # each update's first element
    firsts = layout.starts[at] - layout.where[at, 1]  # and its batch's first position
    chunks = lay_out([(0, f, pieces(u.n, u.pulls, 1, [0], True)) for u, f in zip(layout.updates, firsts)])
    first, last, sizes = int(chunks.starts.min()), int(chunks.ends.max()), chunks.ends - chunks.starts
    owner = np.full(last - first, -1, np.int64)
    owner[positions(chunks) - first] = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    owner_t, sizes_t = tf.constant(owner), tf.constant(sizes)
    examples = split.dataset(epoch).skip(first).take(last - first).enumerate().filter(lambda i, _: owner_t[i] >= 0)
    blocks = examples.group_by_window(
        key_func=lambda i, _: owner_t[i],
        reduce_func=lambda key, rows: rows.batch(tf.gather(sizes_t, key)).map(lambda i, rows: rows),
        window_size_func=lambda key: tf.gather(sizes_t, key),
    )
    wheres = tf.data.Dataset.from_tensor_slices(layout.where.reshape(-1, len(local), 2))
    return cut_stream(blocks, Cut(1, replicas, tuple(local)), wheres)


def distribute(strategy, elements: tf.data.Dataset):
    """An iterator over this process's ``elements`` (``untuned``): each pull gives every local replica its next
    one, in turn (one device: the next element)."""
    elements = untuned(elements)
    if strategy.num_replicas_in_sync == 1:
        return iter(elements)
    return iter(strategy.distribute_datasets_from_function(lambda context: elements))


def held(engine, data, n=None, updates: int = 1):
    """A batch held in memory as one update's pipeline, laid out and cut as every feed's: (iterator, n, pulls,
    size) for the engine's ``update_from`` or ``accumulate_from``. ``data``: this process's examples of the global
    batch of ``n`` (all of them, except under multi-worker, where a process holds its replicas' contiguous
    shares); ``updates``: the pipeline gives the same batch that many times (a benchmark's updates)."""
    local = len(tf.nest.flatten(data)[0])
    n = local if n is None else int(n)
    cut = Cut(engine.k, engine.replicas, tuple(engine.replica_ids))
    offset = micro_bounds(engine.replica_ids[0], n, engine.replicas)[0]  # where this process's share starts
    layout = lay_out([(0, -offset, cut.bounds(n))])
    data = tf.nest.map_structure(tf.convert_to_tensor, data)
    gather = lambda indices: tf.nest.map_structure(lambda t: tf.gather(t, indices), data)  # noqa: E731
    elements = gathered(gather, np.arange(local, dtype=np.int64), layout).repeat(updates)
    pulls = cut.pulls(n)
    return distribute(engine.strategy, elements), n, pulls, same_size(n, pulls, engine.replicas)


def by_plan(split, order, epoch: int, segments, k_for, replicas: int, local):
    """(elements, Layout, the order read) of ``segments`` (timeline.Segment) of ``epoch``, cut as ``plan`` lays them
    out: read front to back from a stream (``streamed``), else by index in ``order`` (``gathered``: the CLI's
    splits, accum_train.fit's arrays), each batch's examples longest first where the split orders them
    (``by_length``: trim_padding, trim.Held)."""
    if hasattr(split, "by_length"):
        order = np.array(order, copy=True)
        for segment in segments:
            for first in range(segment.start, segment.end, segment.batch_size):
                end = min(first + segment.batch_size, segment.end)
                order[first:end] = split.by_length(order[first:end])
    stream = kind(split) == "stream"
    layout = plan(segments, k_for, replicas, local, chunk_first=stream)
    if stream:
        return streamed(split, epoch, layout, replicas, local), layout, order
    if hasattr(split, "tensors"):
        split.tensors()  # made here, eagerly: not inside the map's graph
    return gathered(split.gather, order, layout, getattr(split, "parallel_gather", None)), layout, order


class Feed:
    """This process's elements for the rest of an epoch (``by_plan``), and the updates they make.

    ``iterator`` is what the engine pulls from; ``updates`` the plan, in order."""

    def __init__(self, split, order, epoch: int, segments, k_for, strategy, replica_ids):
        self.stream = kind(split) == "stream"
        replicas = strategy.num_replicas_in_sync
        elements, self.layout, self.order = by_plan(split, order, epoch, segments, k_for, replicas, replica_ids)
        self.updates = self.layout.updates
        self.iterator = distribute(strategy, endless(elements.prefetch(1)))

    def planned(self, step: int) -> Planned | None:
        """The Planned update ``step``, if this feed holds it."""
        first = self.updates[0].step if self.updates else 0
        return self.updates[step - first] if first <= step < first + len(self.updates) else None

    def indices(self, update: int) -> np.ndarray:
        """The split's indices of this process's examples of ``updates[update]`` (what a file error is
        looked for in)."""
        step = self.updates[update].step
        mine = self.layout.where[:, 0] == step
        parts = [np.arange(a, b) for a, b in zip(self.layout.starts[mine], self.layout.ends[mine])]
        picked = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return np.asarray(self.order)[picked] if self.order is not None else picked


def lengths_of(element):
    """Each example's length in a batch (tensors), as ``sequence_lengths`` reads arrays: one past its last step
    where any input of x is nonzero."""
    parts = element if isinstance(element, tuple) else (element,)
    lengths = None
    for t in tf.nest.flatten(parts[0]):
        if t.shape.rank < 2:
            continue
        used = tf.not_equal(t, tf.zeros([], t.dtype))
        if t.shape.rank > 2:
            used = tf.reduce_any(used, axis=list(range(2, t.shape.rank)))
        steps = tf.shape(used, out_type=tf.int64)[1]
        last = steps - tf.argmax(tf.cast(tf.reverse(used, [1]), tf.int32), axis=1, output_type=tf.int64)
        found = tf.where(tf.reduce_any(used, axis=1), last, tf.zeros_like(last))
        lengths = found if lengths is None else tf.maximum(lengths, found)
    return lengths


def by_length(element):
    """A batch's rows longest first (ties in their order), and their lengths."""
    lengths = lengths_of(element)
    order = tf.argsort(-lengths, stable=True)
    return tf.nest.map_structure(lambda t: tf.gather(t, order), element), tf.gather(lengths, order)


def any_length(spec, timed):
    """``spec`` with the time axis of every ``timed`` leaf of unknown length (what a cut gives)."""
    return tf.nest.map_structure(
        lambda s, cut: tf.TensorSpec([s.shape[0], None, *s.shape[2:]], s.dtype) if cut else s, spec, timed
    )


def cut_after(data, timed, lengths, multiple):
    """``data`` with its ``timed`` leaves cut after the longest of ``lengths``, rounded up to ``multiple`` (at least
    one multiple: an empty micro-batch, or one of empty sequences, keeps a time axis a model can run)."""
    steps = tf.shape(next(t for t, cut in zip(tf.nest.flatten(data), tf.nest.flatten(timed)) if cut), tf.int64)[1]
    longest = tf.reduce_max(tf.concat([tf.ones([1], tf.int64), tf.cast(lengths, tf.int64)], 0))
    end = tf.minimum((longest + multiple - 1) // multiple * multiple, steps)
    return tf.nest.map_structure(lambda t, cut: t[:, :end] if cut else t, data, timed)


class Held:
    """trim_padding for examples held in memory and read by index (fit's arrays, the CLI's npz): each example's
    length found once, a batch's examples ordered longest first (``by_length``) and each gathered micro-batch
    cut after its longest (``cut``)."""

    def __init__(self, arrays, multiple: int, where: str):
        self.multiple = multiple
        self.lengths, self.timed = sequence_lengths(arrays, where)
        self._lengths = tf.constant(self.lengths)
        self.steps = uncut_steps(arrays, self.timed)

    def by_length(self, batch: np.ndarray) -> np.ndarray:
        """A batch's indices, longest first (ties in their order): each micro-batch then holds sequences of like
        length, and the update is the same, as it sums over the whole batch."""
        return batch[np.argsort(-self.lengths[batch], kind="stable")]

    def cut(self, rows, indices):
        """``rows`` gathered at ``indices`` (a tensor), cut after their longest sequence, rounded up to the
        multiple (gathered, then cut: a cut of the stored arrays would copy every example's kept steps)."""
        return cut_after(rows, self.timed, tf.gather(self._lengths, indices), self.multiple)


class TrimmedSplit:
    """A split held in memory (datasets/base.py's TaskSplit: the CLI's npz) read with ``data.trim_padding``: what
    ``gather`` gives cut after each micro-batch's longest sequence, and ``by_length`` for each batch's order; the
    rest is the split's."""

    def __init__(self, split, multiple: int, where: str):
        self.split = split
        self.trim = Held(tuple(p for p in (split.x, split.y, split.weights) if p is not None), multiple, where)
        self.timed, self.by_length = self.trim.timed, self.trim.by_length
        stored = split.tensors()
        self.spec = any_length(  # of what ``gather`` gives
            tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), stored), self.timed
        )

    def signature(self):
        """(x spec, y spec) of a batch as the update takes it: the split's, of any length where it is cut."""
        signature = self.split.signature()
        # (x, y) or (x, (y, weights)): leaves in the order of the stored (x, y[, weights]) that ``timed`` is of
        flat = tf.nest.flatten(signature)
        return tf.nest.pack_sequence_as(signature, any_length(flat, tf.nest.flatten(self.timed)))

    def __len__(self) -> int:
        return len(self.split)

    def __getattr__(self, name):
        return getattr(self.split, name)

    def gather(self, indices):
        return self.trim.cut(self.split.gather(indices), indices)
