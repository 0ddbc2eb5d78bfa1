"""The run's feed (accum/trainer/data/feed.py): the update pulls its micro-batches from the input pipeline, stored as
they are (uint8) until its micro-step converts them, and gets the bits it got from the batch held whole; the memory
of an update follows the micro-batch, not the batch."""

import json
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train.config import load_config
from accum_train.datasets.python import StreamSplit
from accum_train.from_config.build import build_run, load_data
from accum_train.trainer.data.batching import micro_bounds
from accum_train.trainer.data.conversion import kind
from accum_train.trainer.data.order import epoch_order
from accum_train.trainer.data.reader import plan
from accum_train.trainer.data.timeline import Segment
from accum_train.trainer.store.rundir import CheckpointPolicy, RunDirectory
from helpers import iterated_autotuning


@pytest.mark.parametrize(
    "n, k, replicas, local, chunk_first, size",
    [
        (64, 4, 1, (0,), False, 16),
        (64, 5, 1, (0,), False, None),  # ragged: 12-13
        (3, 5, 1, (0,), False, 1),  # a short batch: 3 micro-batches of 1
        (10, 4, 2, (0, 1), False, None),  # mirrored: each share of 5 as 4
        (16, 4, 2, (0, 1), False, 2),  # mirrored: each share of 8 as 4 micro-batches of 2
        (3, 4, 2, (0, 1), False, None),  # shares of 2 and 1: 2 pulls, replica 1's second micro-batch empty
        (10, 4, 2, (1,), False, None),  # the second worker's replica only (its own elements: sizes 1 and 2)
        (17, 4, 2, (0,), False, None),  # the first worker's are all 2, the second's 2 and 3: both trace for none
        (16, 4, 2, (1,), False, 2),
        (10, 3, 2, (0, 1), True, None),  # a stream: each micro-step's chunk shared by the replicas
        (8, 2, 2, (1,), True, None),  # a stream may end short of its nominal batch: never a size
    ],
)
def test_the_layout_cuts_every_batch_once_in_pull_order(n, k, replicas, local, chunk_first, size):
    layout = plan([Segment(0, 0, 0, 2 * n, n)], lambda batch: k, replicas, local, chunk_first)
    pulls = min(k, -(-n // replicas))
    assert [(u.step, u.n, u.pulls, u.k) for u in layout.updates] == [(0, n, pulls, k), (1, n, pulls, k)]
    assert [u.size for u in layout.updates] == [size, size]  # what the update is traced for (feed.sized)
    assert len(layout.starts) == 2 * pulls * len(local)
    for step in (0, 1):
        mine = layout.where[:, 0] == step
        starts, ends = layout.starts[mine] - step * n, layout.ends[mine] - step * n
        assert list(layout.where[mine, 1]) == list(starts)  # where: the element's first row in its batch
        expected = []
        for i in range(pulls):
            for r in local:
                if chunk_first:
                    c0, c1 = micro_bounds(i, n, pulls)
                    s0, s1 = micro_bounds(r, c1 - c0, replicas)
                    expected.append((c0 + s0, c0 + s1))
                else:
                    s0, s1 = micro_bounds(r, n, replicas)
                    m0, m1 = micro_bounds(i, s1 - s0, pulls)
                    expected.append((s0 + m0, s0 + m1))
        assert list(zip(starts, ends)) == expected
        rows = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends)])
        assert len(set(rows)) == len(rows)  # no example twice
        if local == tuple(range(replicas)):
            assert sorted(rows) == list(range(n))  # every example of the batch
        if chunk_first:
            assert list(rows) == sorted(rows)  # a stream is read front to back


def _weights(run):
    return [np.asarray(v) for v in run.model.named_weights().values()]


def _updates_from_feed(cfg, data, steps, start=None):
    """The weights after ``steps`` updates pulled from the feed (``start``: a list given the initial ones)."""
    run = build_run(cfg, data)
    if start is not None:
        start.extend(_weights(run))
    reader = run.reader()
    for step in range(steps):
        iterator, planned = reader.at(step)
        run.follow_batch(planned.batch_size)
        run.engine.update_from(iterator, planned.n, planned.pulls, 0, planned.size)
        reader.pulled()
    return _weights(run)


def _updates_from_batches(cfg, data, steps):
    """The batches held whole and converted before the update, as the loop ran them before the feed."""
    run = build_run(cfg, data)
    order = epoch_order(cfg.seed, 0, len(data.train), cfg.data.shuffle)
    for step in range(steps):
        x, y = data.train.take(order[step * cfg.batch_size : (step + 1) * cfg.batch_size])
        run.engine.update(run.augment.rows(x, step, len(order[step * cfg.batch_size : (step + 1) * cfg.batch_size])), y)
    return _weights(run)


