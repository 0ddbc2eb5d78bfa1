"""Your own data: an .npz and a folder of images, trained end to end through the CLI.

The data is a slice of the real Fashion-MNIST (2000 train / 500 test) written by
scripts/make_own_data.py. Checked with numbers: each format reaches an accuracy
floor; the image folder and the same images as an .npz train to the same
weights; an interrupted image_folder run resumes to the uninterrupted one; the
folder is read batch by batch from disk, never held. Bad data: one exact line,
exit code 2, nothing written.
"""

import json
import os
import signal
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from accum_train.cli.main import main
from accum_train.config import load_config
from accum_train.datasets import load, npz
from accum_train.datasets.base import ArraySplit
from accum_train.datasets.image_folder import FileSplit, read_image
from accum_train.errors import DataError, Interrupted
from accum_train.from_config.lifecycle import train
from click.testing import CliRunner
from helpers import InterruptAt, iterated_autotuning, load_file, max_difference
from PIL import Image

# smoke.yaml on the whole slice: 2000 / 64 = 31 full updates and a short one of 16 per epoch; 3 epochs,
# 96 updates, as many as smoke.yaml's own run (BatchNorm's moving statistics need about that many).
WHOLE_SLICE = ["data.train_limit=null", "data.test_limit=null", "epochs=3", "log_every=1"]
FOLDER_SETS = ["data.name=image_folder", "data.channels=1", *WHOLE_SLICE]


def load_script(repo_root):
    return load_file(repo_root / "scripts" / "make_own_data.py", "make_own_data")


def run(repo_root, out, sets):
    args = ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)]
    for item in sets:
        args += ["--set", item]
    return CliRunner().invoke(main, args)


def weights(run_dir):
    return dict(np.load(run_dir / "weights.npz"))


@pytest.fixture(scope="module")
def own_data(tmp_path_factory, repo_root, data_dir):
    out = tmp_path_factory.mktemp("own")
    counts = load_script(repo_root).write(out, 2000, 500, str(data_dir))
    assert counts == {"train": 2000, "test": 500}
    return out


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory, repo_root, own_data):
    out = tmp_path_factory.mktemp("runs") / "folder"
    result = run(repo_root, out, [*FOLDER_SETS, f"data.path={own_data / 'images'}"])
    assert result.exit_code == 0, result.output
    return out


def test_script_writes_the_same_examples_twice(own_data, data_dir):
    from accum_train.datasets import fashion_mnist

    real = fashion_mnist.load(str(data_dir), train_limit=2000, test_limit=500, allow_download=False)
    arrays = np.load(own_data / "fashion.npz")
    np.testing.assert_array_equal(arrays["x_train"], real.train.images)
    np.testing.assert_array_equal(arrays["y_test"], real.test.labels)
    assert arrays["class_names"].tolist()[:3] == ["T-shirt_top", "Trouser", "Pullover"]
    # PNG is lossless: train example 1234 comes back bit for bit from its class folder
    label = int(real.train.labels[1234])
    png = own_data / "images" / "train" / arrays["class_names"][label] / "01234.png"
    np.testing.assert_array_equal(np.asarray(Image.open(png)), real.train.images[1234])
    assert sum(1 for _ in (own_data / "images" / "test").rglob("*.png")) == 500


def test_folder_classes_are_sorted_and_interleaved(own_data):
    cfg = load_config(
        None,
        [
            "data.name=image_folder",
            f"data.path={own_data / 'images'}",
            "data.train_limit=30",
            "batch_size=10",
            "data.keep_decoded=false",  # the paths, in the scan's order
        ],
    )
    data = load(cfg.data)
    assert data.class_names == (
        "Ankle_boot",
        "Bag",
        "Coat",
        "Dress",
        "Pullover",
        "Sandal",
        "Shirt",
        "Sneaker",
        "T-shirt_top",
        "Trouser",
    )
    assert (data.input_shape, len(data.train), len(data.test)) == ((28, 28, 3), 30, 500)
    # the first file of every class, then the second...: a limit keeps the classes balanced
    assert data.train.labels.tolist() == list(range(10)) * 3
    # class Ankle_boot's first file is Fashion-MNIST's first ankle boot (label 9), then Bag's (label 8)
    labels = np.load(own_data / "fashion.npz")["y_train"]
    firsts = [f"{np.flatnonzero(labels == label)[0]:05d}.png" for label in (9, 8)]
    assert [os.path.basename(os.fsdecode(p)) for p in data.train.paths[:2]] == firsts


