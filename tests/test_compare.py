"""`accum-train compare`: the gradient check, compare.json with every field, a
PNG that decodes, and a baseline that runs out of memory while the subdivided
run goes on."""

import dataclasses
import json

import matplotlib.image
import pytest
from accum_train.cli.main import main
from accum_train.compare import gradient_check
from accum_train.config import load_config
from accum_train.datasets import fashion_mnist
from click.testing import CliRunner

SUMMARY_KEYS = {
    "test_accuracy",
    "test_loss",
    "steps",
    "examples_seen",
    "wall_time_s",
    "cpu_time_s",
    "peak_memory_bytes",
    "peak_rss_bytes",
}


@pytest.fixture(scope="module")
def small_data(data_dir):
    return fashion_mnist.load(str(data_dir), train_limit=3000, test_limit=500, allow_download=False)


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.norm=none"],
        ["model.norm=none", "subdivisions=7"],  # 64 / 7: ragged micro-batches
        ["model.name=mlp", "model.norm=none", "subdivisions=64"],
    ],
)
def test_gradient_check_without_batchnorm_is_exact(repo_root, small_data, overrides):
    cfg = load_config(repo_root / "configs" / "smoke.yaml", overrides)
    check = gradient_check(cfg, small_data)
    # Per variable, relative to the variable's own gradient. conv5's bias gradient sums 64 x 49 terms that
    # mostly cancel: float32 rounds that sum to 1.2e-5 of its small result under one thread per op (the
    # test pools, conftest.py), while the largest absolute difference anywhere is 2.3e-7.
    assert check["max_rel_diff"] <= 2e-5
    assert check["max_abs_diff"] <= 1e-6
    assert check["bn_inference_mode"] is None
    assert set(check["per_variable"]) >= {"logits/weights", "logits/biases"}


def test_gradient_check_cuts_the_batch_as_micro_batch_size_says(repo_root, small_data):
    """micro_batch_size=10 of smoke's batch 64: k=7 (micro-batches of 9-10), checked against one pass."""
    check = gradient_check(
        load_config(repo_root / "configs" / "smoke.yaml", ["model.norm=none", "micro_batch_size=10"]), small_data
    )
    assert check["subdivisions"] == 7
    assert check["max_abs_diff"] <= 1e-6


