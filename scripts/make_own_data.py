"""Write a slice of Fashion-MNIST as "your own data": an .npz and a folder of PNGs.

From the local Fashion-MNIST files (Debian's dataset-fashion-mnist, data.dir
or $ACCUM_TRAIN_DATA; nothing is downloaded), writes

    OUT/fashion.npz                   x_train, y_train, x_test, y_test (uint8 [N, 28, 28]), class_names
    OUT/images/train/CLASS/NNNNN.png  one grayscale PNG per example (NNNNN: its index in the split)
    OUT/images/test/CLASS/NNNNN.png

with the first --train / --test examples of each split, and class folders
named after Fashion-MNIST's classes, made safe for file names
("T-shirt/top" -> "T-shirt_top"). Then, for example:

    python scripts/make_own_data.py --out mydata
    accum-train run configs/smoke.yaml --set data.name=npz --set data.path=mydata/fashion.npz \\
        --set data.train_limit=null --set data.test_limit=null
    accum-train run configs/smoke.yaml --set data.name=image_folder --set data.path=mydata/images \\
        --set data.channels=1 --set data.train_limit=null --set data.test_limit=null

Every file goes through accum_train.files.atomic_write, so an interrupted
run leaves no half-written file; an existing OUT/fashion.npz or OUT/images is
refused rather than mixed with.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from pathlib import Path

import numpy as np
from accum_train.datasets import fashion_mnist
from accum_train.errors import UserError
from accum_train.files import atomic_write
from PIL import Image


def folder_name(class_name: str) -> str:
    """A class name as a portable folder name: anything but letters, digits, '-' and '_' becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", class_name)


def png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image, mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def write(out: Path, train: int, test: int, data_dir=None) -> dict:
    """Write OUT/fashion.npz and OUT/images; the counts written."""
    npz_path, image_dir = out / "fashion.npz", out / "images"
    for existing in (npz_path, image_dir):
        if existing.exists():
            raise UserError(f"{existing} exists: remove it or choose another --out")
    data = fashion_mnist.load(data_dir, train_limit=train, test_limit=test, allow_download=False)
    folders = [folder_name(name) for name in data.class_names]
    buffer = io.BytesIO()
    np.savez(
        buffer,
        x_train=data.train.images,
        y_train=data.train.labels,
        x_test=data.test.images,
        y_test=data.test.labels,
        class_names=np.array(folders),
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(npz_path, buffer.getvalue())
    for split, part in (("train", data.train), ("test", data.test)):
        for folder in folders:
            (image_dir / split / folder).mkdir(parents=True, exist_ok=True)
        for index, (image, label) in enumerate(zip(part.images, part.labels)):
            atomic_write(image_dir / split / folders[label] / f"{index:05d}.png", png_bytes(image))
    return {"train": len(data.train), "test": len(data.test)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder to write fashion.npz and images/ into")
    parser.add_argument("--train", type=int, default=6000, help="training examples (the first N; default 6000)")
    parser.add_argument("--test", type=int, default=1000, help="test examples (the first N; default 1000)")
    parser.add_argument("--data-dir", default=None, help="Fashion-MNIST's folder (default: as data.dir does)")
    args = parser.parse_args(argv)
    for name in ("train", "test"):
        if not 1 <= getattr(args, name) <= (60000 if name == "train" else 10000):
            parser.error(f"--{name}={getattr(args, name)} must be between 1 and the split's size")
    try:
        counts = write(args.out, args.train, args.test, args.data_dir)
    except UserError as err:  # Fashion-MNIST missing or damaged, or OUT taken
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.out / 'fashion.npz'} and {args.out / 'images'} "
        f"({counts['train']} train, {counts['test']} test examples)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
