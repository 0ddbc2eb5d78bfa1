"""Your own images: a folder of class folders (``data.name: image_folder``).

Layout: ``DIR/train/CLASS/*.png`` and ``DIR/test/CLASS/*.png`` (also .jpg,
.jpeg, any case; subfolders of a class folder count, names starting with '.'
and other files are ignored). The classes are the sorted names of the class
folders of train, as keras.utils.image_dataset_from_directory has them; test
must have the same ones. Within a split, files are sorted by path and
interleaved by class (the first file of every class, then the second, ...),
so data.train_limit keeps the classes balanced; the training order is still
``epoch_order(seed, epoch)`` over that list.

When the decoded images fit in memory (``data.keep_decoded``; null: when they
take at most a quarter of the memory available), every file is decoded once
as the data loads and the splits are arrays (``ArraySplit``, as an .npz's):
uint8 when every image of a split is at the size, float32 when it is resized.
Otherwise a split holds only paths and labels (``FileSplit``): ``batches`` reads,
decodes and resizes the files CHUNK at a time in a parallel tf.data map, in
the caller's order, and cuts them into batches, so a set larger than memory
trains and a resumed run sees the same batches. Both give the same bits.
Decoding is image_check.py's ``decode`` everywhere (``read_image``'s for
``predict`` too), to ``data.channels`` (null: 3, RGB) and ``data.image_size``.

Before training, every file is decoded once with that same decoder, in
parallel, and the outcome remembered (image_check.py: a file unchanged since
its last check is not decoded again): files that cannot be read or decoded
(truncated, corrupt, not an image) are named in one line, the first in the
folder's order and a count of the others; with ``data.image_size`` null the
first image whose size differs from the first one is. A file that breaks
during the run is named the same way when its batch comes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..defaults import IMAGE_CHANNELS, KEEP_DECODED_SHARE
from ..errors import DataError
from .base import ArraySplit, Dataset, aligned_empty, untuned
from .image_check import UNDECODABLE, check, decode, decode_files, problem

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
CHUNK = 128  # files per map call of the training pipeline
LAYOUT = "images go in DIR/train/CLASS/*.png and DIR/test/CLASS/*.png (or .jpg, .jpeg)"


def load(data_config, run_dir=None) -> Dataset:
    """Scan, limit, check: the Dataset of data.path, with nothing decoded kept.

    ``run_dir``: a run directory whose manifest of checked files may spare
    their decoding (image_check.py)."""
    root = Path(data_config.path)
    channels = data_config.channels or IMAGE_CHANNELS
    _check_root(root)
    classes = _class_folders(root, "train")
    _same_classes(root, classes, _class_folders(root, "test"))
    # The limits are applied before the check: a slice of a large folder is checked, not the folder.
    scanned = {
        split: tuple(array[: limit or None] for array in _scan(root / split, classes))
        for split, limit in (("train", data_config.train_limit), ("test", data_config.test_limit))
    }
    paths = np.concatenate([scanned["train"][0], scanned["test"][0]])
    checked = check(root, paths, channels, run_dir)
    if checked.problems:
        _raise_problems(paths, checked.problems)
    n_train = len(scanned["train"][0])
    sizes = {"train": checked.sizes[:n_train], "test": checked.sizes[n_train:]}
    height, width = data_config.image_size or _common_size(scanned, sizes)
    shape = (int(height), int(width), channels)
    train, test = (FileSplit(*scanned[split], shape) for split in ("train", "test"))
    as_stored = {split: bool((sizes[split] == shape[:2]).all()) for split in sizes}
    if _keeps(data_config.keep_decoded, shape, {split: (len(sizes[split]), as_stored[split]) for split in sizes}):
        train, test = train.decoded(as_stored["train"]), test.decoded(as_stored["test"])
    return Dataset(
        train=train,
        test=test,
        input_shape=shape,
        class_names=tuple(classes),
        source=str(root.resolve()),
        file_checks=checked,
    )


# ----------------------------------------------------------------------------
# Decoding in chunks (image_check.py decodes each file), one file for predict, and the files that fail


def in_chunks(paths: np.ndarray, labels: np.ndarray, input_shape, as_stored: bool = False):
    """A tf.data.Dataset of (images, labels), CHUNK files at a time, ``decode_files``d.

    CHUNK files per map call, decoded in a loop in the graph: per file, tf.data's own cost is larger than a small
    PNG's decode (measured with the check, image_check.decode_sizes). Chunks are decoded in parallel and in order
    (deterministic=True)."""
    import tensorflow as tf

    return (
        tf.data.Dataset.from_tensor_slices((paths, labels))
        .batch(CHUNK)
        .map(
            lambda chunk, chunk_labels: (decode_files(chunk, input_shape, as_stored), chunk_labels),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    )


def read_image(path, input_shape) -> np.ndarray:
    """One image file decoded as training decodes it: float32 [H, W, C] in [0, 1].

    ``input_shape`` is the run's (H, W, C) (run.json's data); any image size is
    resized to H x W, C must be 1 or 3. Raises DataError naming the path."""
    import tensorflow as tf

    height, width, channels = input_shape
    if channels not in (1, 3):
        raise DataError(
            f"the model takes images of {channels} channels: only 1 (grayscale) or 3 (RGB) can be "
            f"decoded from {path}; pass the images as an .npz array instead"
        )
    try:
        contents = Path(path).read_bytes()
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror}") from None
    try:
        return decode(tf.constant(contents), (height, width, channels)).numpy()
    except tf.errors.OpError:
        raise DataError(f"{path} {UNDECODABLE}: pass a PNG or JPEG file") from None


def _raise_problems(paths: np.ndarray, problems: dict[int, str]):
    """The check found bad files: name the first, in the folder's order, and count the others."""
    first, *others = sorted(problems)
    what = problems[first]
    fix = "check its permissions" if what.startswith("cannot be read") else "replace or remove it"
    more = f" ({len(others)} more files fail the check, the next {os.fsdecode(paths[others[0]])})" if others else ""
    raise DataError(f"{os.fsdecode(paths[first])} {what}: {fix}{more}")


