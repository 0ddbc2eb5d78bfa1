"""The check of an image folder before training: every file decoded once, in parallel, and remembered.

Decoding is what finds a truncated or corrupt file, so the check decodes each
file with training's own decoder (here: the one of training, the check and
predict). That is the slow part of a large folder's start (a million files),
so it runs on every core (a parallel tf.data map) and its outcome is
remembered per file: (path, size, mtime, result), where the result is the
decoded height and width, or "does not decode". A file whose size and mtime
(ns) are what they were when it was checked is not decoded again; a changed,
new or moved-back file is.

Two memories, both read, both validated file by file in the same way:

- ``MANIFEST`` in the run directory: what a resume needs, whatever happened to
  the cache. Only the run's writer writes it (``Checked.save``), after it holds
  the run directory's lock.
- a cache keyed by the folder (its resolved path and the channels decoded),
  under ``$ACCUM_TRAIN_CACHE`` (default ``$XDG_CACHE_HOME/accum-train`` or
  ``~/.cache/accum-train``): what a new run on an unchanged folder needs. Any
  process may write it; it is written whole under a fresh name and renamed,
  so readers see the old one or the new one.

A file the check could not read (permissions, gone) is never remembered: a
chmod does not change the mtime. A file modified in the same clock tick as
its check started could change unseen, so an entry is trusted only if the
file's mtime is older than the check that made it (git's "racily clean"
rule). A memory that cannot be read (damaged, another format) is ignored, and
its files are checked again: the memories can only save time, never decide.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files import atomic_write, user_cache
from .base import scaled, untuned

MANIFEST = "image-checks.npz"  # in a run directory
CACHE_ENV = "ACCUM_TRAIN_CACHE"
FORMAT = 1
UNDECODED = -1  # height and width of a file that does not decode
FIELDS = ("path", "size", "mtime_ns", "checked_ns", "height", "width")


def cache_dir() -> Path:
    """Where the per-folder memories live: $ACCUM_TRAIN_CACHE, else the XDG cache folder."""
    return Path(os.environ[CACHE_ENV]) if os.environ.get(CACHE_ENV) else user_cache()


def cache_file(root: Path, channels: int) -> Path:
    key = hashlib.sha256(os.fsencode(root.resolve()) + b"\0" + str(channels).encode()).hexdigest()[:32]
    return cache_dir() / "image-checks" / f"{key}.npz"


@dataclass
class Checked:
    """The outcome of checking a folder's files (``check``)."""

    sizes: np.ndarray  # [n, 2] int32 (height, width) per file in the order given; UNDECODED where it failed
    problems: dict[int, str]  # index -> what is wrong with that file, as a reader would say it
    remembered: int  # files not decoded again: unchanged since a check remembered them
    decoded: int  # files decoded now
    seconds: float
    manifest: bytes = field(repr=False)  # what is remembered now, encoded (a run keeps this, not a dict per file)
    cache_problem: str | None = None  # why the cache could not be written (the run goes on without it)

    def line(self) -> str:
        """One line for the start of a run."""
        n = len(self.sizes)
        said = (
            f"checked {n} image files in {self.seconds:.1f} s: {self.decoded} decoded, "
            f"{self.remembered} unchanged since their last check"
        )
        if self.cache_problem:
            said += f" (the check's cache was not written: {self.cache_problem}; set {CACHE_ENV} to a writable folder)"
        return said

    def save(self, run_dir: Path) -> None:
        """The run directory's manifest (the writer calls this once it holds the lock)."""
        atomic_write(Path(run_dir) / MANIFEST, self.manifest)