def test_image_folder_run_learns(folder_run):
    summary = json.loads((folder_run / "summary.json").read_text())
    # 10 classes: chance is 0.1; 96 updates of the smoke net reach 0.644 (deterministic on CPU)
    assert (summary["steps"], summary["examples_seen"]) == (96, 6000)
    assert summary["test_accuracy"] >= 0.55
    described = json.loads((folder_run / "run.json").read_text())["data"]
    assert (described["input_shape"], described["train_examples"], described["test_examples"]) == (
        [28, 28, 1],
        2000,
        500,
    )
    assert described["class_names"][:2] == ["Ankle_boot", "Bag"]


def test_npz_uint8_trains_to_the_image_folder_weights(tmp_path, repo_root, own_data, folder_run):
    """The same images as uint8 [N, 28, 28] in the folder's order: the same run, bit for bit."""
    folder = load(load_config(None, FOLDER_SETS[:2] + [f"data.path={own_data / 'images'}"]).data)
    assert isinstance(folder.train, ArraySplit)  # keep_decoded null: 2,500 small images fit in memory
    arrays = {}
    for split, part in (("train", folder.train), ("test", folder.test)):
        x, y = part.take(np.arange(len(part)))
        arrays[f"x_{split}"] = np.round(x.numpy()[..., 0] * 255).astype(np.uint8)
        arrays[f"y_{split}"] = y.numpy()
    np.savez(tmp_path / "same.npz", **arrays, class_names=np.array(folder.class_names))
    result = run(repo_root, tmp_path / "npz", ["data.name=npz", f"data.path={tmp_path / 'same.npz'}", *WHOLE_SLICE])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "npz" / "summary.json").read_text())
    folder_summary = json.loads((folder_run / "summary.json").read_text())
    assert summary["test_accuracy"] >= 0.55
    # the same bits: the folder's images at their size are converted as the .npz's uint8 arrays are
    assert summary["test_accuracy"] == folder_summary["test_accuracy"]
    assert max_difference(weights(tmp_path / "npz"), weights(folder_run)) == 0
    assert json.loads((tmp_path / "npz" / "run.json").read_text())["data"]["class_names"] == list(folder.class_names)


def test_npz_float_rgb_32x32_with_the_mlp(tmp_path, repo_root, own_data):
    """float32 [N, 32, 32, 3], labels [N, 1] as keras' cifar10 has them: the mlp flattens any shape."""
    arrays = dict(np.load(own_data / "fashion.npz"))
    for split in ("train", "test"):
        gray = np.pad(arrays[f"x_{split}"], ((0, 0), (2, 2), (2, 2))).astype(np.float32) / 255
        arrays[f"x_{split}"] = np.stack([gray, 0.5 * gray, 1 - gray], axis=-1)
        arrays[f"y_{split}"] = arrays[f"y_{split}"].astype(np.int64)[:, None]
    np.savez(tmp_path / "rgb.npz", **arrays)
    out = tmp_path / "run"
    result = run(repo_root, out, ["data.name=npz", f"data.path={tmp_path / 'rgb.npz'}", "model.name=mlp", *WHOLE_SLICE])
    assert result.exit_code == 0, result.output
    described = json.loads((out / "run.json").read_text())["data"]
    assert (described["input_shape"], described["class_names"][0]) == ([32, 32, 3], "T-shirt_top")
    assert weights(out)["hidden/weights"].shape == (32 * 32 * 3, 256)
    # chance is 0.1; measured 0.830
    assert json.loads((out / "summary.json").read_text())["test_accuracy"] >= 0.7


@pytest.mark.slow  # 2 runs and a resume from disk
@pytest.mark.parametrize("stop_at", [40])  # mid-way through epoch 2 of 3
def test_image_folder_resume_equals_the_uninterrupted_run(tmp_path, repo_root, own_data, folder_run, stop_at):
    """Read from disk batch by batch, stopped and resumed: the weights of the uninterrupted run, which kept the
    decoded images in memory (data.keep_decoded null, as they fit), bit for bit."""
    sets = [*FOLDER_SETS, f"data.path={own_data / 'images'}", "data.keep_decoded=false"]
    cfg = load_config(repo_root / "configs" / "smoke.yaml", sets)
    with pytest.raises(Interrupted) as stop:
        train(cfg, tmp_path / "cut", progress=InterruptAt(stop_at))
    assert (stop.value.step, stop.value.signum) == (stop_at, signal.SIGINT)
    resumed = train(cfg, tmp_path / "cut", resume=True)
    assert resumed["steps"] == 96
    assert max_difference(weights(tmp_path / "cut"), weights(folder_run)) == 0
    full = json.loads((folder_run / "summary.json").read_text())
    assert resumed["test_accuracy"] == full["test_accuracy"]