RESTORE_AND_RESUME = "it was fine when the run started: restore it, then resume the run with --resume"
RESTORE_AND_RERUN = "it was fine when it was checked a moment before: restore it and run again"


def raise_first_bad(paths: np.ndarray, channels: int, err, fix: str = RESTORE_AND_RESUME):
    """A batch failed during the run (or the decoding of a kept split): name the file that broke since the check."""
    for path in paths:
        what, _ = problem(path, channels)
        if what is not None:
            raise DataError(f"{os.fsdecode(path)} {what}; {fix}")
    # Every file decodes on its own: the failure was not a file's (e.g. out of memory); TF's words, one line.
    message = (getattr(err, "message", "") or str(err)).splitlines()[0]
    raise DataError(
        f"reading the images failed ({message}), although each of the files involved decodes on its own: run again"
    )


# ----------------------------------------------------------------------------
# The folder


def _check_root(root: Path) -> None:
    if not root.exists():
        raise DataError(f"data.path={root} does not exist: for data.name=image_folder it is a folder; {LAYOUT}")
    if not root.is_dir():
        raise DataError(
            f"data.path={root} is a file, not a folder: for data.name=image_folder {LAYOUT}; "
            f"an .npz file is data.name=npz"
        )
    for split in ("train", "test"):
        if not (root / split).is_dir():
            raise DataError(f"data.path={root} has no {split} folder: {LAYOUT}")


def _class_folders(root: Path, split: str) -> list[str]:
    folder = root / split
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    except OSError as err:
        raise DataError(f"cannot read {folder}: {err.strerror}: check its permissions") from None
    if not names:
        raise DataError(
            f"{folder} has no class folders: put each class's images in a folder named after "
            f"the class, e.g. {folder / 'cat' / '0001.png'}"
        )
    return names


def _same_classes(root: Path, train: list[str], test: list[str]) -> None:
    missing, extra = sorted(set(train) - set(test)), sorted(set(test) - set(train))
    for names, test_has, train_has in ((missing, "has no", "has"), (extra, "has a", "lacks")):
        if names:
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            raise DataError(
                f"{root / 'test'} {test_has} class folder {names[0]!r}{more}, which "
                f"{root / 'train'} {train_has}: train and test need the same class folders"
            )


