"""Your own tf.data pipeline (``data: {name: python, factory: "module:function", ...}``).

``function(split, epoch, seed, **options)`` returns an unbatched
``tf.data.Dataset`` of ``(x, y)`` or ``(x, y, sample_weight)`` for ``split``
"train" and "test"; ``options`` are the other keys under ``data:``. accum-train
batches it, converts it as an .npz's arrays are converted (uint8 inputs scaled
by 1/255, float64 as float32) and, with ``data.shuffle``, shuffles it through
a buffer of ``data.shuffle_buffer`` examples drawn from (seed, epoch). It is
streamed: only the batches in flight are in memory.

The factory's contract: the same arguments give the same examples in the same
order, and every epoch holds as many. Then a resumed run re-creates its
epoch's dataset, skips the examples the epoch already used, and ends where an
uninterrupted run ends. The training set is counted once when the run starts
(tf.data's cardinality when it knows it, else one pass), so that the epoch
can be laid out in updates. The module is found in the working directory or
the config file's folder (config/parse.py records its file), else among the
installed packages.
"""

from __future__ import annotations

import copy

import numpy as np

from ..defaults import SHUFFLE_BUFFER
from ..errors import DataError
from ..imports import import_function
from ..text import first_line
from .base import Dataset, TaskSplit, described, untuned


def import_factory(factory: str):
    """The function data.factory names; every failure in one line."""
    return import_function(factory, "data.factory", DataError, also=" and the config file's folder")


class StreamSplit:
    """One split of the factory's data, streamed; its ``len`` counted once (``data.train_limit`` caps it)."""

    targets_as_given = True  # the loss takes the targets as they come (not class labels)
    streamed = True  # read front to back (accum.feed.streamed), not by index

    convert = staticmethod(TaskSplit.convert)  # a micro-batch of the factory's elements, as the update takes it

    def __init__(self, make, factory: str, split: str, seed: int, options: dict, shuffle: bool, buffer: int):
        self.make, self.factory, self.split, self.seed = make, factory, split, seed
        self.options, self.shuffle, self.buffer = dict(options), shuffle, buffer
        self.limit = None
        made = self.dataset(0)  # checked here: a bad factory fails before anything is counted
        self.spec = made.element_spec
        self.examples = self._count(made)

    def __len__(self) -> int:
        return self.examples if self.limit is None else min(self.examples, self.limit)

    def head(self, n: int) -> StreamSplit:
        limited = copy.copy(self)
        limited.limit = n if self.limit is None else min(n, self.limit)
        return limited

    def dataset(self, epoch: int):
        """The factory's examples of ``epoch`` (checked: a dataset of (x, y) or (x, y, sample_weight)), limited and
        shuffled as the config says."""
        import tensorflow as tf

        try:
            made = self.make(self.split, epoch, self.seed, **self.options)
        except Exception as err:
            raise DataError(
                f"data.factory={self.factory!r} failed for split {self.split!r}, epoch {epoch} "
                f"({type(err).__name__}: {first_line(err)})"
            ) from None
        if not isinstance(made, tf.data.Dataset):
            raise DataError(
                f"data.factory={self.factory!r} returned {type(made).__name__} for split {self.split!r}: it must "
                f"return an unbatched tf.data.Dataset of (x, y) or (x, y, sample_weight)"
            )
        spec = made.element_spec
        if not isinstance(spec, tuple) or len(spec) not in (2, 3):
            raise DataError(
                f"data.factory={self.factory!r} returned a dataset of {_spec_text(spec)} for split "
                f"{self.split!r}: its elements must be (x, y) or (x, y, sample_weight)"
            )
        if len(spec) == 3 and spec[2].shape.rank != 0:
            raise DataError(
                f"data.factory={self.factory!r}: its sample weights have shape {tuple(spec[2].shape)} per example: "
                f"give one number per example"
            )
        if self.limit is not None:
            made = made.take(self.limit)
        if self.shuffle and self.split == "train":
            # a fixed seed per (run, epoch): the same order when the epoch is read again (a resume)
            made = made.shuffle(
                self.buffer,
                seed=int(np.random.SeedSequence([self.seed, epoch]).generate_state(1)[0]),
                reshuffle_each_iteration=False,
            )
        return made

    def _count(self, made) -> int:
        import tensorflow as tf

        known = int(made.cardinality())
        if known == tf.data.INFINITE_CARDINALITY:
            raise DataError(
                f"data.factory={self.factory!r} returned an infinite dataset for split {self.split!r} (it repeats): "
                f"return one epoch of examples; accum-train repeats it"
            )
        if known >= 0:
            return known
        return int(made.reduce(np.int64(0), lambda count, _: count + 1))  # one pass, nothing kept

    def _batched(self, dataset, batch_size: int):
        batches = dataset.batch(batch_size).map(lambda *element: self.convert(element), num_parallel_calls=1)
        return untuned(batches.prefetch(1))

    def batches(self, order: np.ndarray, batch_size: int):
        """The split in its own order (evaluation reads it front to back; ``order`` must be that order)."""
        if not np.array_equal(order, np.arange(len(order))) or len(order) != len(self):
            raise ValueError("a streamed split is read front to back, whole")
        return self.epoch_batches(0, batch_size)

    def epoch_batches(self, epoch: int, batch_size: int):
        """Epoch ``epoch``'s examples in its order (shuffled for it), converted batch by batch."""
        return self._batched(self.dataset(epoch), batch_size)

    def first(self, n: int):
        """The first ``n`` examples of epoch 0 as one batch (what memory probes and the gradient check use)."""
        return next(iter(self._batched(self.dataset(0).take(n), n)))

    def stored(self) -> dict:
        """The elements' dtypes and shapes, as the factory gives them (see TaskSplit.stored)."""
        one = lambda spec: {"dtype": spec.dtype.name, "shape": list(spec.shape)}  # noqa: E731
        return {"x": described(self.spec[0], one), "y": described(self.spec[1], one), "weights": len(self.spec) > 2}

    def signature(self):
        """(x spec, y spec) of a batch as the update takes it: the factory's element spec, batched and traced
        through ``convert`` itself (nothing read), so that the two cannot disagree."""
        import tensorflow as tf

        batched = tf.nest.map_structure(lambda spec: tf.TensorSpec([None, *spec.shape], spec.dtype), self.spec)
        converted = tf.function(lambda *element: self.convert(element), autograph=False).get_concrete_function(*batched)
        return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), converted.structured_outputs)


def _spec_text(spec) -> str:
    if isinstance(spec, tuple):
        return f"tuples of {len(spec)}"
    if isinstance(spec, dict):
        return f"dicts with keys {', '.join(map(str, spec))}"
    return f"single {type(spec).__name__}s"


def load(data_config, seed: int = 0) -> Dataset:
    """Both splits of the factory's data (``seed``: the run's, which the factory is called with)."""
    factory = data_config.factory
    make = import_factory(factory)
    buffer = data_config.shuffle_buffer or SHUFFLE_BUFFER
    splits = {
        split: StreamSplit(make, factory, split, seed, data_config.options or {}, data_config.shuffle, buffer)
        for split in ("train", "test")
    }
    if len(splits["train"]) == 0:
        raise DataError(f"data.factory={factory!r} gave no training examples: split 'train' must hold at least one")
    import tensorflow as tf

    first_input = tf.nest.flatten(splits["train"].spec[0])[0]
    return Dataset(
        train=splits["train"],
        test=splits["test"],
        input_shape=tuple(first_input.shape),
        class_names=(),
        source=f"python {factory}",
    )
