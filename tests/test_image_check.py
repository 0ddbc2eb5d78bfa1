"""The image folder's check: every file decoded once, in parallel, and remembered (datasets/image_check.py).

Each case changes a checked folder one way and counts what the next check
decodes again: only what changed (content, mtime, new files, files whose mtime
is not older than their check), never what a memory vouches for. A damaged or
missing memory costs time, never a wrong answer. Every process of the suite
has its own cache folder (conftest.py sets ACCUM_TRAIN_CACHE).
"""

import os
import time

import numpy as np
import pytest
from accum_train.cli.main import main
from accum_train.config import load_config
from accum_train.datasets import image_check, load
from accum_train.errors import DataError
from click.testing import CliRunner
from PIL import Image

N = 12  # files in a folder: 2 classes x 3 per split


def write_png(path, value, size=(5, 4)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full(size, value, np.uint8)).save(path)
    return path


def folder(root):
    for split in ("train", "test"):
        for c, name in enumerate(("a", "b")):
            for i in range(3):
                write_png(root / split / name / f"{i}.png", 40 * i + c)
    return root


def age(root, seconds=60):
    """Every file's mtime moved into the past, as a folder written before the check is."""
    past = time.time_ns() - seconds * 10**9
    for path in root.rglob("*.png"):
        os.utime(path, ns=(past, past))


def data_config(root, *sets):
    return load_config(None, ["data.name=image_folder", f"data.path={root}", "data.channels=1", *sets]).data