# ----------------------------------------------------------------------------
# Decoding: one function for training and predict


def write_png(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def tiny_folder(root, classes=("a", "b", "c"), per_class=6, size=(6, 6)):
    """Class c's i-th image is filled with 10 * (3 * i + c) + 5: every file tells which it is."""
    for split in ("train", "test"):
        for c, name in enumerate(classes):
            for i in range(per_class):
                write_png(root / split / name / f"{i:02d}.png", np.full(size, 10 * (3 * i + c) + 5, np.uint8))
    return root


def folder_data(root, *sets):
    return load(load_config(None, ["data.name=image_folder", f"data.path={root}", *sets]).data)


def test_decode_is_the_same_in_batches_take_and_read_image(tmp_path):
    rng = np.random.default_rng(0)
    gray = rng.integers(0, 256, (10, 7), dtype=np.uint8)
    color = rng.integers(0, 256, (9, 12, 3), dtype=np.uint8)
    write_png(tmp_path / "d" / "train" / "a" / "gray.png", gray)
    write_png(tmp_path / "d" / "train" / "b" / "color.png", color)
    for name in ("a", "b"):
        write_png(tmp_path / "d" / "test" / name / "x.png", gray)
    data = folder_data(tmp_path / "d", "data.image_size=[8, 10]", "data.channels=3")
    assert data.input_shape == (8, 10, 3)
    x, y = next(iter(data.train.batches(np.array([1, 0]), 2)))
    assert y.numpy().tolist() == [1, 0]
    # bilinear resize of the uint8 image, scaled by 1/255; a gray image is repeated into RGB
    expected_color = tf.image.resize(color, (8, 10)).numpy() / 255
    expected_gray = np.repeat(tf.image.resize(gray[..., None], (8, 10)).numpy() / 255, 3, axis=-1)
    assert np.max(np.abs(x.numpy()[0] - expected_color)) < 1e-6
    assert np.max(np.abs(x.numpy()[1] - expected_gray)) < 1e-6
    np.testing.assert_array_equal(data.train.take(np.array([1, 0]))[0].numpy(), x.numpy())
    for row, name in ((0, "b/color.png"), (1, "a/gray.png")):
        np.testing.assert_array_equal(read_image(tmp_path / "d" / "train" / name, (8, 10, 3)), x.numpy()[row])
    # predict's images of any size go through the same resize
    assert read_image(tmp_path / "d" / "train" / "a" / "gray.png", (20, 14, 1)).shape == (20, 14, 1)


def test_a_folder_is_decoded_and_batched_with_autotuning_off(tmp_path, monkeypatch):
    # autotuning's thread can hold an iterator's teardown until its next wake-up (datasets.base.untuned)
    tiny_folder(tmp_path / "d")
    seen = iterated_autotuning(monkeypatch)
    kept, streamed = (folder_data(tmp_path / "d", f"data.keep_decoded={keep}") for keep in ("true", "false"))
    for split in (kept.train, streamed.train):
        assert sum(len(y) for _, y in split.batches(np.arange(18), 8)) == 18
    assert seen == [False] * 5  # the check (done once), the kept folder decoded (train, test), each split's batches


@pytest.mark.parametrize(
    "sizes, image_size, stored",
    [
        ([(6, 5), (6, 5)], "null", np.uint8),  # every image at the size: kept as uint8, scaled as an .npz's
        ([(6, 5), (9, 4)], "[6, 5]", np.float32),  # one resized: the split kept as decode's float32
        ([(7, 7), (3, 8)], "[6, 5]", np.float32),
    ],
)
def test_a_kept_split_gives_the_bits_of_the_streamed_one(tmp_path, sizes, image_size, stored):
    rng = np.random.default_rng(1)
    for split in ("train", "test"):
        for name, size in zip("ab", sizes):
            for i in range(3):
                write_png(tmp_path / "d" / split / name / f"{i}.png", rng.integers(0, 256, size, dtype=np.uint8))
    sets = ["data.channels=1", f"data.image_size={image_size}"]
    kept, streamed = (folder_data(tmp_path / "d", *sets, f"data.keep_decoded={keep}") for keep in ("true", "false"))
    assert isinstance(kept.train, ArraySplit) and isinstance(streamed.train, FileSplit)
    assert kept.train.images.dtype == stored and kept.train.images.shape == (6, 6, 5, 1)
    order = np.array([5, 0, 3, 1, 4, 2])
    for a, b in zip(kept.train.batches(order, 4), streamed.train.batches(order, 4)):
        np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
        np.testing.assert_array_equal(a[1].numpy(), b[1].numpy())
    np.testing.assert_array_equal(kept.test.take(order)[0].numpy(), streamed.test.take(order)[0].numpy())
    if stored == np.uint8:  # and the bits of the same uint8 array in an .npz
        arrays = ArraySplit(kept.train.images, kept.train.labels)
        np.testing.assert_array_equal(arrays.take(order)[0].numpy(), streamed.train.take(order)[0].numpy())


@pytest.mark.parametrize(
    "keep, files, as_stored, available, kept",
    [
        ("null", (2, 2), (True, True), 4 * (2 + 2) * 6 * 5, True),  # uint8: 4 images of 30 bytes, a quarter
        ("null", (2, 2), (True, True), 4 * (2 + 2) * 6 * 5 - 1, False),
        ("null", (2, 2), (True, False), 4 * (2 + 2 * 4) * 6 * 5, True),  # a resized split takes float32
        ("null", (2, 2), (True, False), 4 * (2 + 2 * 4) * 6 * 5 - 1, False),
        ("true", (2, 2), (True, True), 0, True),
        ("false", (2, 2), (True, True), 10**12, False),
    ],
)
def test_keep_decoded_null_keeps_what_takes_a_quarter_of_the_memory(keep, files, as_stored, available, kept):
    from accum_train.datasets import image_folder

    data = load_config(None, ["data.name=image_folder", "data.path=d", f"data.keep_decoded={keep}"]).data
    splits = dict(zip(("train", "test"), zip(files, as_stored)))
    with mock.patch.object(image_folder, "available_memory", return_value=available):
        assert image_folder._keeps(data.keep_decoded, (6, 5, 1), splits) is kept


def test_available_memory_is_the_kernel_s_figure():
    from accum_train.datasets.image_folder import available_memory

    meminfo = Path("/proc/meminfo").read_text().splitlines()
    line = next(line for line in meminfo if line.startswith("MemAvailable:"))
    assert 0 < available_memory() <= int(line.split()[1]) * 1024 * 1.1  # the kernel's, or a lower cgroup limit


def test_a_file_broken_before_it_is_kept_is_named(tmp_path):
    root = tiny_folder(tmp_path / "d")
    split = folder_data(root, "data.channels=1", "data.keep_decoded=false").train
    removed = os.fsdecode(split.paths[7])
    os.unlink(removed)
    with pytest.raises(DataError) as err:
        split.decoded(as_stored=True)
    assert str(err.value) == (
        f"{removed} cannot be read (No such file or directory); it was fine when it was checked a moment before: "
        f"restore it and run again"
    )


@pytest.mark.parametrize(
    "setup, message",
    [
        ("missing", "cannot read {p}: No such file or directory"),
        ("truncated", "{p} is not a readable PNG or JPEG image (truncated or corrupt): pass a PNG or JPEG file"),
        (
            "channels",
            "the model takes images of 2 channels: only 1 (grayscale) or 3 (RGB) can be decoded from {p}; "
            "pass the images as an .npz array instead",
        ),
    ],
)
def test_read_image_errors_name_the_file(tmp_path, setup, message):
    path = tmp_path / "x.png"
    if setup != "missing":
        write_png(path, np.zeros((4, 4), np.uint8))
        path.write_bytes(path.read_bytes()[:-20] if setup == "truncated" else path.read_bytes())
    with pytest.raises(DataError) as err:
        read_image(path, (4, 4, 2 if setup == "channels" else 1))
    assert str(err.value) == message.format(p=path)


def test_image_folder_is_read_from_disk_batch_by_batch(tmp_path, monkeypatch):
    """The split holds paths and labels only; a file is read when its chunk of CHUNK files comes (here one
    chunk per batch), not before."""
    from accum_train.datasets import image_folder

    monkeypatch.setattr(image_folder, "CHUNK", 4)
    root = tiny_folder(tmp_path / "d")
    data = folder_data(root, "data.channels=1", "data.keep_decoded=false")
    split = data.train
    assert isinstance(split, FileSplit) and set(vars(split)) == {"paths", "labels", "input_shape"}
    assert split.paths.dtype.kind == "S" and len(split) == 18
    order = np.arange(18)
    # After the check: one file replaced by another image, one removed.
    changed, removed = os.fsdecode(split.paths[13]), os.fsdecode(split.paths[17])
    write_png(tmp_path / "new.png", np.full((6, 6), 250, np.uint8))
    os.replace(tmp_path / "new.png", changed)
    os.unlink(removed)
    seen = []
    with pytest.raises(DataError) as err:
        for x, _ in split.batches(order, 4):
            seen.append(np.round(x.numpy()[:, 0, 0, 0] * 255).astype(int).tolist())
    assert str(err.value) == (
        f"{removed} cannot be read (No such file or directory); it was fine when the run "
        f"started: restore it, then resume the run with --resume"
    )
    # batches 0-3 came out (files 0-15), each file as it was when its batch was read; file 17 is in batch 4.
    # Interleaved order: file k is image k // 3 of class k % 3, filled with 10 * k + 5.
    expected = [10 * k + 5 for k in range(16)]
    expected[13] = 250
    assert seen == [expected[i : i + 4] for i in range(0, 16, 4)]


@pytest.mark.parametrize("file", [0, 17])  # the first micro-batch's, and one of the last update's
def test_a_file_removed_during_training_is_named_by_the_update_that_reads_it(tmp_path, file):
    """The update pulls its micro-batches, decoded in the pipeline as it goes: a file gone since the check stops
    the run with the DataError that names it, at the update whose micro-batch holds it."""
    root = tiny_folder(tmp_path / "d")
    sets = [
        "data.channels=1",
        "data.keep_decoded=false",
        "model.name=mlp",
        "model.hidden=8",
        "batch_size=6",
        "subdivisions=2",
    ]
    cfg = load_config(None, ["data.name=image_folder", f"data.path={root}", *sets, "epochs=1", "data.shuffle=false"])
    data = load(cfg.data)
    removed = os.fsdecode(data.train.paths[file])
    os.unlink(removed)
    with pytest.raises(DataError) as err:
        train(cfg, tmp_path / "run", data=data)
    assert str(err.value) == (
        f"{removed} cannot be read (No such file or directory); it was fine when the run "
        f"started: restore it, then resume the run with --resume"
    )


def test_a_file_broken_in_a_chunk_that_spans_two_batches_is_named(tmp_path, monkeypatch):
    """Files are decoded CHUNK at a time, then cut into batches: a chunk's failure can come while the batch
    before the file's own is built, and the file is still named."""
    from accum_train.datasets import image_folder

    data = folder_data(tiny_folder(tmp_path / "d"), "data.channels=1", "data.keep_decoded=false")
    monkeypatch.setattr(image_folder, "CHUNK", 3)  # chunks 0-2, 3-5, ...; batches 0-3, 4-7, ...
    removed = os.fsdecode(data.train.paths[5])  # batch 1, in chunk 3-5, which batch 0 needs
    os.unlink(removed)
    with pytest.raises(DataError) as err:
        for _ in data.train.batches(np.arange(18), 4):
            pass
    assert str(err.value) == (
        f"{removed} cannot be read (No such file or directory); it was fine when the run "
        f"started: restore it, then resume the run with --resume"
    )


# ----------------------------------------------------------------------------
# Bad data: one exact line, exit 2, nothing written


def small_arrays():
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.integers(0, 256, (8, 4, 4), dtype=np.uint8),
        "y_train": np.arange(8) % 4,
        "x_test": rng.integers(0, 256, (4, 4, 4), dtype=np.uint8),
        "y_test": np.arange(4),
    }


