"""Fashion-MNIST from its four IDX files, verified before any training starts.

Where the files are looked for, in order: ``data.dir`` from the config, the
``ACCUM_TRAIN_DATA`` environment variable, Debian's package
(``apt-get install dataset-fashion-mnist``), then the user cache folder; only
if all fail is the official mirror asked (for users with internet; the tests
never do). Debian recompressed the .gz files, so the check is the SHA-256 of
the *decompressed* content, which is the same for Debian and upstream.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import urllib.request
import zlib
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..files import atomic_write, user_cache
from .base import ArraySplit, Dataset

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
MIRROR = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
ENV_VAR = "ACCUM_TRAIN_DATA"

# SHA-256 of the decompressed IDX files (../shared/NOTES.md).
FILES = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
IMAGE_SHAPE = (28, 28)
HOW_TO_GET = (
    f"install it with 'apt-get install dataset-fashion-mnist' or download the four "
    f".gz files from {MIRROR} into a folder named by data.dir or ${ENV_VAR}"
)


# The labels' meaning, from Fashion-MNIST's README.
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")


def cache_dir() -> Path:
    return user_cache() / "fashion-mnist"


def find_data_dir(configured: str | None, allow_download: bool = True) -> Path:
    """The folder of the four files: data.dir, else $ACCUM_TRAIN_DATA, else Debian's package, then the cache."""
    label, chosen = ("data.dir", configured) if configured else (f"${ENV_VAR}", os.environ.get(ENV_VAR))
    if chosen:  # an explicit choice is never second-guessed
        if _missing(Path(chosen)):
            _explain_missing(label, Path(chosen))
        return Path(chosen)
    for folder in (DEBIAN_DIR, cache_dir()):
        if not _missing(folder):
            return folder
    if allow_download:
        return download(cache_dir())
    raise DataError(f"Fashion-MNIST not found in {DEBIAN_DIR} or {cache_dir()}: {HOW_TO_GET}")


def _missing(folder: Path) -> list:
    return [name for name in FILES if not ((folder / f"{name}.gz").is_file() or (folder / name).is_file())]


def _explain_missing(label: str, folder: Path) -> None:
    if not folder.exists():
        raise DataError(f"{label}={folder} does not exist: {HOW_TO_GET}")
    if not folder.is_dir():
        raise DataError(f"{label}={folder} is not a directory: {HOW_TO_GET}")
    if not os.access(folder, os.R_OK | os.X_OK):
        raise DataError(f"{label}={folder} is not readable: check its permissions")
    missing = _missing(folder)
    raise DataError(
        f"{label}={folder} has no {missing[0]}.gz"
        + (f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else "")
        + f": {HOW_TO_GET}"
    )


def download(folder: Path) -> Path:  # pragma: no cover - needs the internet, never run in tests
    folder.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        target = folder / f"{name}.gz"
        if target.is_file():
            continue
        url = f"{MIRROR}{name}.gz"
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                atomic_write(target, response.read())  # 26 MB at most; checked by SHA-256 on load
        except OSError as err:
            raise DataError(
                f"Fashion-MNIST not found locally and the download of {url} failed ({err}): {HOW_TO_GET}"
            ) from None
    return folder


def read_idx_bytes(folder: Path, name: str) -> tuple:
    """(path, decompressed bytes) of one IDX file, .gz preferred."""
    gz, plain = folder / f"{name}.gz", folder / name
    path = gz if gz.is_file() else plain
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror}: check its permissions") from None
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise DataError(
                f"{path} is not a complete gzip file ({err}): the file is truncated or damaged; {HOW_TO_GET}"
            ) from None
    return path, raw


def parse_idx(raw: bytes, path: str, expect_dims: int) -> np.ndarray:
    """An IDX array of unsigned bytes. The header is checked, not trusted."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(
            f"{path} is not an IDX file of unsigned bytes (header starts {raw[:4].hex() or 'empty'}, expected 000008..)"
        )
    dims = raw[3]
    if dims != expect_dims:
        raise DataError(f"{path} has {dims} dimensions, expected {expect_dims}")
    header = 4 + 4 * dims
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    if len(raw) != header + int(np.prod(shape)):
        raise DataError(
            f"{path}: the header promises shape {shape} ({header + int(np.prod(shape))} bytes), the file has {len(raw)}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load(
    configured_dir: str | None = None,
    train_limit: int | None = None,
    test_limit: int | None = None,
    allow_download: bool = True,
) -> Dataset:
    folder = find_data_dir(configured_dir, allow_download)
    arrays = {}
    for name in FILES:
        path, raw = read_idx_bytes(folder, name)
        # Structure first, checksum last: a wrong header or label gets a message
        # that says what is wrong, not only that the bytes differ.
        array = parse_idx(raw, str(path), 3 if "images" in name else 1)
        if "images" in name and array.shape[1:] != IMAGE_SHAPE:
            raise DataError(f"{path} holds images of {array.shape[1]}x{array.shape[2]}, expected 28x28")
        if "labels" in name and array.size and array.max() >= len(CLASS_NAMES):
            raise DataError(f"{path} has label {int(array.max())}; labels must be 0..{len(CLASS_NAMES) - 1}")
        found = hashlib.sha256(raw).hexdigest()
        if found != FILES[name]:
            raise DataError(
                f"{path} failed its checksum: expected SHA-256 {FILES[name]} of the "
                f"decompressed file, found {found}; {HOW_TO_GET}"
            )
        arrays[name] = array
    splits = [
        ArraySplit(arrays[f"{prefix}-images-idx3-ubyte"], arrays[f"{prefix}-labels-idx1-ubyte"])
        for prefix in ("train", "t10k")
    ]
    data = Dataset(
        train=splits[0], test=splits[1], input_shape=(*IMAGE_SHAPE, 1), class_names=CLASS_NAMES, source=str(folder)
    )
    return data.limited(train_limit, test_limit)
