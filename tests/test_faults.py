"""Faults inside a run: non-finite updates, a checkpoint write that fails,
and nothing listening on the network. (Kills are in test_kills.py, marked slow.)"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from accum_train.cli.main import main
from accum_train.config import load_config
from accum_train.errors import TrainingStopped
from accum_train.from_config.lifecycle import train
from accum_train.reload import load_run
from click.testing import CliRunner
from helpers import poison, records

# Where a fault leaves a run does not depend on its model or length: smoke.yaml with a small MLP on 600 examples,
# 10 updates per epoch (the last a short one of 24). A run is then mostly its start-up (tracing).
SHORT = ["model.name=mlp", "model.hidden=32", "data.train_limit=600", "data.test_limit=100"]


def test_non_finite_updates_are_skipped_and_counted(tmp_path, repo_root, monkeypatch):
    poison(monkeypatch, {3, 4})
    cfg = load_config(repo_root / "configs" / "smoke.yaml", [*SHORT, "epochs=1", "log_every=1"])
    summary = train(cfg, tmp_path / "run")
    updates = [r for r in records(tmp_path / "run") if "skipped" in r]
    assert [r["step"] for r in updates if r["skipped"]] == [3, 4]
    assert all(r["loss"] is None for r in updates if r["skipped"])
    assert all(np.isfinite(r["loss"]) for r in updates if not r["skipped"])
    assert summary["skipped_updates"] == 2 and summary["steps"] == 10
    epoch = next(r for r in records(tmp_path / "run") if "test_accuracy" in r)
    assert np.isfinite(epoch["train_loss"])
    assert all(np.all(np.isfinite(a)) for a in np.load(tmp_path / "run" / "weights.npz").values())


def test_too_many_bad_updates_in_a_row_stop_the_run_with_the_last_good_state(tmp_path, repo_root, monkeypatch):
    after_five = poison(monkeypatch, set(range(6, 100)), snapshot_after=5)
    cfg = load_config(repo_root / "configs" / "smoke.yaml", ["epochs=1", "log_every=1", "max_bad_steps=3"])
    with pytest.raises(TrainingStopped) as err:
        train(cfg, tmp_path / "run")
    assert str(err.value) == (
        "3 updates in a row had a non-finite loss or gradient (max_bad_steps=3), the last at update 8; "
        "weights are checkpointed as of the last good update: lower optimizer.learning_rate or set "
        f"optimizer.clip_norm, then resume with --resume {tmp_path / 'run'}"
    )
    reader = tf.train.load_checkpoint(str(tmp_path / "run" / "checkpoints"))
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 8
    assert reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 5  # 5 applied updates
    # every weight and moving statistic as it was after update 5 is what the checkpoint holds, name by name
    saved = {name: v.numpy() for name, v in load_run(tmp_path / "run").model.named_weights().items()}
    assert sorted(saved) == sorted(after_five)
    assert len(saved) == 5 + 5 * 4 + 2  # conv filters; BatchNorm beta, gamma, moving mean and variance; dense
    for name, array in after_five.items():
        np.testing.assert_array_equal(saved[name], array, err_msg=name)
    assert load_config(repo_root / "configs" / "smoke.yaml").max_bad_steps == 10  # the default


@pytest.mark.parametrize(
    "changes",
    [["optimizer.learning_rate=0.001"], ["optimizer.clip_norm=1.0"]],
    ids=["a lower constant rate", "clipping"],
)
def test_the_fix_the_stop_names_can_be_resumed_with(tmp_path, repo_root, monkeypatch, changes):
    """max_bad_steps' line says to lower optimizer.learning_rate or set optimizer.clip_norm, then resume: --resume
    takes either, and the updates after the checkpoint use it (a constant rate is an optimizer variable, which
    the checkpoint restores; the config's replaces it)."""
    poison(monkeypatch, set(range(6, 100)))
    sets = [*SHORT, "epochs=1", "log_every=1", "max_bad_steps=3"]
    with pytest.raises(TrainingStopped):
        train(load_config(repo_root / "configs" / "smoke.yaml", sets), tmp_path / "run")
    monkeypatch.undo()  # the data are fine again
    from accum_train.from_config.source import resume_config

    summary = train(resume_config(tmp_path / "run", overrides=changes), tmp_path / "run", resume=True)
    assert summary["steps"] == 10
    updates = [r for r in records(tmp_path / "run") if "skipped" in r]
    assert [r["step"] for r in updates] == list(range(1, 11))  # the skipped ones after the checkpoint dropped
    rate = 0.001 if "learning_rate" in changes[0] else 0.003
    assert [r["learning_rate"] for r in updates[8:]] == [pytest.approx(rate)] * 2
    resumed_with = load_config(repo_root / "configs" / "smoke.yaml", sets + changes)
    assert load_config(tmp_path / "run" / "config.yaml") == resumed_with  # config.yaml says what it ran with


def test_cli_reports_the_stop_with_exit_1(tmp_path, repo_root, monkeypatch):
    poison(monkeypatch, set(range(1, 100)))
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main,
        [
            "run",
            str(repo_root / "configs" / "smoke.yaml"),
            "--output-dir",
            str(out),
            *(arg for setting in SHORT for arg in ("--set", setting)),
            "--set",
            "max_bad_steps=2",
            "--set",
            "log_every=1",
        ],
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("error: 2 updates in a row had a non-finite loss or gradient (max_bad_steps=2)")
    assert result.stderr.count("\n") == 1


def test_checkpoint_write_failure_keeps_the_last_checkpoint(tmp_path, repo_root, monkeypatch):
    real_save = tf.train.CheckpointManager.save
    saves = [0]

    def full_disk(self, checkpoint_number=None, **kwargs):
        saves[0] += 1
        if saves[0] == 3:  # ckpt-0, ckpt-10 (epoch 1), then the disk is full
            # a half-written file is left behind, as a real full disk would leave it
            (tmp_path / "run" / "checkpoints" / f"ckpt-{checkpoint_number}_temp").mkdir()
            raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")
        return real_save(self, checkpoint_number=checkpoint_number, **kwargs)

    monkeypatch.setattr(tf.train.CheckpointManager, "save", full_disk)
    sets = [arg for setting in SHORT for arg in ("--set", setting)]
    result = CliRunner().invoke(
        main, ["run", str(repo_root / "configs" / "smoke.yaml"), *sets, "--output-dir", str(tmp_path / "run")]
    )
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: cannot write checkpoint 20 in {tmp_path / 'run' / 'checkpoints'} (No space left on device): "
        f"free space or fix permissions, then resume with --resume {tmp_path / 'run'} "
        f"(the last complete checkpoint, ckpt-10, is intact)\n"
    )
    assert tf.train.latest_checkpoint(str(tmp_path / "run" / "checkpoints")).endswith("ckpt-10")
    monkeypatch.undo()
    resumed = CliRunner().invoke(main, ["run", "--resume", str(tmp_path / "run")])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 20