def npz_case(change, *sets):
    def build(d):
        arrays = small_arrays()
        change(arrays)
        np.savez(d / "data.npz", **arrays)
        return ["data.name=npz", f"data.path={d / 'data.npz'}", *sets], d / "data.npz"

    return build


def npz_file(write):
    """A data.path written by write(path) instead of numpy.savez."""

    def build(d):
        write(d / "data.npz")
        return ["data.name=npz", f"data.path={d / 'data.npz'}"], d / "data.npz"

    return build


def npy_instead(path):
    with open(path, "wb") as f:  # numpy.save(name) would add .npy to the name
        np.save(f, small_arrays()["x_train"])


def truncated_npz(path):
    np.savez(path, **small_arrays())
    path.write_bytes(path.read_bytes()[:300])


def put(key, value):
    return lambda arrays: arrays.__setitem__(key, value(arrays) if callable(value) else value)


def with_nan(arrays):
    arrays["x_test"] = arrays["x_test"].astype(np.float32) / 255
    arrays["x_test"][2, 1, 3] = np.nan


def with_inf(arrays):
    arrays["x_train"] = arrays["x_train"].astype(np.float64)
    arrays["x_train"][3, 0, 0] = -np.inf


def folder_case(change, *sets):
    def build(d):
        root = tiny_folder(d / "images", classes=("a", "b"), per_class=2, size=(4, 4))
        path = change(root)
        return ["data.name=image_folder", f"data.path={root}", *sets], path

    return build