def check(root: Path, paths: np.ndarray, channels: int, run_dir: Path | None = None, parallel=None) -> Checked:
    """Check ``paths`` (bytes, each under ``root``): decode what no memory vouches for, remember the outcome.

    ``run_dir``: a run directory whose manifest may vouch for files (a resume);
    ``parallel``: files decoded at once (None: as many as tf.data sees fit, on
    every core). Writes the folder's cache when anything changed."""
    started, started_ns = time.perf_counter(), time.time_ns()
    root = Path(root)
    prefix = os.fsencode(root) + b"/"
    relative = [p[len(prefix) :] if p.startswith(prefix) else p for p in paths.tolist()]
    cache = cache_file(root, channels)
    cached, cached_bytes = _read(cache, root, channels)
    known = {**cached, **(_read(Path(run_dir) / MANIFEST, root, channels)[0] if run_dir is not None else {})}

    sizes = np.full((len(paths), 2), UNDECODED, np.int32)
    stats, unknown = [], []
    for i, (path, rel) in enumerate(zip(paths.tolist(), relative)):
        try:
            st = os.stat(path)
        except OSError:
            stats.append(None)
            unknown.append(i)  # the decode below says why it cannot be read
            continue
        stats.append((st.st_size, st.st_mtime_ns))
        entry = known.get(rel)
        if entry is not None and entry[:2] == stats[-1] and entry[1] < entry[2]:
            sizes[i] = entry[3:]  # unchanged since a check that began after its last change
        else:
            unknown.append(i)

    unknown = np.asarray(unknown, np.int64)
    if len(unknown):
        sizes[unknown] = decode_sizes(paths[unknown], channels, parallel)
    problems, checked_now = {}, set(unknown.tolist())
    for i in np.flatnonzero((sizes == UNDECODED).any(axis=1)).tolist():
        if i not in checked_now:
            problems[i] = UNDECODABLE  # remembered as not decoding, and unchanged since
            continue
        what, size = problem(paths[i], channels)  # the parallel pass drops a failure's reason: find it
        if what is None:  # it decodes now (the failure was not the file's, e.g. memory): keep its size
            sizes[i] = size
        else:
            problems[i] = what

    # What is remembered from now on: this folder's files only, each as it is now.
    wanted = set(relative)
    entries = {rel: entry for rel, entry in known.items() if rel in wanted}
    for i in checked_now:
        if stats[i] is None or problems.get(i) not in (None, UNDECODABLE):  # it could not be read
            entries.pop(relative[i], None)  # never remembered: a chmod keeps the mtime
        else:
            entries[relative[i]] = (*stats[i], started_ns, *sizes[i].tolist())
    # unchanged: the cache's own bytes are the manifest (encoding a large folder's again costs seconds)
    manifest = cached_bytes if entries == cached else _encoded(entries, root, channels)
    cache_problem = None if entries == cached else _write_cache(cache, manifest)
    return Checked(
        sizes=sizes,
        problems=problems,
        remembered=len(paths) - len(unknown),
        decoded=len(unknown),
        seconds=time.perf_counter() - started,
        manifest=manifest,
        cache_problem=cache_problem,
    )


# ----------------------------------------------------------------------------
# Decoding: TensorFlow's ``decode_image``, the one decoder of training, the check and predict


def decode_uint8(contents, channels: int):
    """Encoded PNG/JPEG bytes -> uint8 [h, w, channels]: the one decoder of training, the check and predict."""
    import tensorflow as tf

    return tf.io.decode_image(contents, channels=channels, expand_animations=False)


def decode(contents, input_shape):
    """Encoded PNG/JPEG bytes (a string tensor) -> float32 [H, W, C] in [0, 1]; graph-safe."""
    import tensorflow as tf

    height, width, channels = input_shape
    image = decode_uint8(contents, channels)  # uint8 [h, w, C]
    at_size = tf.reduce_all(tf.equal(tf.shape(image)[:2], [height, width]))
    # An image at the size is converted as an .npz's uint8 array is (scaled), to the same bits: a kept split
    # (uint8 in memory) and a streamed one then train alike, and so does the same array in an .npz. Any other
    # is resized bilinearly, without antialiasing, as image_dataset_from_directory does.
    image = tf.cond(
        at_size,
        lambda: scaled(image),
        lambda: tf.image.resize(image, (height, width), method="bilinear") / 255.0,
    )
    return tf.ensure_shape(image, input_shape)


def decode_files(paths, input_shape, as_stored: bool = False):
    """Files ``paths`` (a string tensor [n]) read and decoded in a loop in the graph: float32 [n, H, W, C] as
    ``decode`` gives them, or with ``as_stored`` the uint8 images themselves (every one must be at the size)."""
    import tensorflow as tf

    if as_stored:
        one = lambda path: tf.ensure_shape(decode_uint8(tf.io.read_file(path), input_shape[2]), input_shape)  # noqa: E731
    else:
        one = lambda path: decode(tf.io.read_file(path), input_shape)  # noqa: E731
    spec = tf.TensorSpec(input_shape, tf.uint8 if as_stored else tf.float32)
    return tf.map_fn(one, paths, fn_output_signature=spec)


UNDECODABLE = "is not a readable PNG or JPEG image (truncated or corrupt)"


def decoded_size(path, channels: int):
    """(height, width) of one file as training decodes it; graph-safe."""
    import tensorflow as tf

    return tf.shape(decode_uint8(tf.io.read_file(path), channels))[:2]