def _scan(split_dir: Path, classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(paths as bytes, int32 labels), sorted by path within a class and interleaved by class."""
    per_class = [_images_of(split_dir / name) for name in classes]
    ranked = sorted((rank, label) for label, files in enumerate(per_class) for rank in range(len(files)))
    paths = np.array([os.fsencode(per_class[label][rank]) for rank, label in ranked])
    return paths, np.array([label for _, label in ranked], np.int32)


def _images_of(folder: Path) -> list[str]:
    found, others = [], []

    def refuse(err):
        raise DataError(f"cannot read {err.filename}: {err.strerror}: check its permissions")

    for parent, subfolders, files in os.walk(folder, onerror=refuse):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        for name in files:
            if not name.startswith("."):
                (found if name.lower().endswith(IMAGE_EXTENSIONS) else others).append(os.path.join(parent, name))
    if not found:
        besides = f" (only other files, e.g. {Path(sorted(others)[0]).name})" if others else ""
        raise DataError(
            f"{folder} holds no .png, .jpg or .jpeg file{besides}: add the class's images or remove the folder"
        )
    return sorted(found)


def _keeps(keep: bool | None, shape: tuple[int, int, int], splits: dict[str, tuple[int, bool]]) -> bool:
    """data.keep_decoded, or for null whether the decoded splits ({split: (files, as stored)}) fit: uint8 for a
    split whose images are all at the size, float32 for one that is resized."""
    if keep is not None:
        return keep
    pixels = int(np.prod(shape))
    needed = sum(files * pixels * (1 if as_stored else 4) for files, as_stored in splits.values())
    return needed <= KEEP_DECODED_SHARE * available_memory()


def available_memory() -> int:
    """Bytes this process could still allocate: the kernel's MemAvailable, less where a cgroup's limit is lower
    (a container); 0 when neither can be read."""
    available = 0
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            available = min(available, max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return available


def _common_size(scanned, sizes) -> tuple[int, int]:
    """The one size of every image (data.image_size null), or a DataError naming the first odd file."""
    first_path, reference = scanned["train"][0][0], tuple(int(n) for n in sizes["train"][0])
    for split in ("train", "test"):
        odd = np.flatnonzero((sizes[split] != reference).any(axis=1))
        if len(odd):
            h, w = (int(n) for n in sizes[split][odd[0]])
            raise DataError(
                f"{os.fsdecode(scanned[split][0][odd[0]])} is {h}x{w} but "
                f"{os.fsdecode(first_path)} is {reference[0]}x{reference[1]}: with data.image_size "
                f"null every image must have one size; set data.image_size to resize them all, "
                f"e.g. [{reference[0]}, {reference[1]}]"
            )
    return reference


# ----------------------------------------------------------------------------
# The split


class FileSplit:
    """A split of image files: paths and labels only; images are read when their batch is."""

    def __init__(self, paths: np.ndarray, labels: np.ndarray, input_shape: tuple[int, int, int]):
        if len(paths) != len(labels):  # the scan makes them together
            raise ValueError(f"{len(paths)} paths but {len(labels)} labels")
        self.paths, self.labels, self.input_shape = paths, labels, tuple(input_shape)

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int) -> FileSplit:
        return self.subset(slice(0, n))

    def subset(self, indices) -> FileSplit:
        return FileSplit(self.paths[indices], self.labels[indices], self.input_shape)

    def take(self, indices: np.ndarray):
        import tensorflow as tf

        indices = np.asarray(indices, np.int64)
        if len(indices) == 0:
            return tf.zeros([0, *self.input_shape], tf.float32), tf.zeros([0], tf.int32)
        return next(iter(self.batches(indices, len(indices))))

    def batches(self, order: np.ndarray, batch_size: int) -> StreamedBatches:
        return StreamedBatches(self, np.asarray(order, np.int64), batch_size)

    def decoded(self, as_stored: bool) -> ArraySplit:
        """Every file decoded once, in order, into memory (data.keep_decoded): uint8 when every image is at the
        size (``as_stored``; converted as ``decode`` converts it), else the float32 images ``decode`` gives."""
        shape = self.input_shape
        images = aligned_empty((len(self), *shape), np.uint8 if as_stored else np.float32)
        if len(self) == 0:
            return ArraySplit(images, self.labels)
        chunks = untuned(in_chunks(self.paths, self.labels, shape, as_stored).prefetch(1))
        done = 0
        for chunk, _ in read_named(chunks, self.paths, range(len(self)), CHUNK, shape[2], RESTORE_AND_RERUN):
            images[done : done + len(chunk)] = chunk.numpy()
            done += len(chunk)
        return ArraySplit(images, self.labels)

    parallel_gather = -1  # tf.data.AUTOTUNE: decoding is the pipeline's work; micro-batches decode side by side

    def gather(self, indices):
        """Examples ``indices`` (a tensor), decoded: (float32 images, int32 labels)."""
        import tensorflow as tf

        images = decode_files(tf.gather(tf.constant(self.paths), indices), self.input_shape)
        return images, tf.gather(tf.constant(self.labels), indices)

    convert = staticmethod(ArraySplit.convert)  # ``gather``'s images and labels, as a split in memory converts them


class StreamedBatches:
    """The batches of a FileSplit in a given order: iterate it for (x, y) tensors; a file that breaks during the
    run is a DataError naming it (``read_named``)."""

    def __init__(self, split: FileSplit, order: np.ndarray, batch_size: int):
        self.split, self.order, self.batch_size = split, order, batch_size

    def __iter__(self):
        split = self.split
        # decoded in chunks (in_chunks), then cut into the caller's batches; one batch waiting, no more (see
        # base.TaskSplit.batches)
        chunks = in_chunks(split.paths[self.order], split.labels[self.order], split.input_shape)
        dataset = untuned(chunks.rebatch(self.batch_size).prefetch(1))
        # the failed chunk may reach into the next batch
        return read_named(dataset, split.paths, self.order, self.batch_size + CHUNK, split.input_shape[2])


def read_named(dataset, paths: np.ndarray, order, ahead: int, channels: int, fix: str = RESTORE_AND_RESUME):
    """(images, labels) of ``dataset``, which decodes ``paths[order]``; when it fails, the first of the next
    ``ahead`` files that fails on its own is named (``raise_first_bad``)."""
    import tensorflow as tf

    iterator, done = iter(dataset), 0
    while True:
        try:
            x, y = next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError as err:
            raise_first_bad(paths[order[done : done + ahead]], channels, err, fix)
        done += int(y.shape[0])
        yield x, y
