"""Image folders at scale: the check's time, first and second, and training throughput.

Writes a folder of --files small PNGs (default 100,000: Fashion-MNIST's 60,000
training images, then the first of them again mirrored left to right, as
train/CLASS/*.png, and its 10,000 test images as test/CLASS/*.png) and the same
examples as one .npz, then measures, one run each:

  check   the scan of the folder, then the check (datasets/image_check.py)
          with an empty cache on every core (tf.data's parallel map), the
          same again (the second time: every file unchanged), and with an
          empty cache one map call (image_check.BATCH files) at a time
          (parallel=1), for the speed-up.
          Wall and CPU time of this process. The files were just written, so
          they are read from the page cache: disk reads are not in these
          figures.
          The same for --jpegs 224x224 RGB JPEGs (Fashion-MNIST images scaled
          up), the motivating case: there decoding, not tf.data's per-file
          overhead, is the cost, and the parallel pass uses every core.
  train   examples/s of training, the same model and batch, each in a fresh
          process: accum-train from the folder (its decoded images kept
          in memory, as they fit, and again read from disk batch by batch,
          data.keep_decoded: false), accum-train from the .npz,
          and keras.utils.image_dataset_from_directory feeding model.fit
          (rescaled to [0, 1], .prefetch(AUTOTUNE); also with .cache() before
          it, which holds the decoded images in memory after the first epoch
          as the .npz does). The model is accum-train's built-in net exported
          to Keras (``accum-train export``), compiled with the same Adam;
          subdivisions=1, no augmentation, so each update is one pass over the
          batch in every row. A row's figure is its last epoch's training
          examples over that epoch's wall time (the first epoch traces);
          accum-train's epoch also scores 500 test examples. The rows run in
          turn, --rounds times (round 1 of every row, then round 2, ...), each
          a fresh process; a row's figure is the median over its rounds.

    python benchmarks/image_folder.py --output docs/image-folder.json   # the README's figures
    python benchmarks/image_folder.py --files 12000 --rounds 1 --models mlp   # a quick look
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import provenance  # benchmarks/ is on sys.path: this script runs from there
from tables import against, caption

ROOT = Path(__file__).resolve().parents[1]
TEST_FILES = 10000
MODELS = {
    # name: the --set items of configs/fmnist.yaml that make it
    "seed_convnet": ["model.name=seed_convnet", "model.width=0.25", "model.norm=batchnorm"],
    "mlp": ["model.name=mlp"],
}
COMMON = ["data.augment.crop=0", "subdivisions=1", "log_every=100000", "optimizer.schedule.name=constant"]


def own_data_script():
    spec = importlib.util.spec_from_file_location("make_own_data", ROOT / "scripts" / "make_own_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_data(out: Path, files: int) -> dict:
    """out/images (train/CLASS, test/CLASS) and out/data.npz: the same examples."""
    from accum_train.datasets import fashion_mnist

    script = own_data_script()
    data = fashion_mnist.load(None, allow_download=False)
    n_train = files - TEST_FILES
    base, labels = data.train.images, data.train.labels
    picks = np.arange(n_train) % len(base)
    train_images = np.where((np.arange(n_train) >= len(base))[:, None, None], base[picks][:, :, ::-1], base[picks])
    splits = {"train": (train_images, labels[picks]), "test": (data.test.images, data.test.labels)}
    folders = [script.folder_name(name) for name in data.class_names]
    started = time.perf_counter()
    for split, (images, split_labels) in splits.items():
        for name in folders:
            (out / "images" / split / name).mkdir(parents=True, exist_ok=True)
        for index, (image, label) in enumerate(zip(images, split_labels)):
            (out / "images" / split / folders[label] / f"{index:06d}.png").write_bytes(script.png_bytes(image))
    # the folder's label of a class is its rank among the sorted class folders
    rank = np.argsort(np.argsort(folders))
    np.savez(
        out / "data.npz",
        x_train=splits["train"][0],
        y_train=rank[splits["train"][1]],
        x_test=splits["test"][0],
        y_test=rank[splits["test"][1]],
    )
    return {"files": files, "train": n_train, "test": TEST_FILES, "write_s": time.perf_counter() - started}


def write_jpegs(out: Path, files: int) -> dict:
    """out/train/CLASS/*.jpg and out/test/CLASS/*.jpg: Fashion-MNIST scaled up to 224x224 RGB, quality 90."""
    import io

    from accum_train.datasets import fashion_mnist
    from PIL import Image

    data = fashion_mnist.load(None, train_limit=files, allow_download=False)
    started = time.perf_counter()
    test = max(files // 10, 1)
    for index, (image, label) in enumerate(zip(data.train.images, data.train.labels)):
        split = "test" if index < test else "train"
        folder = out / split / f"class{int(label)}"
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        Image.fromarray(image, mode="L").resize((224, 224)).convert("RGB").save(buffer, format="JPEG", quality=90)
        (folder / f"{index:06d}.jpg").write_bytes(buffer.getvalue())
    return {"files": files, "write_s": time.perf_counter() - started}


def timed(function):
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def check_times(images: Path, cache: Path, channels: int = 1) -> dict:
    from accum_train.datasets import image_check, image_folder

    classes = image_folder._class_folders(images, "train")
    scanned, scan = timed(lambda: [image_folder._scan(images / split, classes)[0] for split in ("train", "test")])
    paths = np.concatenate(scanned)
    rows = {"scan": {**scan, "files": len(paths)}}
    for parallel in (None, 1):  # untimed: TensorFlow's runtime and tf.data's first pipelines start here
        os.environ[image_check.CACHE_ENV] = str(cache / "warm-up")
        image_check.decode_sizes(paths[:200], channels, parallel)
    for name, parallel, cache_name in (
        ("first", None, "parallel"),
        ("second", None, "parallel"),
        ("first_one_at_a_time", 1, "serial"),
    ):
        os.environ[image_check.CACHE_ENV] = str(cache / cache_name)
        done, times = timed(lambda: image_check.check(images, paths, channels, parallel=parallel))  # noqa: B023
        assert not done.problems, done.problems
        rows[name] = {**times, "decoded": done.decoded, "remembered": done.remembered}
    rows["parallel_speedup"] = rows["first_one_at_a_time"]["wall_s"] / rows["first"]["wall_s"]
    return rows


def ours(model: str, data_sets: list[str], epochs: int, out: Path) -> dict:
    command = [sys.executable, "-m", "accum_train.cli.main", "run", str(ROOT / "configs" / "fmnist.yaml")]
    command += ["--output-dir", str(out), "--quiet"]
    for item in [*MODELS[model], *COMMON, f"epochs={epochs}", "data.train_limit=null", *data_sets]:
        command += ["--set", item]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip()[-2000:]}")
    epochs_logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [record for record in epochs_logged if "examples_per_s" in record][-1]
    return {"examples_per_s": last["examples_per_s"], "epoch_s": last["elapsed_s"]}


def keras_fit(model_file: Path, images: Path, epochs: int, batch: int, cache: bool) -> dict:
    """In a fresh process: image_dataset_from_directory into model.fit."""
    command = [sys.executable, __file__, "--keras-child", str(model_file), str(images), str(epochs), str(batch)]
    done = subprocess.run([*command, *(["--cache"] if cache else [])], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"keras row failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def keras_child(model_file: str, images: str, epochs: int, batch: int, cache: bool) -> None:
    import keras
    import tensorflow as tf

    train = keras.utils.image_dataset_from_directory(
        Path(images) / "train",
        labels="inferred",
        label_mode="int",
        color_mode="grayscale",
        batch_size=batch,
        image_size=(28, 28),
        shuffle=True,
        seed=0,
    )
    n = sum(1 for _ in Path(images, "train").rglob("*.png"))
    train = train.map(lambda x, y: (x / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE)
    train = (train.cache() if cache else train).prefetch(tf.data.AUTOTUNE)
    model = keras.models.load_model(model_file)
    model.compile(
        optimizer=keras.optimizers.Adam(0.003), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    times = []

    class EpochTimes(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.started)

    model.fit(train, epochs=epochs, verbose=0, callbacks=[EpochTimes()])
    print(json.dumps({"examples_per_s": n / times[-1], "epoch_s": times[-1]}))


def _caption(report: dict) -> str:
    """The tables' caption: the machine, commit and command the JSON records."""
    machine = report["machine"]
    commit = report.get("commit") or machine.get("commit")
    cpu = f" ({machine['cpu']})" if machine.get("cpu") else ""
    where = (
        f"{machine['cpus']} CPUs{cpu}, Python {machine['python']}, load average "
        f"{machine['load_before'][0]:.1f} before the run and {machine['load_after'][0]:.1f} after"
    )
    return caption(where, commit, report["command"])


def check_table(report: dict) -> str:
    """The check's times as docs/data-and-models.md's table."""
    data, check = report["data"], report["check"]
    rows = [
        ("scan of the folder", check["scan"]),
        ("check, first time (empty cache, parallel map)", check["first"]),
        (f"check, second time (every file unchanged: {check['second']['decoded']} decoded)", check["second"]),
        ("check, first time, one map call at a time", check["first_one_at_a_time"]),
    ]
    lines = [
        _caption(report),
        "",
        f"| {data['files']:,} PNGs, 28x28 gray (Fashion-MNIST, {data['train']:,} train + {data['test']:,} test) "
        "| time | CPU |",
        "|---|---:|---:|",
    ]
    lines += [f"| {label} | {r['wall_s']:.2f} s | {r['cpu_s']:.2f} s |" for label, r in rows]
    return "\n".join(lines)


# the JSON's training rows (after "MODEL/") -> the page's name for each input
INPUTS = {
    "accum-train image folder": "accum-train, image folder (decoded images kept in memory)",
    "accum-train image folder, read from disk": "accum-train, image folder read from disk batch by batch "
    "(`data.keep_decoded: false`)",
    "accum-train .npz": "accum-train, .npz",
    "keras image_dataset_from_directory": "`keras.utils.image_dataset_from_directory` + `model.fit`",
    "keras image_dataset_from_directory + cache": "the same with `.cache()` (decoded images held in memory after "
    "epoch 1)",
}


def train_table(report: dict) -> str:
    """Training throughput as docs/data-and-models.md's table; the ratios rounded down (against accum-train)."""
    train = report["train"]
    models = list(dict.fromkeys(name.split("/", 1)[0] for name in train))
    lines = [
        _caption(report),
        "",
        "| input | examples/s (median) | rounds, min to max | against Keras from the folder | against Keras with "
        "`.cache()` |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in train.items():
        model, what = name.split("/", 1)
        units = {
            unit: train[f"{model}/keras image_dataset_from_directory{suffix}"]["examples_per_s"]
            for unit, suffix in (("folder", ""), ("cache", " + cache"))
        }

        def ratio(unit, rate=row["examples_per_s"], units=units):
            return str(against(rate / units[unit], True, "0.01"))

        # the page's comparisons: ours from the folder against Keras' from the folder (both decode: as read from
        # disk; kept in memory), and kept in memory against Keras' own in-memory cache (each unit row shows 1)
        shown = {
            "accum-train image folder": (ratio("folder"), ratio("cache")),
            "accum-train image folder, read from disk": (ratio("folder"), ""),
            "keras image_dataset_from_directory": ("1", ""),
            "keras image_dataset_from_directory + cache": ("", "1"),
        }.get(what, ("", ""))
        rounds = row["rounds_examples_per_s"]
        label = INPUTS.get(what, what) if len(models) == 1 else f"{model}: {INPUTS.get(what, what)}"
        lines.append(
            f"| {label} | {row['examples_per_s']:,.0f} | {min(rounds):,.0f} to {max(rounds):,.0f} "
            f"| {shown[0]} | {shown[1]} |"
        )
    return "\n".join(lines)


def train_rows(model: str, work: Path, args, r: int):
    """One round of the training rows of ``model``, in turn: (name, measurement) as each ends."""
    runs = work / "runs" / f"round-{r}"
    folder_run = runs / f"{model}-folder"
    folder_sets = ["data.name=image_folder", f"data.path={work / 'images'}", "data.channels=1"]
    limits = [f"batch_size={args.batch}", f"data.test_limit={TEST_FILES // 20}"]
    yield f"{model}/accum-train image folder", ours(model, [*folder_sets, *limits], args.epochs, folder_run)
    yield (
        f"{model}/accum-train image folder, read from disk",
        ours(model, [*folder_sets, "data.keep_decoded=false", *limits], args.epochs, runs / f"{model}-folder-streamed"),
    )
    yield (
        f"{model}/accum-train .npz",
        ours(model, ["data.name=npz", f"data.path={work / 'data.npz'}", *limits], args.epochs, runs / f"{model}-npz"),
    )
    # the Keras rows train the same net: the folder run's model, exported as a .keras file
    export = [sys.executable, "-m", "accum_train.cli.main", "export", str(folder_run)]
    subprocess.run(export, check=True, capture_output=True)
    for cache in (False, True):
        name = f"{model}/keras image_dataset_from_directory{' + cache' if cache else ''}"
        yield name, keras_fit(folder_run / "model.keras", work / "images", args.epochs, args.batch, cache)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--keras-child":
        model_file, images, epochs, batch = sys.argv[2:6]
        keras_child(model_file, images, int(epochs), int(batch), "--cache" in sys.argv)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100000, help="PNG files in the folder (train + 10000 test)")
    parser.add_argument("--jpegs", type=int, default=5000, help="224x224 JPEG files for the check (0: none)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each training row (the last is timed)")
    parser.add_argument("--batch", type=int, default=500, help="batch size of every training row")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the training rows, in turn (each row: the median)"
    )
    parser.add_argument("--models", default="mlp,seed_convnet", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--parts", default="check,train", help="what to measure: check, train or both")
    parser.add_argument("--work", type=Path, default=None, help="folder for data and runs (default: temporary)")
    parser.add_argument("--output", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    if args.files <= TEST_FILES:
        raise SystemExit(f"--files {args.files} must be more than the {TEST_FILES} test files")

    with tempfile.TemporaryDirectory(prefix="accum-train-images-") as temporary:
        work = args.work or Path(temporary)
        result = {
            "command": " ".join(["python", "benchmarks/image_folder.py", *sys.argv[1:]]),
            "machine": {**provenance.machine(), "python": platform.python_version(), "load_before": os.getloadavg()},
        }
        result["data"] = write_data(work, args.files)
        print(f"wrote {args.files} PNG files and the .npz in {result['data']['write_s']:.0f} s", flush=True)
        if "check" in args.parts:
            result["check"] = check_times(work / "images", work / "cache")
            print(json.dumps(result["check"], indent=1), flush=True)
            if args.jpegs:
                result["jpeg_data"] = write_jpegs(work / "jpegs", args.jpegs)
                result["jpeg_check"] = check_times(work / "jpegs", work / "cache-jpeg", channels=3)
                print(json.dumps(result["jpeg_check"], indent=1), flush=True)
        os.environ["ACCUM_TRAIN_CACHE"] = str(work / "cache" / "parallel")  # the runs find the folder checked
        rows = {}
        for model in args.models.split(",") if "train" in args.parts else []:
            rounds = {}  # row: one measurement per round
            for r in range(args.rounds):
                for name, measured in train_rows(model, work, args, r):
                    rounds.setdefault(name, []).append(measured)
                    rate = measured["examples_per_s"]
                    print(f"round {r + 1}/{args.rounds} {name}: {rate:.0f} examples/s", flush=True)
            for name, measured in rounds.items():
                rows[name] = {
                    "examples_per_s": statistics.median(m["examples_per_s"] for m in measured),
                    "epoch_s": statistics.median(m["epoch_s"] for m in measured),
                    "rounds_examples_per_s": [m["examples_per_s"] for m in measured],
                }
        result["train"] = rows
        result["machine"]["load_after"] = os.getloadavg()
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
