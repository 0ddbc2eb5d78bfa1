"""Fashion-MNIST: found, verified by SHA-256 of the decompressed files, and
refused with one exact line when missing, truncated, altered or malformed."""

import gzip
import shutil

import numpy as np
import pytest
from accum_train.cli.main import main
from accum_train.datasets import fashion_mnist as fm
from accum_train.errors import DataError
from click.testing import CliRunner


@pytest.fixture()
def copy_dir(tmp_path, data_dir):
    target = tmp_path / "fm"
    shutil.copytree(data_dir, target)
    return target


def rewrite(path, change):
    raw = bytearray(gzip.decompress(path.read_bytes()))
    change(raw)
    path.write_bytes(gzip.compress(bytes(raw)))


def test_real_data_loads_with_known_facts(data_dir):
    data = fm.load(str(data_dir), allow_download=False)
    assert data.train.images.shape == (60000, 28, 28) and data.test.images.shape == (10000, 28, 28)
    assert data.train.images.dtype == np.uint8
    assert (data.input_shape, data.num_classes, data.class_names[9]) == ((28, 28, 1), 10, "Ankle boot")
    assert int(data.train.labels[0]) == 9  # ankle boot
    assert np.bincount(data.train.labels).tolist() == [6000] * 10
    assert np.bincount(data.test.labels).tolist() == [1000] * 10
    limited = fm.load(str(data_dir), train_limit=1000, test_limit=300, allow_download=False)
    assert (len(limited.train.labels), len(limited.test.labels)) == (1000, 300)
    np.testing.assert_array_equal(limited.train.images, data.train.images[:1000])


def test_lookup_order_config_then_env(tmp_path, data_dir, monkeypatch):
    monkeypatch.setenv("ACCUM_TRAIN_DATA", str(data_dir))
    assert fm.find_data_dir(None, allow_download=False) == data_dir
    monkeypatch.setenv("ACCUM_TRAIN_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DataError) as err:
        fm.find_data_dir(None, allow_download=False)
    assert str(err.value) == f"$ACCUM_TRAIN_DATA={tmp_path / 'nowhere'} does not exist: {fm.HOW_TO_GET}"
    assert fm.find_data_dir(str(data_dir), allow_download=False) == data_dir  # data.dir wins


def altered_pixel(raw):
    raw[5000] ^= 0xFF


def wrong_magic(raw):
    raw[2] = 0x09


def wrong_dims(raw):
    raw[3] = 2


def label_out_of_range(raw):
    raw[8] = 12


# The checksum cases re-compress and hash all 60,000 training images (~12 s each): slow suite.
SLOW = pytest.mark.slow

CASES = [
    pytest.param(
        "train-images-idx3-ubyte",
        altered_pixel,
        "{p} failed its checksum: expected SHA-256 "
        + fm.FILES["train-images-idx3-ubyte"]
        + " of the decompressed file, found {found}; "
        + fm.HOW_TO_GET,
        marks=SLOW,
        id="altered_pixel",
    ),
    (
        "t10k-images-idx3-ubyte",
        wrong_magic,
        "{p} is not an IDX file of unsigned bytes (header starts 00000903, expected 000008..)",
    ),
    ("t10k-labels-idx1-ubyte", wrong_dims, "{p} has 2 dimensions, expected 1"),
    ("train-labels-idx1-ubyte", label_out_of_range, "{p} has label 12; labels must be 0..9"),
]


@pytest.mark.parametrize(
    "name, change, message", CASES, ids=[c.id if hasattr(c, "id") else c[1].__name__ for c in CASES]
)
def test_damaged_file_is_refused_with_exact_message(copy_dir, name, change, message):
    import hashlib

    path = copy_dir / f"{name}.gz"
    rewrite(path, change)
    found = hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest()
    with pytest.raises(DataError) as err:
        fm.load(str(copy_dir), allow_download=False)
    assert str(err.value) == message.format(p=path, found=found)


def test_truncated_gzip(copy_dir):
    path = copy_dir / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DataError) as err:
        fm.load(str(copy_dir), allow_download=False)
    assert str(err.value) == (
        f"{path} is not a complete gzip file (Compressed file ended before the "
        f"end-of-stream marker was reached): the file is truncated or damaged; "
        f"{fm.HOW_TO_GET}"
    )


def test_header_that_lies_about_the_size(copy_dir):
    path = copy_dir / "t10k-labels-idx1-ubyte.gz"
    rewrite(path, lambda raw: raw.__setitem__(slice(4, 8), (20000).to_bytes(4, "big")))
    with pytest.raises(DataError) as err:
        fm.load(str(copy_dir), allow_download=False)
    assert str(err.value) == f"{path}: the header promises shape (20000,) (20008 bytes), the file has 10008"