def empty_class(root):
    (root / "train" / "c").mkdir()
    (root / "test" / "c").mkdir()
    return root / "train" / "c"


def without_test_class_b(root):
    for png in (root / "test" / "b").iterdir():
        png.unlink()
    (root / "test" / "b").rmdir()
    return root


def truncated(name):
    def change(root):
        path = root / "train" / "b" / name
        if name.endswith(".jpg"):
            Image.fromarray(np.full((4, 4, 3), 99, np.uint8)).save(path, format="JPEG")
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
        return path

    return change


def no_test_folder(root):
    os.rename(root / "test", root / "val")
    return root


def only_other_files(root):
    for split in ("train", "test"):
        (root / split / "c").mkdir()
    (root / "train" / "c" / "notes.txt").write_text("not an image")
    write_png(root / "test" / "c" / "00.png", np.zeros((4, 4), np.uint8))
    return root / "train" / "c"


def folder_path_is_a_file(d):
    (d / "images.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    return ["data.name=image_folder", f"data.path={d / 'images.zip'}"], d / "images.zip"


def odd_size(root):
    write_png(root / "test" / "a" / "02.png", np.zeros((5, 4), np.uint8))
    return root / "test" / "a" / "02.png"


HOW_TO_SAVE = npz.HOW_TO_SAVE
BAD_DATA = [
    # (id, how to build it in folder d: (sets, the path the message names), expected line after "error: ")
    (
        "npz_missing_key",
        npz_case(lambda a: a.pop("x_test")),
        "{p} has no x_test (it has x_train, y_train, y_test): data.name=npz needs x_train, y_train, x_test, "
        "y_test; save them with " + HOW_TO_SAVE,
    ),
    (
        "npz_wrong_ndim",
        npz_case(put("x_train", lambda a: a["x_train"].reshape(8, 16))),
        "{p}: x_train has shape (8, 16) (2 dimensions): images must be [N, H, W] or [N, H, W, C]; reshape it, "
        "e.g. x_train.reshape(N, H, W)",
    ),
    (
        "npz_wrong_dtype",
        npz_case(put("x_train", lambda a: a["x_train"].astype(np.int64))),
        "{p}: x_train has dtype int64: images must be uint8 (0..255, scaled by 1/255) or float (used as it is, "
        "e.g. in [0, 1]); convert it, e.g. x_train.astype('float32') / x_train.max()",
    ),
    (
        "npz_train_length",
        npz_case(put("y_train", lambda a: a["y_train"][:7])),
        "{p}: x_train holds 8 images but y_train 7 labels: each image needs exactly one label",
    ),
    (
        "npz_test_length",
        npz_case(put("x_test", lambda a: a["x_test"][:3])),
        "{p}: x_test holds 3 images but y_test 4 labels: each image needs exactly one label",
    ),
    (
        "npz_negative_label",
        npz_case(put("y_test", np.array([0, 1, -1, 2]))),
        "{p}: y_test[2] is -1: labels must be integers 0..K-1",
    ),
    (
        "npz_label_too_large",
        npz_case(put("y_train", lambda a: np.where(np.arange(8) == 5, 4, a["y_train"])), "data.num_classes=4"),
        "{p}: y_train[5] is 4, but data.num_classes=4: labels must be 0..3; raise data.num_classes or fix the label",
    ),
    ("npz_nan", npz_case(with_nan), "{p}: x_test[2] has NaN: float images must be finite; fix or drop that example"),
    (
        "npz_object_array",
        npz_case(put("y_train", np.array([0, 1, "2", None, 0, 1, 2, 3], dtype=object))),
        "{p}: y_train is an object array (pickled Python objects), which is never loaded (allow_pickle=False: "
        "loading it could run code); save plain numeric arrays, e.g. y_train=numpy.asarray(y_train, dtype='uint8')",
    ),
    (
        "npz_float_labels",
        npz_case(put("y_train", lambda a: a["y_train"].astype(np.float32))),
        "{p}: y_train has dtype float32: labels must be integers 0..K-1; convert with y_train.astype('int64')",
    ),
    (
        "npz_shapes_differ",
        npz_case(put("x_test", np.zeros((4, 4, 4, 3), np.uint8))),
        "{p}: x_test holds 4x4x3 images but x_train 4x4x1: both splits need one image shape",
    ),
    (
        "npz_channels_first",
        npz_case(put("x_train", np.zeros((8, 3, 5, 5), np.uint8))),
        "{p}: x_train has shape (8, 3, 5, 5), which looks channels-first: images must be [N, H, W, C] (channels "
        "last); convert with numpy.moveaxis(x_train, 1, -1)",
    ),
    (
        "npz_inf",
        npz_case(with_inf),
        "{p}: x_train[3] has an infinite value: float images must be finite; fix or drop that example",
    ),
    (
        "npz_class_names_short",
        npz_case(put("class_names", np.array(["a", "b", "c"]))),
        "{p}: y_train[3] is 3, but class_names lists 3 names: labels must be 0..2; add names to class_names or fix "
        "the label",
    ),
    (
        "npz_not_a_zip",
        npz_file(lambda path: path.write_bytes(b"hello world")),
        "{p} is not an .npz file (it starts with 68656c6c, not the zip signature 504b0304): write it with "
        + HOW_TO_SAVE,
    ),
    (
        "npz_is_npy",
        npz_file(npy_instead),
        "{p} is a single .npy array, not an .npz archive: write it with " + HOW_TO_SAVE,
    ),
    (
        "npz_truncated",
        npz_file(truncated_npz),
        "{p} is not a readable .npz file (File is not a zip file): it is truncated or damaged; write it again with "
        + HOW_TO_SAVE,
    ),
    (
        "npz_missing_file",
        npz_file(lambda path: None),
        "data.path={p} does not exist: give the .npz file, written with " + HOW_TO_SAVE,
    ),
    (
        "folder_empty_class",
        folder_case(empty_class),
        "{p} holds no .png, .jpg or .jpeg file: add the class's images or remove the folder",
    ),
    (
        "folder_class_mismatch",
        folder_case(without_test_class_b),
        "{p}/test has no class folder 'b', which {p}/train has: train and test need the same class folders",
    ),
    (
        "folder_truncated_png",
        folder_case(truncated("01.png")),
        "{p} is not a readable PNG or JPEG image (truncated or corrupt): replace or remove it",
    ),
    (
        "folder_truncated_jpeg",
        folder_case(truncated("02.jpg")),
        "{p} is not a readable PNG or JPEG image (truncated or corrupt): replace or remove it",
    ),
    (
        "folder_wrong_size",
        folder_case(odd_size),
        "{p} is 5x4 but {d}/images/train/a/00.png is 4x4: with data.image_size null every image must have one "
        "size; set data.image_size to resize them all, e.g. [4, 4]",
    ),
    (
        "folder_only_other_files",
        folder_case(only_other_files),
        "{p} holds no .png, .jpg or .jpeg file (only other files, e.g. notes.txt): add the class's images or remove "
        "the folder",
    ),
    (
        "folder_is_a_file",
        folder_path_is_a_file,
        "data.path={p} is a file, not a folder: for data.name=image_folder images go in DIR/train/CLASS/*.png and "
        "DIR/test/CLASS/*.png (or .jpg, .jpeg); an .npz file is data.name=npz",
    ),
    (
        "folder_no_test",
        folder_case(no_test_folder),
        "data.path={p} has no test folder: images go in DIR/train/CLASS/*.png and DIR/test/CLASS/*.png "
        "(or .jpg, .jpeg)",
    ),
]


def tree(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_size if p.is_file() else -1) for p in folder.rglob("*"))


