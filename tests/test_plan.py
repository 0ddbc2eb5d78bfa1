"""`accum-train plan`: the split of each batch, the updates, the learning rate
and the warnings, worked out without training or writing anything.

The exact text is checked for two real configs; the warnings as a table over
small in-memory datasets (whose sizes a config alone cannot give: config
validation refuses data.train_limit < batch_size, the data itself need not
be that large); the learning rates against the schedules' own formulas.
"""

import json
import math
import os

import numpy as np
import pytest
from accum_train.cli.main import main
from accum_train.config import load_config
from accum_train.datasets.base import ArraySplit, Dataset
from accum_train.plan import micro_split, plan
from accum_train.trainer import runtime
from click.testing import CliRunner

FMNIST_PLAN = """\
data           fashion_mnist, {source}
examples       60000 train, 10000 test
input          28x28x1
classes        10: T-shirt/top, Trouser, Pullover, Dress, Coat, ...
model          seed_convnet, 371498 trainable parameters, 5 BatchNorm layers
cache          1.417 MiB in float32 (the gradient cache)
loss           sparse_categorical_crossentropy (on logits)
metrics        accuracy
batch_size     500 examples per update
micro-batches  500 = 5 x 100 (subdivisions=5)
in flight      2 micro-batches at once (parallel_micro_steps; memory holds 2)
augment        crop 1 (training images, drawn from seed and update)
updates        120 per epoch x 30 epochs = 3600
last batch     none: every batch is full (60000 = 120 x 500)
optimizer      adam, learning_rate 0.003, schedule cosine (warmup_steps=120, decay_steps=3480)
learning rate  2.5e-05 at update 1 (first), 0.003 at update 120 (end of warm-up), 6.258e-10 at update 3600 (last)
noise scale    measured each update from its micro-batches (exponential average, decay 0.95 per update)
"""

SMOKE_5_PLAN = """\
data           fashion_mnist, {source}
examples       3000 train, 500 test
input          28x28x1
classes        10: T-shirt/top, Trouser, Pullover, Dress, Coat, ...
model          seed_convnet, 23762 trainable parameters, 5 BatchNorm layers
cache          92.82 KiB in float32 (the gradient cache)
loss           sparse_categorical_crossentropy (on logits)
metrics        accuracy
batch_size     64 examples per update
micro-batches  64 = 1 x 12 + 4 x 13 (subdivisions=5)
in flight      2 micro-batches at once (parallel_micro_steps; memory holds 2)
updates        47 per epoch x 2 epochs = 94
last batch     56 examples: 56 = 4 x 11 + 1 x 12
optimizer      adam, learning_rate 0.003, schedule constant
learning rate  0.003 throughout
noise scale    measured each update from its micro-batches (exponential average, decay 0.95 per update)
"""


