"""What every dataset gives the training loop: two splits, the input shape,
the class count and the class names.

A split is read by index. ``batches(order, batch_size)`` streams the examples
in a given order through tf.data, converted to float32 images
``[b, *input_shape]`` in [0, 1] (uint8 is scaled by 1/255, float is taken as
it is) and int32 labels; ``take(indices)`` gives one such batch at once. The
order is the caller's (a pure function of seed and epoch), so a resumed run
sees the same batches. ``ArraySplit`` holds its arrays in memory (and
``batches`` gives a tf.data.Dataset); ``image_folder.FileSplit`` holds only
paths and streams from disk (its ``batches`` is an iterable of the same
(x, y) batches). Callers only iterate what ``batches`` returns.

TensorFlow is imported only inside the methods: loading and checking
Fashion-MNIST or an .npz (which the ``--workers`` supervisor does) needs none
of it; checking an image folder decodes every file with TensorFlow's decoder,
the one training uses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import DataError


def scaled(x):
    """uint8 -> float32 in [0, 1], v / 255 exactly as the division rounds it (numpy's float32 v / 255): a batch
    must give the same bits wherever it is converted (the pipeline, or the update's micro-step).

    In a graph, grappler turns a division by a constant into a product with its reciprocal, an ulp off for some
    v; it leaves DivNoNan (which divides, the divisor being non-zero) alone. A 256-entry table gathered per
    pixel was exact too, but cost 1.2 ms of an 8 ms update of batch 500 (profiled)."""
    import tensorflow as tf

    return tf.math.divide_no_nan(tf.cast(x, tf.float32), tf.constant(255.0))


def untuned(dataset):
    """``dataset`` with tf.data's autotuning and static rewrites off, as every pipeline here is iterated (a map
    without ``num_parallel_calls`` then runs one call at a time: the rewrites parallelised it). Autotuning runs a
    thread per iterator, and in TensorFlow 2.21 an iterator's teardown often waits for that thread's next scheduled
    wake-up (the waits seen end where a schedule doubling from 10 ms would): measured, about 1 s of idle wait at
    the end of half of the 1.5-s ``fit`` calls of benchmarks/peers_masked.py, none with autotuning off. Buffers
    stay as each pipeline sets them (``prefetch``), and a parallelism left at AUTOTUNE runs at min(16, CPU cores)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    # tf.data's static rewrites copy every tensor a pipeline's functions capture, the stored split among them
    # (``stored``), each time an iterator is made: a second training set at every epoch's start, measured
    options.experimental_optimization.apply_default_optimizations = False
    return dataset.with_options(options)


def as_is(function):
    """A tf.data map function traced as written: AutoGraph's conversion, which it needs for Python control flow
    over tensors (these have none), was most of the time to make a pipeline (about 50 ms for a run's feed each
    epoch and 90 ms for the scores' batches on a 2-core CPU, profiled)."""
    import tensorflow as tf

    return tf.autograph.experimental.do_not_convert(function)


ALIGNMENT = 64  # bytes: what TensorFlow's kernels take every buffer to be aligned to (a CPU kernel given less aborts)
NUMBERS = "biufc"  # the numpy kinds DLPack hands over (``stored``); strings are copied


def in_place(array, copy: bool = False) -> np.ndarray:
    """``array`` as TensorFlow can read it where it lies (``stored``): C-ordered, writable (DLPack exports no
    read-only array) and aligned to ``ALIGNMENT``. The array itself when it is so already, else (or with ``copy``:
    an array the caller does not own) one copy that is."""
    array = np.asarray(array)
    if not copy and array.flags.c_contiguous and array.flags.writeable and array.ctypes.data % ALIGNMENT == 0:
        return array
    placed = aligned_empty(array.shape, array.dtype)
    placed[...] = array
    return placed


def aligned_empty(shape, dtype) -> np.ndarray:
    """np.empty, in place for TensorFlow (``in_place``) from the start: a loader that fills it holds no second copy."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def stored(array, copy: bool = False):
    """An array as tf.data gathers from it: once, in host memory. Numbers are read where they lie (DLPack: the
    tensor is the numpy array's buffer, ``in_place``), so a split's numpy array and what tf.data gathers from are
    one copy, outside TensorFlow's allocator, as on a GPU; strings are copied once. ``copy``: a copy of numbers
    too, for an array that is not ours (a user's may change after). A pipeline that captures the tensor must be
    ``untuned``, or its rewrite copies it."""
    import tensorflow as tf

    array = np.asarray(array)
    if array.dtype.kind not in NUMBERS or array.size == 0:
        with tf.device("CPU:0"):
            return tf.constant(array)
    return tf.experimental.dlpack.from_dlpack(in_place(array, copy).__dlpack__())


def to_inputs(images, labels):
    """Images [n,H,W] or [n,H,W,C], uint8 or float -> float32 [n,H,W,C]; labels -> int32."""
    import tensorflow as tf

    x = tf.cast(to_values(images), tf.float32)
    if x.shape.rank == 3:
        x = x[..., tf.newaxis]
    return x, tf.cast(labels, tf.int32)


def to_values(x):
    """Inputs of any task: uint8 scaled by 1/255 to float32 (images, as to_inputs), float64 as float32,
    everything else (float32, float16, integer ids) as given."""
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    if x.dtype == tf.uint8:
        return scaled(x)
    return tf.cast(x, tf.float32) if x.dtype == tf.float64 else x


def each(function, structure):
    """``function`` of an array, or of each array of a dict of them by name (a model with several inputs or
    outputs)."""
    if isinstance(structure, dict):
        return {name: function(array) for name, array in structure.items()}
    return function(structure)


def _number_in_place(array):
    """``in_place`` for an array of numbers; others (strings, None) as they are."""
    return in_place(array) if array is not None and np.asarray(array).dtype.kind in NUMBERS else array


def first_array(structure) -> np.ndarray:
    """The array, or the first array of a dict of them (a split's example count is its length)."""
    return next(iter(structure.values())) if isinstance(structure, dict) else structure


def described(structure, one=lambda a: {"dtype": str(a.dtype), "shape": list(a.shape[1:])}) -> dict:
    """``one`` of an array ({"dtype", "shape" per example}); {"arrays": {name: that}} of a dict of them."""
    if isinstance(structure, dict):
        return {"arrays": {name: described(array, one) for name, array in structure.items()}}
    return one(structure)


def _zeros(stored: dict):
    if "arrays" in stored:
        return {name: _zeros(one) for name, one in stored["arrays"].items()}
    return np.zeros((0, *stored["shape"]), stored["dtype"])


class TaskSplit:
    """A split of any task held in memory: inputs ``x``, targets ``y`` (any shape and dtype the loss takes;
    each an array, or a dict of arrays by input and output name) and optional per-example ``weights``.
    Batches are (x, y) or, with weights, (x, (y, weights)): the engine hands the second to the loss as it is."""

    targets_as_given = True  # the loss takes the targets as they come (not class labels)

    def __init__(self, x, y, weights: np.ndarray | None = None):
        # in place once here: ``tensors`` then reads these very arrays (a read-only or unaligned array, as a
        # loader's np.frombuffer gives, would be copied there and held twice)
        self.x, self.y, self.weights = each(_number_in_place, x), each(_number_in_place, y), _number_in_place(weights)
        self._tensors = None

    def __len__(self) -> int:
        return len(first_array(self.y))

    def head(self, n: int) -> TaskSplit:
        return self.subset(slice(0, n))

    def subset(self, indices) -> TaskSplit:
        """Examples ``indices`` (or a slice of them)."""
        rows = lambda a: a[indices]  # noqa: E731
        return TaskSplit(
            each(rows, self.x), each(rows, self.y), None if self.weights is None else self.weights[indices]
        )

    def take(self, indices: np.ndarray):
        """Examples ``indices`` as one batch, converted as ``convert`` converts a gathered one."""
        stored = (self.x, self.y) if self.weights is None else (self.x, self.y, self.weights)
        return self.convert(tuple(each(lambda a: a[indices], part) for part in stored))

    def tensors(self):
        """(x, y) or (x, y, weights) as stored, once, in host memory (what tf.data gathers from)."""
        import tensorflow as tf

        if self._tensors is None:
            parts = (self.x, self.y) if self.weights is None else (self.x, self.y, self.weights)
            self._tensors = tf.nest.map_structure(stored, parts)
        return self._tensors

    def gather(self, indices):
        """Examples ``indices`` (a tensor) as stored: (x, y) or (x, y, weights); ``convert`` makes the batch."""
        import tensorflow as tf

        return tf.nest.map_structure(lambda t: tf.gather(t, indices), self.tensors())

    @staticmethod
    def convert(stored):
        """What ``gather`` gave, (x, y) or (x, y, weights), as the update takes it (inside its micro-step): (inputs,
        targets) or (inputs, (targets, sample weights)); ``x`` and ``y`` tensors, or dicts of them by name."""
        import tensorflow as tf

        x, y, *weights = stored
        y = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32) if t.dtype == tf.float64 else t, y)
        x = tf.nest.map_structure(to_values, x)
        return x, (y if not weights else (y, tf.cast(weights[0], tf.float32)))

    def batches(self, order: np.ndarray, batch_size: int):
        """The batches in ``order``: gathered and converted on the tf.data side from one copy in TF memory
        (``tensors``)."""
        import tensorflow as tf

        self.tensors()  # made here, eagerly: not inside the map's graph
        indices = tf.data.Dataset.from_tensor_slices(np.asarray(order, np.int64)).batch(batch_size)
        # One batch made at a time and one waiting: a whole batch is the one input the update holds that
        # grows with batch_size (its activations follow the micro-batch), so the pipeline keeps no more
        # of them than it must. AUTOTUNE's parallel map with prefetch(2) held up to four (measured).
        return untuned(indices.map(as_is(lambda idx: self.convert(self.gather(idx)))).prefetch(1))

    def stored(self) -> dict:
        """The arrays' dtypes and shapes per example, as stored (run.json's data keeps them: a run is rebuilt
        from them without its data)."""
        return {"x": described(self.x), "y": described(self.y), "weights": self.weights is not None}

    @classmethod
    def empty(cls, stored: dict) -> TaskSplit:
        """No examples, of the dtypes and shapes ``stored`` recorded."""
        weights = np.zeros((0,), np.float32) if stored["weights"] else None
        return cls(_zeros(stored["x"]), _zeros(stored["y"]), weights)

    def signature(self):
        """(x spec, y spec) of a batch as the update takes it."""
        import tensorflow as tf

        x, y = self.take(np.arange(0))
        return tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), (x, y))