@pytest.mark.parametrize("build, message", [c[1:] for c in BAD_DATA], ids=[c[0] for c in BAD_DATA])
def test_bad_data_is_one_line_exit_2_nothing_written(tmp_path, repo_root, build, message):
    d = tmp_path / "d"
    d.mkdir()
    sets, named = build(d)
    before = tree(tmp_path)
    out = tmp_path / "out"
    result = run(repo_root, out, sets)
    assert result.exit_code == 2, result.output
    assert result.stderr == "error: " + message.format(p=named, d=d) + "\n"
    assert not out.exists()
    assert tree(tmp_path) == before


CONFIG_CASES = [
    (["data.name=npz"], "--set: data.name=npz needs data.path (e.g. data: {name: npz, path: mydata.npz})"),
    (
        ["data.path=x.npz"],
        "--set: data.path is only for data.name=npz or image_folder, not fashion_mnist: "
        "Fashion-MNIST's folder is data.dir; for your own data set data.name to npz or image_folder",
    ),
    (
        ["data.name=npz", "data.path=x.npz", "data.dir=d"],
        "--set: data.dir is only for data.name=fashion_mnist, not npz: give the .npz file as data.path",
    ),
    (
        ["data.name=image_folder", "data.path=d", "data.image_size=[28]"],
        "--set: data.image_size=[28] must be a list of two integers >= 1, e.g. [28, 28]",
    ),
    (
        ["data.name=image_folder", "data.path=d", "data.image_size=32"],
        "--set: data.image_size=32 must be a list of two integers >= 1, e.g. [28, 28]",
    ),
    (
        ["data.name=image_folder", "data.path=d", "data.image_size=[0, 28]"],
        "--set: data.image_size=[0, 28] must be a list of two integers >= 1, e.g. [28, 28]",
    ),
    (
        ["data.name=image_folder", "data.path=d", "data.channels=4"],
        "--set: data.channels=4 must be 1 (grayscale) or 3 (RGB)",
    ),
    (
        ["data.name=image_folder", "data.path=d", "data.num_classes=5"],
        "--set: data.num_classes is only for data.name=npz, not image_folder: the classes are the folder's class "
        "folders",
    ),
    (
        ["data.name=npz", "data.path=x.npz", "data.image_size=[28, 28]"],
        "--set: data.image_size is only for data.name=image_folder, not npz: an .npz's images are used at their "
        "own size",
    ),
    (
        ["data.name=npz", "data.path=x.npz", "data.keep_decoded=true"],
        "--set: data.keep_decoded is only for data.name=image_folder, not npz: an .npz's arrays are held in "
        "memory already",
    ),
    (
        ["data.name=image_folder", "data.path=d", "data.keep_decoded=maybe"],
        "--set: data.keep_decoded='maybe' must be true or false",
    ),
    (
        ["data.name=npz", "data.path=x.npz", "data.num_classes=1"],
        "--set: data.num_classes=1 must be >= 2 and <= 1000000",
    ),
]