def test_gradient_check_measures_the_engine_itself(repo_root, small_data, monkeypatch):
    """Break the engine (each micro-batch counted twice) and the check must see it."""
    from accum_train.backends.tensorflow.engine import Accumulator
    from accum_train.trainer.data.batching import as_data

    real = Accumulator._micro
    monkeypatch.setattr(Accumulator, "_micro", lambda self, data, n, prepare=as_data: real(self, data, n // 2, prepare))
    check = gradient_check(load_config(repo_root / "configs" / "smoke.yaml", ["model.norm=none"]), small_data)
    assert check["max_rel_diff"] == pytest.approx(1.0, rel=1e-4)  # twice the gradient: off by its own size


def test_gradient_check_with_batchnorm_isolates_micro_batch_statistics(repo_root, small_data):
    cfg = load_config(repo_root / "configs" / "smoke.yaml")
    check = gradient_check(cfg, small_data)
    assert check["max_rel_diff"] > 1e-3  # normalising per micro-batch changes the gradient...
    assert check["bn_inference_mode"]["max_rel_diff"] <= 1e-5  # ...and nothing else does
    assert "bn1/gamma" in check["per_variable"]


@pytest.fixture(scope="module")  # two training runs in fresh processes: the tests using it are slow
def compared(tmp_path_factory, repo_root):
    out = tmp_path_factory.mktemp("cmp") / "cmp"
    result = CliRunner().invoke(
        main, ["compare", str(repo_root / "configs" / "smoke.yaml"), "--set", "epochs=2", "--output-dir", str(out)]
    )
    assert result.exit_code == 0, result.output
    return out, result


@pytest.mark.slow
def test_compare_json_has_every_field(compared):
    out, _ = compared
    data = json.loads((out / "compare.json").read_text())
    check = data["gradient_check"]
    assert set(check) >= {"max_abs_diff", "max_rel_diff", "per_variable", "bn_inference_mode"}
    for side in ("baseline", "subdivided"):
        assert data[side]["status"] == "ok"
        assert set(data[side]["summary"]) >= SUMMARY_KEYS
        curves = data[side]["curves"]
        assert curves["epoch"] == [1, 2]
        assert all(len(curves[k]) == 2 for k in ("train_loss", "test_loss", "test_accuracy"))
        # each side left a complete run directory
        run_dir = out / side
        assert json.loads((run_dir / "summary.json").read_text()) == {
            k: v for k, v in data[side]["summary"].items() if k != "examples_per_s"
        }
    assert data["baseline"]["summary"]["baseline"] is True
    assert data["subdivided"]["summary"]["subdivisions"] == 4
    ratios = data["ratios"]
    for key in ("wall_time_s", "cpu_time_s", "examples_per_s", "peak_memory_bytes", "peak_rss_bytes"):
        expected = data["subdivided"]["summary"][key] / data["baseline"]["summary"][key]
        assert ratios[key] == pytest.approx(expected)
    # Same seed (initial weights, data order) and everything else: only `baseline` differs.
    base_cfg, sub_cfg = (load_config(out / side / "config.yaml") for side in ("baseline", "subdivided"))
    assert (base_cfg.baseline, sub_cfg.baseline) == (True, False)
    assert dataclasses.replace(base_cfg, baseline=False) == sub_cfg == load_config(out / "config.yaml")


@pytest.mark.slow
def test_compare_png_decodes(compared):
    out, _ = compared
    image = matplotlib.image.imread(out / "compare.png")
    assert image.shape[0] > 300 and image.shape[1] > 1000


@pytest.mark.slow
def test_compare_table(compared):
    out, result = compared
    lines = result.stdout.splitlines()
    header = lines.index("epoch |           baseline            |          subdivided          ")
    assert lines[header + 2].startswith("    1 | ") and lines[header + 3].startswith("    2 | ")
    data = json.loads((out / "compare.json").read_text())
    row = f"{data['subdivided']['curves']['test_accuracy'][1]:>7.4f}"
    assert lines[header + 3].endswith(row)
    ratio = data["ratios"]["peak_memory_bytes"]
    assert any(line.startswith("TF allocator peak") and line.endswith(f"{ratio:.2f}x") for line in lines)
    assert lines[-1] == f"written: {out / 'compare.json'}, {out / 'compare.png'}"
    # the check opens the run as it ends the table, its BatchNorm line beside it: a large difference explained
    check, bn = data["gradient_check"], data["gradient_check"]["bn_inference_mode"]
    said = [
        f"gradient check, first batch, initial weights, k=4: max abs diff {check['max_abs_diff']:.3g}, "
        f"max rel diff {check['max_rel_diff']:.3g}",
        f"  with BatchNorm in inference mode: max abs diff {bn['max_abs_diff']:.3g}, "
        f"max rel diff {bn['max_rel_diff']:.3g} (the rest is micro-batch statistics)",
    ]
    assert lines[:2] == said and lines[-3:-1] == said


@pytest.mark.slow
def test_baseline_out_of_memory_is_reported_and_subdivided_still_runs(tmp_path, repo_root):
    # The limit must lie between the two peaks on any CPU. Measured with AVX2: the whole batch of 2000 peaks at
    # 176 MiB of TensorFlow memory, 20 micro-batches of 100 one at a time (memory_limit is set) at 68 MiB
    # (oneDNN's AVX2 kernels keep larger buffers); with AVX-512, a batch of 1000 at 88 MiB and micro-batches
    # of 100 at 11 MiB.
    out = tmp_path / "cmp"
    result = CliRunner().invoke(
        main,
        [
            "compare",
            str(repo_root / "configs" / "smoke.yaml"),
            "--output-dir",
            str(out),
            "--set",
            "batch_size=2000",
            "--set",
            "subdivisions=20",
            "--set",
            "epochs=1",
            "--set",
            "memory_limit=100MiB",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "compare.json").read_text())
    assert data["baseline"]["status"] == "out_of_memory"
    assert data["baseline"]["message"].startswith("out of memory: update 1 peaked at ")
    assert data["baseline"]["message"].endswith(
        " MiB of TensorFlow memory with the whole batch in one pass, over memory_limit=100MiB: "
        "raise memory_limit or use more subdivisions"
    )
    assert data["subdivided"]["status"] == "ok" and data["ratios"] is None
    assert data["subdivided"]["summary"]["peak_memory_bytes"] < 100 * 2**20
    assert f"baseline: {data['baseline']['message']}" in result.stdout.splitlines()
    assert "Traceback" not in result.output
    matplotlib.image.imread(out / "compare.png")


def test_gradient_check_of_an_embedding_s_row_gradients_is_exact(tmp_path):
    """A keras_file model whose Embedding's gradient comes as tf.IndexedSlices (rows), densified to compare."""
    import keras
    import numpy as np
    from accum_train.config.parse import config_from_dict
    from accum_train.from_config.build import load_data

    keras.utils.set_random_seed(0)
    tokens = keras.Input((12,), dtype="int32")
    hidden = keras.layers.Embedding(20, 4)(tokens)
    model = keras.Model(tokens, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(hidden)))
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # its task's loss: any arrays
    model.save(tmp_path / "model.keras")
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 20, (64, 12)).astype(np.int32), rng.integers(0, 3, 64)
    np.savez(tmp_path / "data.npz", x_train=x, y_train=y, x_test=x[:8], y_test=y[:8])
    cfg = config_from_dict(
        {
            "model": {"name": "keras_file", "path": str(tmp_path / "model.keras")},
            "data": {"name": "npz", "path": str(tmp_path / "data.npz")},
            "batch_size": 32,
            "subdivisions": 4,
        }
    )
    check = gradient_check(cfg, load_data(cfg))
    assert check["max_abs_diff"] <= 1e-6 and check["max_rel_diff"] <= 1e-5
    assert len(check["per_variable"]) == 3  # the embedding's table, the kernel and the bias