class ArraySplit(TaskSplit):
    """Images and their class labels held in memory: a TaskSplit of x images and y labels whose batches are
    converted as ``to_inputs`` converts them (float32 images in [0, 1], int32 labels)."""

    targets_as_given = False  # class labels, for the built-in loss

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        if len(images) != len(labels):  # loaders check this with a user-facing message first
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        super().__init__(images, labels)

    images = property(lambda self: self.x)
    labels = property(lambda self: self.y)

    def subset(self, indices) -> ArraySplit:
        return ArraySplit(self.x[indices], self.y[indices])

    @staticmethod
    def convert(stored):
        return to_inputs(*stored)


@dataclass(frozen=True)
class Dataset:
    """A loaded, verified dataset."""

    train: ArraySplit
    test: ArraySplit
    input_shape: tuple[int, ...]  # of one example as the model sees it, channels last: (H, W, C)
    class_names: tuple[str, ...]
    source: str
    validation: ArraySplit | None = None  # data.validation: held out of the training split
    file_checks: object = None  # image_folder: the check of its files (image_check.Checked), for the run directory
    # the model it was loaded for (rundir.ModelSource): an .npz's targets are read as that model's loss takes them
    for_model: object = None

    # The validation choice is fixed (not drawn from the run's seed): runs that differ in their seed
    # are compared on the same examples.
    VALIDATION_SEED = 20260101

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def classification(self) -> bool:
        """Images and integer class labels (the built-in loss); otherwise a task of a Keras loss (TaskSplit)."""
        return not getattr(self.train, "targets_as_given", False)

    def signature(self):
        """(x spec, y spec) of a training batch as the update takes it."""
        import tensorflow as tf

        if not self.classification:
            return self.train.signature()
        return tf.TensorSpec([None, *self.input_shape], tf.float32), tf.TensorSpec([None], tf.int32)

    def limited(self, train_limit: int | None, test_limit: int | None) -> Dataset:
        """The first N examples of each split (data.train_limit, data.test_limit)."""
        return replace(
            self,
            train=self.train.head(train_limit) if train_limit else self.train,
            test=self.test.head(test_limit) if test_limit else self.test,
        )

    def with_validation(self, n: int) -> Dataset:
        """Hold ``n`` training examples out as the validation split: a fixed random choice, so that a
        file ordered by class gives a validation split of every class. Both keep the file's order."""
        if n == 0:
            return self
        if n >= len(self.train):
            raise DataError(
                f"data.validation={n} leaves no training examples of the {len(self.train)} there are: lower it"
            )
        held = np.zeros(len(self.train), bool)
        held[np.random.default_rng(self.VALIDATION_SEED).permutation(len(self.train))[:n]] = True
        return replace(
            self, train=self.train.subset(np.flatnonzero(~held)), validation=self.train.subset(np.flatnonzero(held))
        )

    def describe(self) -> dict:
        """What a trained model needs to know of its data (a run's data in run.json)."""
        described = {
            "source": self.source,
            "input_shape": list(self.input_shape),
            "class_names": list(self.class_names),
            "task": "classification" if self.classification else "keras_loss",
            **({} if self.classification else {"stored": self.train.stored()}),
            "train_examples": len(self.train),
            "test_examples": len(self.test),
        }
        if self.validation is not None:
            described["validation_examples"] = len(self.validation)
        return described