@pytest.mark.parametrize("sets, message", CONFIG_CASES, ids=[f"config{i}" for i in range(len(CONFIG_CASES))])
def test_bad_data_keys_are_config_errors(tmp_path, repo_root, sets, message):
    out = tmp_path / "out"
    result = run(repo_root, out, sets)
    assert result.exit_code == 2
    assert result.stderr == "error: " + message + "\n"
    assert not out.exists()


def test_config_yaml_keeps_image_size(tmp_path):
    cfg = load_config(None, ["data.name=image_folder", "data.path=d", "data.image_size=[32, 24]"])
    assert cfg.data.image_size == (32, 24)
    (tmp_path / "c.yaml").write_text(cfg.to_yaml())
    assert load_config(tmp_path / "c.yaml") == cfg


def test_a_relative_path_is_read_from_the_working_directory_else_beside_the_config(tmp_path, monkeypatch):
    """data.path and model.path as a config file names them: from the working directory first (as --set gives
    them), else from the config file's folder; found in neither, as given."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    for folder in (project, elsewhere):
        folder.mkdir()
    (project / "mine.npz").write_bytes(b"")
    (project / "net.keras").write_bytes(b"")
    (elsewhere / "net.keras").write_bytes(b"")  # the working directory's wins
    config = project / "config.yaml"
    config.write_text("data: {name: npz, path: mine.npz}\nmodel: {name: keras_file, path: net.keras}\n")
    monkeypatch.chdir(elsewhere)
    cfg = load_config(config)
    assert (cfg.data.path, cfg.model.path) == (str(project / "mine.npz"), str(elsewhere / "net.keras"))
    assert load_config(config, ["data.path=gone.npz"]).data.path == "gone.npz"


def test_a_relative_data_path_is_recorded_absolute_so_the_run_reads_from_anywhere(tmp_path, repo_root, monkeypatch):
    """data.path relative to the working directory the run started in: config.yaml records it absolute, and
    evaluate from another working directory reads the same file (a path that does not exist stays as given)."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "data").mkdir(parents=True)
    elsewhere.mkdir()
    rng = np.random.default_rng(0)
    arrays = {f"x_{s}": rng.random((n, 8, 8), dtype=np.float32) for s, n in (("train", 64), ("test", 16))}
    arrays.update({f"y_{s}": rng.integers(0, 3, n) for s, n in (("train", 64), ("test", 16))})
    np.savez(project / "data" / "mine.npz", **arrays)
    monkeypatch.chdir(project)
    assert load_config(None, ["data.name=npz", "data.path=data/missing.npz"]).data.path == "data/missing.npz"
    sets = ["data.name=npz", "data.path=data/mine.npz", "model.name=mlp", "epochs=1"]
    result = run(repo_root, project / "run", sets)
    assert result.exit_code == 0, result.output
    assert load_config(project / "run" / "config.yaml").data.path == str(project / "data" / "mine.npz")
    monkeypatch.chdir(elsewhere)
    evaluated = CliRunner().invoke(main, ["evaluate", str(project / "run")])
    assert evaluated.exit_code == 0, evaluated.output
    summary = json.loads((project / "run" / "summary.json").read_text())
    result = json.loads((project / "run" / "evaluate" / "evaluate.json").read_text())
    assert result["test_loss"] == pytest.approx(summary["test_loss"], rel=1e-6)