def listening_inodes():
    """Inodes of the sockets listening on TCP (v4 and v6) in this network namespace."""
    tables = [Path(table) for table in ("/proc/net/tcp", "/proc/net/tcp6")]
    if not tables[0].is_file():  # without it the check below would pass having checked nothing
        pytest.fail("/proc/net/tcp is missing: this check needs Linux's /proc to see listening sockets")
    inodes = set()
    for table in tables:
        if table.is_file():
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    inodes.add(fields[9])
    return inodes


def test_a_run_opens_no_listening_socket(tmp_path, repo_root):
    before = listening_inodes()
    train(load_config(repo_root / "configs" / "smoke.yaml", [*SHORT, "epochs=1"]), tmp_path / "run")
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[len("socket:[") : -1])
    assert not (mine & (listening_inodes() - before))


def test_the_checkpoint_list_after_a_damaged_latest_is_what_tensorflow_reads(tmp_path, monkeypatch):
    """A resume past a damaged checkpoint rewrites the 'checkpoint' file (the intact ones, the chosen one last)
    itself: TensorFlow's deprecated writer for it printed a warning into the run's output."""
    from accum_train.trainer.store import checkpoints

    def deprecated(*args, **kwargs):
        raise AssertionError("tf.compat.v1.train.update_checkpoint_state is deprecated: not to be called")

    monkeypatch.setattr(tf.compat.v1.train, "update_checkpoint_state", deprecated)
    for n in (2, 4, 6):
        (tmp_path / f"ckpt-{n}.index").write_bytes(b"")
    checkpoints._rewrite_checkpoint_list(tmp_path, 4)
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert state.model_checkpoint_path == str(tmp_path / "ckpt-4")
    assert list(state.all_model_checkpoint_paths) == [str(tmp_path / "ckpt-2"), str(tmp_path / "ckpt-4")]