def decode_sizes(paths: np.ndarray, channels: int, parallel=None) -> np.ndarray:
    """[n, 2] decoded sizes, UNDECODED for a file that cannot be read or decoded; every file tried.

    Parallel tf.data maps (their threads run on every core), failures dropped
    by ``ignore_errors`` and known by their missing index. First BATCH files
    per map call, decoded in a loop inside the graph: per file, tf.data's own
    cost is larger than a small PNG's decode: on 50,000 small PNGs this took
    about half the CPU time of one file per call (measured once, while
    developing it, not kept as a benchmark). A batch with a bad
    file fails whole, so its files are tried again one per map call."""
    sizes = np.full((len(paths), 2), UNDECODED, np.int32)
    _fill(sizes, np.arange(len(paths)), paths, channels, parallel, BATCH)
    again = np.flatnonzero((sizes == UNDECODED).any(axis=1))
    if len(again):
        _fill(sizes, again, paths[again], channels, parallel, 1)
    return sizes


BATCH = 256  # files per map call of the check's first pass


def _fill(sizes: np.ndarray, indices: np.ndarray, paths: np.ndarray, channels: int, parallel, batch: int) -> None:
    import tensorflow as tf

    def sizes_of(index, path):
        if batch == 1:
            return index, decoded_size(path, channels)
        size = tf.TensorSpec([2], tf.int32)
        return index, tf.map_fn(lambda one: decoded_size(one, channels), path, fn_output_signature=size)

    examples = tf.data.Dataset.from_tensor_slices((indices.astype(np.int64), paths))
    steps = (
        (examples.batch(batch) if batch > 1 else examples)
        .map(sizes_of, num_parallel_calls=parallel or tf.data.AUTOTUNE, deterministic=False)  # order: by index
        .ignore_errors()
    )
    steps = (steps if batch > 1 else steps.batch(1024)).prefetch(2)  # to Python in blocks, not file by file
    for index, size in untuned(steps):
        sizes[index.numpy()] = size.numpy()


def problem(path: bytes, channels: int):
    """(what is wrong with one file, as training would meet it, or None; its decoded size if it decodes)."""
    import tensorflow as tf

    try:
        contents = Path(os.fsdecode(path)).read_bytes()
    except OSError as err:
        return f"cannot be read ({err.strerror})", None
    try:
        image = decode_uint8(contents, channels)
    except tf.errors.OpError:
        return UNDECODABLE, None
    return None, image.shape[:2]


# ----------------------------------------------------------------------------
# The memories on disk: one .npz of equal-length arrays, one row per file


def _encoded(entries: dict, root: Path, channels: int) -> bytes:
    rows = sorted(entries.items())
    columns = list(zip(*[(rel, *entry) for rel, entry in rows])) if rows else [[]] * len(FIELDS)
    arrays = {
        "path": np.array(columns[0], dtype=bytes),
        **{name: np.array(column, np.int64) for name, column in zip(FIELDS[1:4], columns[1:4])},
        **{name: np.array(column, np.int32) for name, column in zip(FIELDS[4:], columns[4:])},
    }
    buffer = io.BytesIO()
    header = {"format": np.int64(FORMAT), "root": np.array(os.fsencode(root.resolve())), "channels": np.int64(channels)}
    np.savez_compressed(buffer, **header, **arrays)
    return buffer.getvalue()


def _read(path: Path, root: Path, channels: int) -> tuple[dict, bytes]:
    """(the entries a memory holds for this folder and channels, its bytes); ({}, b"") if it is missing,
    damaged or another's."""
    try:
        contents = path.read_bytes()
        with np.load(io.BytesIO(contents), allow_pickle=False) as stored:
            if (
                int(stored["format"]) != FORMAT
                or bytes(stored["root"]) != os.fsencode(root.resolve())
                or int(stored["channels"]) != channels
            ):
                return {}, b""
            columns = [stored[name].tolist() for name in FIELDS]
    except Exception:  # any unreadable memory (truncated, not an .npz, old keys) is no memory
        return {}, b""
    if len({len(column) for column in columns}) != 1:
        return {}, b""
    return {row[0]: tuple(row[1:]) for row in zip(*columns)}, contents


def _write_cache(path: Path, manifest: bytes) -> str | None:
    """Write the folder's cache whole; the reason it could not be (the run goes on), or None."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, manifest)  # a unique temporary name: processes checking one folder at once are safe
    except OSError as err:
        return f"{err.strerror or err} ({err.filename or path})"
    return None