def checked(root, *sets, run_dir=None):
    return load(data_config(root, *sets), run_dir).file_checks


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(image_check.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def root(tmp_path, cache):
    root = folder(tmp_path / "images")
    age(root)
    first = checked(root)
    assert (first.decoded, first.remembered) == (N, 0)
    return root


def rewritten(root):
    write_png(root / "train" / "a" / "1.png", 200)  # same size on disk, new content, new mtime


def touched(root):
    later = time.time_ns() - 30 * 10**9
    os.utime(root / "test" / "b" / "2.png", ns=(later, later))


def added(root):
    write_png(root / "train" / "b" / "3.png", 7)


def removed(root):
    (root / "train" / "b" / "2.png").unlink()


def in_the_future(root):
    # mtime after the check began: it could have changed within the check's own clock tick
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(root / "test" / "a" / "0.png", ns=(ahead, ahead))


def remembered(root, sets=()):
    """The relative paths the folder's cache holds."""
    channels = 3 if "data.channels=3" in sets else 1
    return image_check._read(image_check.cache_file(root, channels), root, channels)[0]


def cache_gone(root):
    for path in image_check.cache_dir().rglob("*.npz"):
        path.unlink()


def cache_truncated(root):
    for path in image_check.cache_dir().rglob("*.npz"):
        path.write_bytes(path.read_bytes()[:100])


def cache_not_npz(root):
    for path in image_check.cache_dir().rglob("*.npz"):
        path.write_bytes(b"not a zip at all")


def other_channels(root):
    return ["data.channels=3"]  # decoding to RGB is another check: another cache


CHANGES = [
    # (change to the checked folder or its memory, files the next check decodes, files in it)
    (lambda root: None, 0, N),
    (rewritten, 1, N),
    (touched, 1, N),
    (added, 1, N + 1),
    (removed, 0, N - 1),
    (in_the_future, 1, N),
    (cache_gone, N, N),
    (cache_truncated, N, N),
    (cache_not_npz, N, N),
    (other_channels, N, N),
]


@pytest.mark.parametrize(
    "change, decoded, files",
    CHANGES,
    ids=["unchanged", "rewritten", "touched", "added", "removed", "future", "gone", "truncated", "not_npz", "rgb"],
)
def test_only_what_changed_is_decoded_again(root, change, decoded, files):
    sets = change(root) or []
    again = checked(root, *sets)
    assert (again.decoded, again.remembered, len(again.sizes)) == (decoded, files - decoded, files)
    assert again.sizes.tolist() == [[5, 4]] * files
    # the cache now holds this folder exactly as it is: a third check decodes nothing but a file in the future
    third = checked(root, *sets)
    assert third.decoded == (1 if change is in_the_future else 0)
    assert sorted(remembered(root, sets)) == sorted(os.fsencode(p.relative_to(root)) for p in root.rglob("*.png")), (
        "entries of files no longer there are dropped"
    )


def test_a_file_corrupted_after_its_check_is_found(root):
    path = root / "train" / "b" / "0.png"
    contents = bytearray(path.read_bytes())
    contents[len(contents) // 2 :] = bytes(len(contents) - len(contents) // 2)  # same size, data zeroed
    path.write_bytes(bytes(contents))
    with pytest.raises(DataError) as err:
        checked(root)
    assert str(err.value) == f"{path} is not a readable PNG or JPEG image (truncated or corrupt): replace or remove it"


def test_every_bad_file_is_checked_the_first_named_and_the_rest_counted(root):
    bad = [root / "train" / "b" / "2.png", root / "train" / "a" / "0.png", root / "test" / "a" / "1.png"]
    for path in bad:
        path.write_bytes(path.read_bytes()[:30])
    message = (
        f"{bad[1]} is not a readable PNG or JPEG image (truncated or corrupt): replace or remove it "
        f"(2 more files fail the check, the next {bad[0]})"
    )
    for attempt in ("decoded", "remembered"):
        with pytest.raises(DataError) as err:
            checked(root)
        assert str(err.value) == message, attempt
    # the second time, the bad files were known from the first (unchanged since): nothing was decoded
    again = image_check.check(root, np.array([os.fsencode(p) for p in bad]), 1)
    assert (again.decoded, sorted(again.problems)) == (0, [0, 1, 2])


def test_a_file_that_cannot_be_read_is_never_remembered(root):
    gone = root / "train" / "a" / "2.png"
    gone.unlink()
    gone.symlink_to(root / "nowhere.png")  # listed by the scan, unreadable
    for _ in range(2):
        with pytest.raises(DataError) as err:
            checked(root)
        assert str(err.value) == f"{gone} cannot be read (No such file or directory): check its permissions"
    assert os.fsencode(gone.relative_to(root)) not in remembered(root), "an unreadable file is not in the cache"
    assert len(remembered(root)) == N - 1, "every other file is"


@pytest.mark.parametrize("batch", [image_check.BATCH, 8, 1])
def test_parallel_and_one_at_a_time_agree(tmp_path, monkeypatch, batch):
    """Files decoded in batches, a failed batch's files again one by one: every size, every bad file."""
    monkeypatch.setattr(image_check, "BATCH", batch)
    paths = [write_png(tmp_path / f"{i}.png", i, size=(3 + i % 4, 2 + i % 3)) for i in range(40)]
    for bad in (7, 9, 33):
        paths[bad].write_bytes(b"not an image")
    (tmp_path / "gone.png").symlink_to(tmp_path / "nowhere.png")
    names = np.array([os.fsencode(p) for p in [*paths, tmp_path / "gone.png"]])
    expected = [[3 + i % 4, 2 + i % 3] for i in range(40)] + [[image_check.UNDECODED] * 2]
    for bad in (7, 9, 33):
        expected[bad] = [image_check.UNDECODED] * 2
    for parallel in (1, 4, None):
        assert image_check.decode_sizes(names, 1, parallel).tolist() == expected, parallel


def test_an_unwritable_cache_is_said_and_the_check_goes_on(tmp_path, monkeypatch):
    root = folder(tmp_path / "images")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(image_check.CACHE_ENV, str(tmp_path / "file" / "cache"))
    done = checked(root)
    where = tmp_path / "file" / "cache" / "image-checks"
    assert done.decoded == N and done.cache_problem == f"Not a directory ({where})"
    assert done.line().endswith(
        f"(the check's cache was not written: Not a directory ({where}); set ACCUM_TRAIN_CACHE to a writable folder)"
    )


def test_the_run_directory_keeps_the_manifest_and_a_resume_reads_it(root, tmp_path, repo_root):
    out = tmp_path / "run"
    args = ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out), "--quiet"]
    sets = ["data.name=image_folder", f"data.path={root}", "data.channels=1", "epochs=1", "batch_size=4"]
    result = CliRunner().invoke(main, [*args, *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    assert "checked 12 image files in " in result.output and ": 0 decoded, 12 unchanged since" in result.output
    with np.load(out / image_check.MANIFEST) as manifest:
        files = sorted(os.fsencode(p.relative_to(root)) for p in root.rglob("*.png"))
        assert sorted(manifest["path"].tolist()) == files
        assert manifest["height"].tolist() == [5] * N and manifest["width"].tolist() == [4] * N
        assert bytes(manifest["root"]) == os.fsencode(root.resolve()) and int(manifest["channels"]) == 1
    cache_gone(root)
    assert checked(root, run_dir=out).decoded == 0, "the run directory's manifest vouches for the files"
    assert checked(root).decoded == 0, "and the cache was written again from it"
    cache_gone(root)
    assert checked(root).decoded == N, "without either, every file is decoded"
