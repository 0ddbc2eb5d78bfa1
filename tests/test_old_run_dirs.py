"""Run directories the released versions wrote, each stopped part-way by SIGINT (tests/data/old_runs, made as its
make/README.md says), resumed with today's code: the run ends at its full length, metrics.jsonl holds every update
once, and the weights are those of an uninterrupted run of today's code with the same config or call."""

import json
import shutil
from pathlib import Path

import accum_train
import keras
import numpy as np
import pytest
from accum_train.cli.main import main
from accum_train.trainer.store.checkpoints import checkpoint_numbers
from accum_train.trainer.store.metrics_log import is_epoch_record, read_metrics
from click.testing import CliRunner
from helpers import load_file, max_difference

pytestmark = pytest.mark.slow  # about 13 s: two uninterrupted runs and three resumes

OLD = Path(__file__).resolve().parent / "data" / "old_runs"
CONFIG = OLD / "make" / "cli.yaml"
# cli.yaml: 600 examples in batches of 64 is 10 updates an epoch, 2 epochs; the fixtures stopped after update 13
CLI_STEPS, CLI_EPOCH_STEPS, CLI_STOPPED = 20, 10, 13
FIT_STOPPED = 5  # of make_fit.py's 36 updates, 12 an epoch


class ResumeFailed(Exception):
    """Today's code did not resume an old run directory."""


def copy_of(name: str, tmp_path: Path) -> Path:
    run_dir = tmp_path / name
    shutil.copytree(OLD / name, run_dir)
    return run_dir


@pytest.fixture(scope="module")
def uninterrupted_cli(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "full"
    result = CliRunner().invoke(main, ["run", str(CONFIG), "--output-dir", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    return out


# 0.1.0's checkpoints hold neither the replica count k was chosen for ("replicas", tracked since 57bbcbc) nor the
# noise scale's sums ("noise_trace", "noise_signal", "noise_weight", since 2274d27): the CLI restores them only where a
# checkpoint has them (run_parts.Run's ``later``). Before, the resume ended in TensorFlow's AssertionError ("Found 4
# Python objects that were not bound to checkpointed values"), exit 1 with a traceback, in 0.2.0 too.
@pytest.mark.parametrize("release", ["0.1.0", "0.2.0"])
def test_an_interrupted_cli_run_directory_resumes_to_the_uninterrupted_run(release, tmp_path, uninterrupted_cli):
    run_dir = copy_of(f"cli-{release}", tmp_path)
    assert checkpoint_numbers(run_dir / "checkpoints")[0] == CLI_STOPPED  # the premise: stopped part-way
    result = CliRunner().invoke(main, ["run", str(CONFIG), "--resume", str(run_dir), "--quiet"])
    if result.exit_code != 0:
        raise ResumeFailed(f"exit {result.exit_code}: {result.output} {result.exception!r}")
    # from the fixture's last checkpoint, not an earlier one nor the start
    assert result.output.splitlines()[0] == f"resuming {run_dir} at update {CLI_STOPPED} of {CLI_STEPS}"
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == CLI_STEPS
    assert checkpoint_numbers(run_dir / "checkpoints")[0] == CLI_STEPS

    records, expected = read_metrics(run_dir / "metrics.jsonl"), read_metrics(uninterrupted_cli / "metrics.jsonl")
    updates = [r for r in records if not is_epoch_record(r)]
    assert [r["step"] for r in updates] == list(range(1, CLI_STEPS + 1))  # every update once
    epochs = [r for r in records if is_epoch_record(r)]
    assert [(r["epoch"], r["step"]) for r in epochs] == [(1, CLI_EPOCH_STEPS), (2, CLI_STEPS)]
    # the old release's records and today's continue the uninterrupted run's; epoch 2's train loss sums both
    assert [r["loss"] for r in updates] == pytest.approx(
        [r["loss"] for r in expected if not is_epoch_record(r)], rel=1e-6
    )
    assert [r["train_loss"] for r in epochs] == pytest.approx(
        [r["train_loss"] for r in expected if is_epoch_record(r)], rel=1e-6
    )

    weights, uninterrupted = np.load(run_dir / "weights.npz"), np.load(uninterrupted_cli / "weights.npz")
    assert sorted(weights.files) == sorted(uninterrupted.files)
    names = sorted(weights.files)
    assert max_difference([weights[n] for n in names], [uninterrupted[n] for n in names]) <= 1e-5  # 0.0 when written


@pytest.fixture(scope="module")
def make_fit():
    """The script that wrote fit-0.2.0: its model_and_data and CALL are what the resume repeats."""
    return load_file(OLD / "make" / "make_fit.py", "make_fit")


@pytest.fixture(scope="module")
def uninterrupted_fit(make_fit, tmp_path_factory):
    model, x, y = make_fit.model_and_data()
    out = tmp_path_factory.mktemp("fit") / "full"
    history = accum_train.fit(model, x, y, **make_fit.CALL, output_dir=out)
    return model.get_weights(), history.history, read_metrics(out / "metrics.jsonl")


class CountUpdates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1


def test_an_interrupted_fit_output_dir_of_0_2_0_resumes_to_the_uninterrupted_call(
    tmp_path, make_fit, uninterrupted_fit
):
    run_dir = copy_of("fit-0.2.0", tmp_path)
    assert checkpoint_numbers(run_dir / "checkpoints") == [FIT_STOPPED]  # the premise: stopped part-way
    model, x, y = make_fit.model_and_data()
    counted = CountUpdates()
    history = accum_train.fit(model, x, y, **make_fit.CALL, output_dir=run_dir, callbacks=[counted])
    assert counted.seen == make_fit.UPDATES - FIT_STOPPED  # went on from the fixture's checkpoint
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["steps"], summary["epochs"]) == (make_fit.UPDATES, make_fit.CALL["epochs"])

    weights, expected, expected_records = uninterrupted_fit
    records = read_metrics(run_dir / "metrics.jsonl")
    updates = [r for r in records if not is_epoch_record(r)]
    assert [r["step"] for r in updates] == list(range(1, make_fit.UPDATES + 1))  # every update once
    assert [r["step"] for r in records if is_epoch_record(r)] == [12, 24, 36]
    # 0.2.0 wrote update 3's undefined noise scale as NaN, which strict JSON readers refuse: the resume, which
    # writes the records it keeps again, writes it as null
    assert updates[2]["noise_scale"] is None
    assert [r["loss"] for r in updates] == pytest.approx(
        [r["loss"] for r in expected_records if not is_epoch_record(r)], rel=1e-6
    )
    assert history.epoch == [0, 1, 2]  # the whole run's, the first epoch's logs partly the old release's
    for name in ("loss", "accuracy"):
        assert history.history[name] == pytest.approx(expected[name], rel=1e-6), name

    assert max_difference(model.get_weights(), weights) <= 1e-5  # 0.0 when written
    assert (run_dir / "initial_model.keras").is_file()  # what 0.2.0 did not keep, for the readers
    assert (run_dir / "model.keras").is_file()