@pytest.mark.parametrize(
    "overrides",
    [
        ["subdivisions=5", "parallel_micro_steps=1"],  # ragged micro-batches of 12-13, BatchNorm
        ["subdivisions=4", "parallel_micro_steps=2", "data.augment.crop=2", "data.augment.flip=true"],
        pytest.param(
            ["subdivisions=8", "parallel_micro_steps=2", "model.norm=none", "data.train_limit=3000", "epochs=1"],
            marks=pytest.mark.slow,
        ),
        ["subdivisions=1"],  # one micro-batch: pulled, it skips the caches (engine.py); held, it goes through them
    ],
)
def test_an_update_from_the_feed_gets_the_bits_of_the_batch_held_whole(repo_root, overrides):
    # thread pools as the suite's process has them; both paths in this process, the same ops on the same values
    cfg = load_config(repo_root / "configs" / "smoke.yaml", overrides)
    data = load_data(cfg)
    start = []
    fed, held = _updates_from_feed(cfg, data, 4, start), _updates_from_batches(cfg, data, 4)
    assert all(np.array_equal(a, b) for a, b in zip(fed, held))
    assert not any(np.array_equal(a, b) for a, b in zip(fed[:1], start[:1]))  # the updates moved the weights


def test_k_is_the_subdivisions_a_restored_checkpoint_holds(repo_root, tmp_path):
    """The engine keeps k on the host (``Accumulator.k``, read once per change): a new k is read at once, and a
    run that read k before restoring a checkpoint of another k reads the checkpoint's."""
    cfg = load_config(repo_root / "configs" / "smoke.yaml", ["subdivisions=2"])
    data = load_data(cfg)
    saved = build_run(cfg, data)
    assert saved.subdivisions == 2
    saved.engine.set_subdivisions(4)  # as subdivisions: auto's probe or a retry after running out of memory
    assert saved.subdivisions == 4
    kept_in(tmp_path, saved).save(1)
    run = build_run(cfg, data)
    assert run.subdivisions == 2
    kept_in(tmp_path, run).restore(print)
    assert (run.subdivisions, run.k_for(cfg.batch_size), run.engine.k) == (4, 4, 4)


def kept_in(path, run) -> RunDirectory:
    """``run``'s checkpoints in ``path``, as lifecycle.train keeps them."""
    directory = RunDirectory(path, True, "", "")
    directory.keep(run.tracked, CheckpointPolicy(keep=1), run.engine, run.noise, run.optional)
    return directory


def test_the_feed_holds_stored_micro_batches(repo_root):
    cfg = load_config(repo_root / "configs" / "smoke.yaml", ["subdivisions=4"])
    data = load_data(cfg)
    run = build_run(cfg, data)
    iterator, planned = run.reader().at(0)
    (images, _), where = next(iterator)
    assert (planned.n, planned.pulls) == (64, 4)
    assert images.dtype == tf.uint8 and images.shape == (16, 28, 28)  # uint8, one micro-batch: not a float batch
    order = epoch_order(cfg.seed, 0, len(data.train))
    np.testing.assert_array_equal(images.numpy(), data.train.images[order[:16]])
    assert list(where.numpy()) == [0, 0]


def _allocated(key="current") -> int:
    return tf.config.experimental.get_memory_info("CPU:0")[key]


@pytest.mark.parametrize(
    "made",
    [
        "read-only",  # as a loader's np.frombuffer gives: DLPack exports no read-only array
        "unaligned",  # a kernel reading a buffer off TensorFlow's 64-byte alignment aborts the process
        "strided",
        "in place",  # already as TensorFlow reads it: kept, not copied
    ],
)
def test_a_split_is_stored_once_where_it_lies_outside_the_allocator(made):
    """The split's numpy array is what tf.data gathers from (one copy, in place, as on a GPU): storing it takes
    nothing from TensorFlow's allocator, nor does making its pipeline again and reading it (as every epoch does)."""
    from accum_train.datasets.base import ALIGNMENT, ArraySplit, in_place

    values = np.random.default_rng(0).integers(0, 256, (20000, 28, 28), dtype=np.uint8)
    given = {
        "read-only": lambda: np.frombuffer(values.tobytes(), np.uint8).reshape(values.shape),
        "unaligned": lambda: np.frombuffer(bytearray(b"\0" + values.tobytes()), np.uint8, offset=1).reshape(
            values.shape
        ),
        "strided": lambda: np.repeat(values, 2, axis=2)[:, :, ::2],
        "in place": lambda: in_place(values.copy()),
    }[made]()
    np.testing.assert_array_equal(given, values)
    before = _allocated()
    split = ArraySplit(given, np.zeros(len(values), np.int32))
    assert (split.images.ctypes.data % ALIGNMENT, split.images.flags.writeable) == (0, True)
    assert (split.images is given) == (made == "in place")
    images, _ = split.tensors()
    assert _allocated() - before < values.nbytes / 100  # not in TensorFlow's allocator
    split.images[7, 3, 5] = 255 - values[7, 3, 5]  # one buffer: the tensor sees the write
    assert int(tf.gather(images, [7])[0, 3, 5]) == 255 - values[7, 3, 5]
    tf.config.experimental.reset_memory_stats("CPU:0")
    for _ in range(2):  # a pipeline made twice and read through, as two epochs' scores
        for _ in split.batches(np.arange(len(values)), 100):
            pass
    assert _allocated("peak") - before < values.nbytes / 2, (_allocated("peak") - before, values.nbytes)