@pytest.mark.parametrize(
    "setup, message",
    [
        ("missing_one", "data.dir={d} has no t10k-labels-idx1-ubyte.gz: " + fm.HOW_TO_GET),
        ("empty", "data.dir={d} has no train-images-idx3-ubyte.gz (and 3 more missing): " + fm.HOW_TO_GET),
        ("a_file", "data.dir={d} is not a directory: " + fm.HOW_TO_GET),
    ],
)
def test_incomplete_data_dir(tmp_path, data_dir, setup, message):
    d = tmp_path / "fm"
    if setup == "a_file":
        d.write_text("not a folder")
    elif setup == "empty":
        d.mkdir()
    else:
        shutil.copytree(data_dir, d)
        (d / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError) as err:
        fm.load(str(d), allow_download=False)
    assert str(err.value) == message.format(d=d)


@SLOW  # checks all four files of a full copy (~12 s)
def test_cli_refuses_bad_data_before_writing_anything(copy_dir, tmp_path, repo_root):
    rewrite(copy_dir / "train-images-idx3-ubyte.gz", altered_pixel)
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main,
        ["run", str(repo_root / "configs" / "smoke.yaml"), "--set", f"data.dir={copy_dir}", "--output-dir", str(out)],
    )
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {copy_dir}/train-images-idx3-ubyte.gz failed its checksum")
    assert result.stderr.count("\n") == 1
    assert not out.exists()


def truncate(path):
    path.write_bytes(path.read_bytes()[:1000])


def unreadable(monkeypatch, path):
    # Tests run as root, for whom chmod 000 changes nothing: refuse the read instead.
    import pathlib

    real = pathlib.Path.read_bytes

    def read_bytes(self):
        if self == path:
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)


CLI_CASES = [
    # (what to do to the copy of the data, file, expected message after "error: ")
    pytest.param(
        "alter",
        "train-images-idx3-ubyte",
        "{p} failed its checksum: expected SHA-256 "
        + fm.FILES["train-images-idx3-ubyte"]
        + " of the decompressed file, found {found}; "
        + fm.HOW_TO_GET,
        marks=SLOW,
        id="alter",
    ),
    (
        "magic",
        "t10k-images-idx3-ubyte",
        "{p} is not an IDX file of unsigned bytes (header starts 00000903, expected 000008..)",
    ),
    ("dims", "t10k-labels-idx1-ubyte", "{p} has 2 dimensions, expected 1"),
    ("label", "train-labels-idx1-ubyte", "{p} has label 12; labels must be 0..9"),
    (
        "truncate",
        "t10k-labels-idx1-ubyte",
        "{p} is not a complete gzip file (Compressed file ended before the "
        "end-of-stream marker was reached): the file is truncated or damaged; " + fm.HOW_TO_GET,
    ),
    ("unreadable", "train-labels-idx1-ubyte", "cannot read {p}: Permission denied: check its permissions"),
    ("remove", "t10k-images-idx3-ubyte", "data.dir={d} has no t10k-images-idx3-ubyte.gz: " + fm.HOW_TO_GET),
    ("empty", None, "data.dir={d} has no train-images-idx3-ubyte.gz (and 3 more missing): " + fm.HOW_TO_GET),
    ("missing", None, "data.dir={d} does not exist: " + fm.HOW_TO_GET),
    ("file", None, "data.dir={d} is not a directory: " + fm.HOW_TO_GET),
]


@pytest.mark.parametrize(
    "action, name, message", CLI_CASES, ids=[c.id if hasattr(c, "id") else c[0] for c in CLI_CASES]
)
def test_bad_data_through_the_cli(tmp_path, data_dir, monkeypatch, repo_root, action, name, message):
    import hashlib

    d = tmp_path / "fm"
    if action in ("alter", "magic", "dims", "label", "truncate", "unreadable", "remove"):
        shutil.copytree(data_dir, d)
    elif action == "empty":
        d.mkdir()
    elif action == "file":
        d.write_text("x")
    path = d / f"{name}.gz" if name else None
    change = {"alter": altered_pixel, "magic": wrong_magic, "dims": wrong_dims, "label": label_out_of_range}
    if action in change:
        rewrite(path, change[action])
    elif action == "truncate":
        truncate(path)
    elif action == "unreadable":
        unreadable(monkeypatch, path)
    elif action == "remove":
        path.unlink()
    found = hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest() if action == "alter" else ""
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["run", str(repo_root / "configs" / "smoke.yaml"), "--set", f"data.dir={d}", "--output-dir", str(out)]
    )
    assert result.exit_code == 2
    assert result.stderr == "error: " + message.format(p=path, d=d, found=found) + "\n"
    assert not out.exists()