@pytest.fixture
def in_empty_dir(tmp_path, monkeypatch):
    """Run in an empty working directory, so that 'writes nothing' can be checked (runs/ would appear here)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "config, extra, expected",
    [
        ("fmnist.yaml", [], FMNIST_PLAN),
        ("smoke.yaml", ["--set", "subdivisions=5"], SMOKE_5_PLAN),
    ],
)
def test_plan_prints_the_plan_and_writes_nothing(
    repo_root, data_dir, in_empty_dir, config, extra, expected, monkeypatch
):
    monkeypatch.setattr(runtime, "cpu_cores", lambda: 2)  # "in flight" as on the 2-core CI machine (no GPU)
    result = CliRunner().invoke(main, ["plan", str(repo_root / "configs" / config), *extra])
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    assert result.stdout == expected.format(source=data_dir)
    assert os.listdir(in_empty_dir) == []


@pytest.mark.parametrize(
    "n, subdivisions, split",
    [
        (500, 5, [[5, 100]]),
        (64, 4, [[4, 16]]),
        (64, 5, [[1, 12], [4, 13]]),  # ragged: sizes differ by one
        (56, 5, [[4, 11], [1, 12]]),
        (10, 3, [[2, 3], [1, 4]]),
        (3, 5, [[3, 1]]),  # a short batch of n < subdivisions: n micro-batches of 1
        (1, 1, [[1, 1]]),
    ],
)
def test_micro_split_counts_the_engines_micro_batches(n, subdivisions, split):
    assert micro_split(n, subdivisions) == split
    assert sum(count * size for count, size in split) == n


def tiny_data(n_train: int, n_test: int = 10) -> Dataset:
    """Zeros of 8x8x1: plan looks only at sizes and shapes."""

    def split(n):
        return ArraySplit(np.zeros((n, 8, 8, 1), np.uint8), np.zeros((n,), np.int32))

    return Dataset(
        train=split(n_train), test=split(n_test), input_shape=(8, 8, 1), class_names=tuple("abc"), source="memory"
    )


NOISY = "give BatchNorm noisy statistics: set model.norm=groupnorm or model.norm=none"

WARNING_CASES = [
    # (overrides, training examples, the warnings, exactly)
    (["batch_size=64", "subdivisions=4"], 256, []),
    (["batch_size=64", "subdivisions=4"], 300, []),  # last batch of 44: 4 x 11
    (
        ["batch_size=64", "subdivisions=16"],
        256,
        [f"micro-batches of 4 examples (under 8) {NOISY}, or use fewer subdivisions"],
    ),
    (["batch_size=64", "subdivisions=16", "model.norm=none"], 256, []),
    (["batch_size=64", "subdivisions=16", "model.name=mlp", "model.norm=none"], 256, []),
    (
        ["batch_size=64", "subdivisions=9"],
        256,  # 64 = 8 x 7 + 1 x 8: the smallest counts
        [f"micro-batches of 7 examples (under 8) {NOISY}, or use fewer subdivisions"],
    ),
    (
        ["batch_size=64", "subdivisions=4"],
        258,
        [
            "subdivisions=4 is more than the 2 examples of each epoch's last batch: that batch runs as "
            "2 micro-batches of 1",
            f"the last batch of each epoch (2 examples) has micro-batches of 1 (under 8), which {NOISY}, or use a "
            "training set that batch_size divides (data.train_limit)",
        ],
    ),
    (
        ["batch_size=64", "subdivisions=4", "model.norm=none"],
        258,
        [
            "subdivisions=4 is more than the 2 examples of each epoch's last batch: that batch runs as "
            "2 micro-batches of 1"
        ],
    ),
    (["batch_size=64", "subdivisions=16", "baseline=true"], 258, []),  # the baseline runs whole batches
    (
        ["batch_size=64", "subdivisions=auto", "memory_limit=1GiB"],
        256,
        [
            "subdivisions=auto: the split is chosen when the run starts, the fewest micro-batches whose update fits "
            "in memory_limit=1GiB; the micro-batch checks are skipped"
        ],
    ),
    (
        ["batch_size=64", "subdivisions=4", "epochs=1", "optimizer.schedule.warmup_steps=10"],
        256,
        ["optimizer.schedule.warmup_steps=10 is more than the run's 4 updates: the learning rate never reaches 0.001"],
    ),
    (
        ["batch_size=64", "subdivisions=4", "model.norm=none", "strategy.name=mirrored", "strategy.cpu_devices=2"],
        256,
        [
            "strategy.name=mirrored: batch_size is global; each replica takes its share and cuts it into "
            "subdivisions=4 micro-batches, so micro-batches are smaller than shown here (which is for one device)"
        ],
    ),
]


@pytest.mark.parametrize(
    "overrides, n_train, warnings", WARNING_CASES, ids=[f"case{i}" for i in range(len(WARNING_CASES))]
)
def test_warnings(overrides, n_train, warnings):
    assert plan(load_config(None, overrides), tiny_data(n_train))["warnings"] == warnings


@pytest.mark.parametrize(
    "overrides, n_train, batch, updates, micro",
    [
        (["batch_size=all", "subdivisions=4"], 256, 256, 1, [[4, 64]]),
        (["batch_size=all", "micro_batch_size=100", "subdivisions=null"], 250, 250, 1, [[2, 83], [1, 84]]),
        (["batch_size=256", "subdivisions=4"], 256, 256, 1, [[4, 64]]),  # exactly the training set: allowed
    ],
)
def test_batch_size_all_is_the_whole_training_set_as_one_batch(overrides, n_train, batch, updates, micro):
    cfg = load_config(None, [*overrides, "epochs=2"])
    result = plan(cfg, tiny_data(n_train))
    assert (result["batch_size"], result["full_batch"]["count"], result["full_batch"]["micro_batches"]) == (
        batch,
        updates,
        micro,
    )
    assert result["whole_training_set"] == ("batch_size=all" in overrides)
    assert result["last_batch"] is None and result["warnings"] == []


def test_a_batch_over_the_training_set_is_refused_in_one_line(tmp_path, repo_root):
    with pytest.raises(Exception) as err:
        plan(load_config(None, ["batch_size=500", "subdivisions=5"]), tiny_data(100))
    assert str(err.value) == (
        "batch_size=500 is more than the 100 training examples: lower it, or set batch_size: all to train on the "
        "whole training set as one batch"
    )
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main,
        ["run", str(repo_root / "configs" / "smoke.yaml"), "--set", "data.train_limit=null"]
        + ["--set", "batch_size=70000", "--output-dir", str(out)],
    )
    assert (result.exit_code, result.stderr.splitlines()) == (
        2,
        [
            "error: batch_size=70000 is more than the 60000 training examples: lower it, or set batch_size: all "
            "to train on the whole training set as one batch"
        ],
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["batch_size=every"],
            "--set: batch_size='every' must be an integer >= 1 and <= 1000000 or all",
        ),
        (
            ["batch_size=all", "batch_schedule=[{epoch: 2, batch_size: 1000}]"],
            "--set: batch_size=all is every training example in one batch, which no batch_schedule can grow: give "
            "batch_size a number, or remove batch_schedule",
        ),
    ],
)
def test_bad_batch_size_all(overrides, message):
    with pytest.raises(Exception) as err:
        load_config(None, overrides)
    assert str(err.value) == message


def test_a_keras_file_with_batchnorm_is_warned_about(tmp_path):
    import keras

    inputs = keras.Input((8, 8, 1))
    x = keras.layers.BatchNormalization()(keras.layers.Conv2D(2, 3)(inputs))
    keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(x))).save(tmp_path / "bn.keras")
    cfg = load_config(
        None, ["model.name=keras_file", f"model.path={tmp_path / 'bn.keras'}", "batch_size=64", "subdivisions=16"]
    )
    result = plan(cfg, tiny_data(256))
    assert result["model"] == {
        "name": "keras_file",
        "path": str(tmp_path / "bn.keras"),
        "trainable_parameters": 20 + 4 + 3 * 72 + 3,
        "batchnorm_layers": 1,
        "gradient_cache_bytes": 4 * (20 + 4 + 3 * 72 + 3),  # float32, one normaliser
    }
    assert result["warnings"] == [
        "micro-batches of 4 examples (under 8) give BatchNorm noisy statistics: replace "
        "the model file's BatchNormalization layers (e.g. by GroupNormalization), or use "
        "fewer subdivisions"
    ]


def test_warnings_are_printed_after_the_plan(tmp_path, data_dir):
    config = tmp_path / "c.yaml"
    config.write_text(
        f"batch_size: 64\nsubdivisions: 16\nparallel_micro_steps: 1\ndata: {{dir: {data_dir}, train_limit: 130}}\n"
    )
    result = CliRunner().invoke(main, ["plan", str(config)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[-8:] == [
        "micro-batches  64 = 16 x 4 (subdivisions=16)",
        "updates        3 per epoch x 10 epochs = 30",
        "last batch     2 examples: 2 = 2 x 1",
        "optimizer      adam, learning_rate 0.001, schedule constant",
        "learning rate  0.001 throughout",
        "noise scale    measured each update from its micro-batches (exponential average, decay 0.95 per update)",
        "warning: subdivisions=16 is more than the 2 examples of each epoch's last batch: that batch runs as "
        "2 micro-batches of 1",
        f"warning: micro-batches of 4 examples (under 8) {NOISY}, or use fewer subdivisions",
    ]


@pytest.mark.slow  # a run and its resume (the quick suite keeps plan's own warnings)
def test_a_run_says_the_plans_warnings_as_it_starts_and_not_on_resume(tmp_path, data_dir):
    config = tmp_path / "c.yaml"
    config.write_text(
        "batch_size: 64\nsubdivisions: 16\nepochs: 1\nparallel_micro_steps: 1\nmodel: {width: 0.0625}\n"
        f"data: {{dir: {data_dir}, train_limit: 130, test_limit: 10}}\n"
    )
    warnings = plan(load_config(config))["warnings"]
    assert len(warnings) == 2  # the last batch's and BatchNorm's
    ran = CliRunner().invoke(main, ["run", str(config), "--output-dir", str(tmp_path / "run")])
    assert ran.exit_code == 0, ran.output
    assert ran.stdout.splitlines()[:3] == [
        "batch_size=64 as 16 micro-batches of 4 examples",
        *["warning: " + warning for warning in warnings],
    ]
    resumed = CliRunner().invoke(main, ["run", "--resume", str(tmp_path / "run")])  # at its end: no update to run
    assert resumed.exit_code == 0, resumed.output
    assert not [line for line in resumed.stdout.splitlines() if line.startswith("warning: ")]


LR = 0.003


@pytest.mark.parametrize(
    "schedule, first, warmup_end, last",
    [
        # smoke.yaml: 47 updates per epoch x 2 = 94; warm-up 10, so decay_steps resolves to 84.
        ("cosine", LR / 10, LR, LR * (1 + math.cos(math.pi * 83 / 84)) / 2),
        ("exponential", LR / 10, LR, LR * 0.5 ** (83 / 84)),
        ("constant", LR / 10, LR, LR),
    ],
)
def test_learning_rates_follow_the_schedule(repo_root, schedule, first, warmup_end, last):
    cfg = load_config(
        repo_root / "configs" / "smoke.yaml",
        [f"optimizer.schedule.name={schedule}", "optimizer.schedule.warmup_steps=10"],
    )
    rate = plan(cfg)["learning_rate"]
    assert rate["decay_steps"] == (None if schedule == "constant" else 84)
    assert (rate["first"]["update"], rate["warmup_end"]["update"], rate["last"]["update"]) == (1, 10, 94)
    assert rate["first"]["value"] == pytest.approx(first, rel=1e-6)
    assert rate["warmup_end"]["value"] == pytest.approx(warmup_end, rel=1e-6)
    # float32 arithmetic near the cosine's end: compare to the peak's scale, not the tiny value's
    assert rate["last"]["value"] == pytest.approx(last, rel=1e-6, abs=1e-6 * LR)


def test_json_is_the_plan(repo_root, data_dir):
    result = CliRunner().invoke(
        main, ["plan", str(repo_root / "configs" / "smoke.yaml"), "--set", "subdivisions=5", "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["data"] == {
        "name": "fashion_mnist",
        "source": str(data_dir),
        "train_examples": 3000,
        "validation_examples": 0,
        "augment": {"flip": False, "crop": 0},
        "trim_padding": None,
        "test_examples": 500,
        "input_shape": [28, 28, 1],
        "num_classes": 10,
        "class_names": [
            "T-shirt/top",
            "Trouser",
            "Pullover",
            "Dress",
            "Coat",
            "Sandal",
            "Shirt",
            "Sneaker",
            "Bag",
            "Ankle boot",
        ],
    }
    assert document["full_batch"] == {"size": 64, "count": 46, "micro_batches": [[1, 12], [4, 13]]}
    assert document["last_batch"] == {"size": 56, "micro_batches": [[4, 11], [1, 12]]}
    assert (document["updates_per_epoch"], document["epochs"], document["total_updates"]) == (47, 2, 94)
    assert document["warnings"] == []


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--set", "subdivisions=65"],
            "--set: subdivisions=65 must be <= batch_size=64 (a micro-batch holds at least one example)",
        ),
        (
            ["--set", "data.dir=/nonexistent/fmnist"],
            "data.dir=/nonexistent/fmnist does not exist: install it with 'apt-get install dataset-fashion-mnist' or "
            "download the four .gz files from http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/ into a "
            "folder named by data.dir or $ACCUM_TRAIN_DATA",
        ),
        (
            ["--set", "data.train_limit=10"],
            "--set: data.train_limit=10 is smaller than batch_size=64: raise it or lower batch_size",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(repo_root, in_empty_dir, extra, message):
    result = CliRunner().invoke(main, ["plan", str(repo_root / "configs" / "smoke.yaml"), *extra])
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {message}\n", "")
    assert os.listdir(in_empty_dir) == []