def test_fit_gathers_from_its_own_copy_of_the_caller_s_arrays():
    """accum_train.fit's arrays are the caller's: an edit of them after fit has stored them (a callback's) is not
    what it trains on, even where the caller's array could be read in place."""
    from accum_train.datasets.base import in_place
    from accum_train.trainer.data.array_feed import ArrayFeed

    x, y = in_place(np.arange(12, dtype=np.float32).reshape(6, 2)), in_place(np.arange(6, dtype=np.int32))
    feed = ArrayFeed(x, y, None, None, batch_size=2, shuffle=False, seed=0, steps_per_epoch=None)
    x[:], y[:] = -1, -1
    gathered_x, gathered_y = feed.gather(tf.constant([0, 5]))
    np.testing.assert_array_equal(gathered_x.numpy(), [[0, 1], [10, 11]])
    np.testing.assert_array_equal(gathered_y.numpy(), [0, 5])


def test_the_update_takes_no_batch_as_input(repo_root):
    """The update's graph gets the feed's iterator and three scalars: no batch (nor micro-batch) is an input."""
    cfg = load_config(repo_root / "configs" / "smoke.yaml", ["subdivisions=4", "parallel_micro_steps=1"])
    run = build_run(cfg, load_data(cfg))
    iterator, planned = run.reader().at(0)
    run.engine.update_from(iterator, planned.n, planned.pulls, 0, planned.size)
    scalars = (tf.constant(v) for v in (64, 4, 0))
    traced = run.engine._update_pulled.get_concrete_function(iterator, *scalars, planned.size)
    inputs = [(t.dtype, t.shape.rank) for t in traced.inputs]
    assert all(dtype == tf.resource or (dtype == tf.int32 and rank == 0) for dtype, rank in inputs), inputs
    assert sum(dtype == tf.int32 for dtype, _ in inputs) == 3  # n, pulls, stop


def test_the_feed_and_the_scores_iterate_their_pipelines_with_autotuning_off(repo_root, monkeypatch):
    # autotuning's thread can hold an iterator's teardown until its next wake-up (datasets.base.untuned)
    cfg = load_config(repo_root / "configs" / "smoke.yaml", ["subdivisions=4"])
    run = build_run(cfg, load_data(cfg))
    seen = iterated_autotuning(monkeypatch)
    iterator, planned = run.reader().at(0)
    run.engine.update_from(iterator, planned.n, planned.pulls, 0, planned.size)
    scores = run.scores()
    assert 0 <= scores["test_accuracy"] <= 1
    assert seen == [False, False]  # the epoch's feed, then the test split's batches


def _in_a_loop(function):
    def looped(x):
        body = lambda i, total: (i + 1, total + function(x))  # noqa: E731
        return tf.while_loop(lambda i, _: i < 1, body, (0, tf.zeros(x.shape, tf.float32)))[1]

    return tf.function(looped)


@pytest.mark.parametrize("where", ["eager", "graph", "loop"])
def test_uint8_images_scale_to_numpy_s_v_over_255_bit_for_bit(where):
    """The micro-step converts stored uint8 images: every value exactly as numpy divides it, in a graph too (where
    grappler would turn a plain division by 255 into a product with its reciprocal, an ulp off)."""
    from accum_train.datasets.base import scaled

    values = np.tile(np.arange(256, dtype=np.uint8), 8).reshape(8, 256)
    run = {"eager": scaled, "graph": tf.function(scaled), "loop": _in_a_loop(scaled)}[where]
    np.testing.assert_array_equal(run(tf.constant(values)).numpy(), values.astype(np.float32) / np.float32(255))


def test_the_scores_make_the_test_batches_once_and_read_them_again(repo_root, monkeypatch):
    """A run scores every epoch: the test split's pipeline is made once per batch size (made anew, it was traced
    again each time), and read again gives the same scores."""
    cfg = load_config(repo_root / "configs" / "smoke.yaml", ["batch_size=256", "subdivisions=2"])
    run = build_run(cfg, load_data(cfg))
    made, real = [], type(run.data.test).batches
    monkeypatch.setattr(type(run.data.test), "batches", lambda split, *a: made.append(a[1]) or real(split, *a))
    first = run.scores()
    assert run.scores() == first and made == [run.eval_batch_size]
    assert made == [256]  # twice the micro-batch of 128
    run.engine.set_subdivisions(4)  # a smaller micro-batch: a smaller evaluation batch, a pipeline of its own
    assert run.scores() == pytest.approx(first, abs=1e-6) and made == [256, 128]


