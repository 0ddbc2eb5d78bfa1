"""'accum-train run --resume RUN --set subdivisions=N' (or micro_batch_size, or auto): the same batches cut into
other micro-batches, to within 1e-5 of the uninterrupted run (test_resume_cut.py: fit's door)."""

import json

import numpy as np
import pytest
from accum_train.cli.main import main
from accum_train.describe import describe
from click.testing import CliRunner
from helpers import max_difference, out_of_memory_at, records, run_keras_file, small_regressor

# a Keras model without BatchNorm (which normalises each micro-batch: another k changes its sums' terms), 48
# examples in updates of 12: 4 per epoch, k=2 as the run starts
RNG = np.random.default_rng(3)
ARRAYS = {
    "x_train": RNG.random((48, 6), dtype=np.float32),
    "y_train": RNG.random((48, 1), dtype=np.float32),
    "x_test": RNG.random((8, 6), dtype=np.float32),
    "y_test": RNG.random((8, 1), dtype=np.float32),
}
SETTINGS = "batch_size: 12\nsubdivisions: 2\nseed: 5\nlog_every: 1\noptimizer: {name: adam, learning_rate: 0.01}\n"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):  # weights in the model's order (a process names its layers anew)
    run = run_keras_file(tmp_path_factory.mktemp("full"), small_regressor(), ARRAYS, SETTINGS + "epochs: 2\n")
    return list(np.load(run / "weights.npz").values())


@pytest.mark.parametrize(
    "setting, k",
    [("subdivisions=4", 4), ("micro_batch_size=12", 1), ("subdivisions=auto", 1)],
    ids=["subdivisions", "micro_batch_size", "auto"],
)
def test_a_resume_cuts_the_same_batches_into_other_micro_batches(tmp_path, uninterrupted, setting, k):
    out = run_keras_file(tmp_path, small_regressor(), ARRAYS, SETTINGS + "epochs: 1\n")
    result = CliRunner().invoke(main, ["run", "--resume", str(out), "--set", "epochs=2", "--set", setting])
    assert result.exit_code == 0, result.output
    assert (
        max_difference(list(np.load(out / "weights.npz").values()), uninterrupted) < 1e-5
    )  # the sums are cut differently
    updates = [r for r in records(out) if "loss" in r]
    assert [r["step"] for r in updates] == list(range(1, 9))  # every update once
    assert [r["subdivisions"] for r in updates] == [2] * 4 + [k] * 4
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [(h["event"], h["step"], h["subdivisions"]) for h in history] == [("start", 0, 2), ("resume", 4, k)]


def test_after_running_out_of_memory_describe_says_how_to_resume_with_smaller_micro_batches(
    tmp_path, uninterrupted, monkeypatch
):
    """The run stops in its 7th update (k=2 out of memory); describe's way on doubles k, and that resume ends at
    the uninterrupted weights."""
    out_of_memory_at(monkeypatch, 7)
    (tmp_path / "model").mkdir()
    with pytest.raises(AssertionError, match="error: out of memory: update 7 ran out of memory"):  # exit code 3
        run_keras_file(tmp_path / "model", small_regressor(), ARRAYS, SETTINGS + "epochs: 2\n")
    monkeypatch.undo()
    out = tmp_path / "model" / "run"
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [(h["event"], h["step"], h["subdivisions"]) for h in history] == [("start", 0, 2), ("out_of_memory", 4, 2)]
    assert describe(out)["next"] == (
        f"resume with smaller micro-batches: accum-train run --resume {out} --set subdivisions=4"
    )
    result = CliRunner().invoke(main, ["run", "--resume", str(out), "--set", "subdivisions=4"])
    assert result.exit_code == 0, result.output
    assert max_difference(list(np.load(out / "weights.npz").values()), uninterrupted) < 1e-5
    assert [r["step"] for r in records(out) if "loss" in r] == list(range(1, 9))