@pytest.mark.slow
def test_the_memory_of_a_run_follows_the_micro_batch_not_the_batch(tmp_path, repo_root):
    """Fresh runs (each its own allocator) at batch 500 and 16000, micro-batches of 500: the same peak, up to two
    micro-batches of stored images that tf.data's prefetch holds or not at the peak's moment (392 KB each: runs
    of either batch differ by one, measured 3.12 and 3.58 MB both ways round). Holding the batch of 16000 would
    show: 12.5 MB as stored (uint8), 50 MB as float32."""
    base = ["model.name=mlp", "model.hidden=32", "micro_batch_size=500", "subdivisions=null", "epochs=1"]
    base += ["parallel_micro_steps=1", "data.train_limit=16000", "data.test_limit=100", "data.augment.crop=0"]
    peaks = {}
    for batch in (500, 16000):
        sets = [arg for setting in [*base, f"batch_size={batch}"] for arg in ("--set", setting)]
        out = tmp_path / str(batch)
        subprocess.run(
            [str(Path(sys.executable).parent / "accum-train"), "run", str(repo_root / "configs" / "fmnist.yaml")]
            + [*sets, "--output-dir", str(out), "--quiet"],
            check=True,
            capture_output=True,
        )
        peaks[batch] = json.loads((out / "summary.json").read_text())["peak_memory_bytes"]
    micro_batch = 500 * 28 * 28  # bytes of one micro-batch of stored (uint8) images
    assert peaks[16000] <= peaks[500] + 2 * micro_batch, peaks
    assert peaks[500] < 50e6, peaks  # the premise: a batch of 16000 held as float32 would more than double it


def test_fit_cuts_a_stream_s_batch_chunk_first_as_the_cli_does():
    """A batch read from accum_train.fit's stream: micro-step i takes the i-th chunk of the batch, shared by the
    replicas (the CLI's stream cut, ``plan(chunk_first=True)``), not each replica's share cut in k."""
    from accum_train.trainer.data.batching import Cut
    from accum_train.trainer.data.stream_feed import DatasetFeed

    rows = tf.data.Dataset.from_tensor_slices(np.arange(8, dtype=np.float32)[:, None]).batch(8)
    feed = DatasetFeed(rows, batch_size=None, class_weight=None, steps_per_epoch=None)
    elements = [data.numpy()[:, 0].tolist() for data, _ in feed.dataset(0, 0, Cut(2, 2, (0, 1)), pad=False)]
    layout = plan([Segment(0, 0, 0, 8, 8)], lambda batch: 2, 2, [0, 1], chunk_first=True)
    assert elements == [list(range(a, b)) for a, b in zip(layout.starts, layout.ends)]
    assert elements == [[0, 1], [2, 3], [4, 5], [6, 7]]  # share first would be [0, 1], [4, 5], [2, 3], [6, 7]


class _LooksConverted:
    """Not a split: it has a ``convert`` (as a PIL image has) but no ``batches``."""

    def convert(self, mode):
        return self


class _Batches(keras.utils.PyDataset):
    def __len__(self):
        return 1

    def __getitem__(self, index):
        return np.zeros((2, 3)), np.zeros(2)


@pytest.mark.parametrize(
    "source, expected",
    [
        (None, None),
        (np.zeros((4, 3)), "arrays"),
        ({"a": np.zeros((4, 3))}, "arrays"),
        (_LooksConverted(), "arrays"),
        (tf.data.Dataset.from_tensor_slices(np.zeros(4)).batch(2), "dataset"),
        (iter([(np.zeros((2, 3)), np.zeros(2))]), "generator"),
        (_Batches(), "pydataset"),
        ("split", "split"),
        ("stream", "stream"),
    ],
    ids=["none", "array", "dict", "has-convert-only", "tf.data", "generator", "pydataset", "split", "stream"],
)
def test_one_dispatch_tells_each_kind_of_source(source, expected):
    if expected in ("split", "stream"):  # a datasets/ split read by index, and a factory's split read as it comes
        cfg = load_config(Path(__file__).resolve().parent.parent / "configs" / "smoke.yaml", ["data.train_limit=64"])
        source = load_data(cfg).train
        if expected == "stream":

            def make(split, epoch, seed):
                return tf.data.Dataset.from_tensor_slices((np.zeros((4, 3), "float32"), np.zeros(4, "float32")))

            source = StreamSplit(make, "test:make", "train", 0, {}, shuffle=False, buffer=1)
    assert kind(source) == expected
