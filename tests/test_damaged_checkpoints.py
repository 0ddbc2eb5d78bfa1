"""Damaged checkpoints: a resume, evaluate, export and predict pass over a
latest checkpoint that does not read back whole for the newest intact one.

A 1-epoch smoke run (10 updates, checkpoints at 4, 8 and 10) is damaged in
copies; resumed to 2 epochs it must end at the weights of an uninterrupted
2-epoch run, with every update once in metrics.jsonl. Kinds of damage: a
truncated or altered data file, a missing data or index file, a truncated
index. With none intact: one line, exit 2, and not a byte changed.
"""

import hashlib
import json
import shutil

import numpy as np
import pytest
from accum_train.cli.main import main
from accum_train.trainer.store.checkpoints import (
    DAMAGED,
    checkpoint_numbers,
    newest_intact_checkpoint,
    pass_over_damaged,
)
from click.testing import CliRunner
from helpers import records, update_records

# Whole runs: in the slow suite with the other kill and resume cases (make test-slow), but for one cheap case in
# the default suite (a small MLP: the fallback and the repair, seconds).

SETTINGS = ["data.train_limit=640", "data.test_limit=200", "checkpoint.every_steps=4", "checkpoint.keep=3"]
DATA = "ckpt-{n}.data-00000-of-00001"


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, repo_root):
    """(a finished 1-epoch run, an uninterrupted 2-epoch run) of the smoke config."""
    base = tmp_path_factory.mktemp("damaged")
    made = []
    for epochs in (1, 2):
        out = base / f"epochs{epochs}"
        sets = [item for s in [*SETTINGS, f"epochs={epochs}"] for item in ("--set", s)]
        result = cli("run", repo_root / "configs" / "smoke.yaml", "--output-dir", out, *sets)
        assert result.exit_code == 0, result.output
        made.append(out)
    assert checkpoint_numbers(made[0] / "checkpoints") == [10, 8, 4]
    return made


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# (name, how the files of checkpoint n are damaged, the problem named for it)
DAMAGE = [
    ("truncated data", lambda d, n: truncate(d / DATA.format(n=n)), lambda d, n: "Read less bytes than requested"),
    ("altered data", lambda d, n: flip(d / DATA.format(n=n)), None),  # the CRC32C values differ per file
    (
        "missing data",
        lambda d, n: (d / DATA.format(n=n)).unlink(),
        lambda d, n: f"{d / DATA.format(n=n)}; No such file or directory",
    ),
    ("missing index", lambda d, n: (d / f"ckpt-{n}.index").unlink(), lambda d, n: "its .index file is missing"),
    ("truncated index", lambda d, n: truncate(d / f"ckpt-{n}.index"), None),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, damage, problem", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_each_kind_of_damage_is_found_and_the_next_checkpoint_used(tmp_path, runs, name, damage, problem):
    directory = tmp_path / "checkpoints"
    shutil.copytree(runs[0] / "checkpoints", directory)
    damage(directory, 10)
    said = []
    prefix, damaged = newest_intact_checkpoint(directory, "--resume ")
    assert prefix == str(directory / "ckpt-8")
    pass_over_damaged(prefix, damaged, said.append, repair=False)
    assert len(said) == 1
    head = "checkpoint ckpt-10 is damaged ("
    tail = "): using ckpt-8 instead; its files are left in place"
    assert said[0].startswith(head) and said[0].endswith(tail)
    if problem is not None:
        assert said[0] == head + problem(directory, 10) + tail
    assert checkpoint_numbers(directory) == [10, 8, 4]  # a reader moves nothing


def snapshot(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.slow
def test_resume_past_a_damaged_latest_equals_an_uninterrupted_run(tmp_path, runs):
    run_dir = tmp_path / "run"
    shutil.copytree(runs[0], run_dir)
    flip(run_dir / "checkpoints" / DATA.format(n=10))
    result = cli("run", "--resume", run_dir, "--set", "epochs=2")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    damaged = [line for line in lines if line.startswith("checkpoint ckpt-10 is damaged (")]
    assert len(damaged) == 1 and damaged[0].endswith(
        f"): using ckpt-8 instead; its files are moved to {run_dir / 'checkpoints' / DAMAGED}"
    )
    assert "resuming" in lines[lines.index(damaged[0]) + 1]
    assert f"resuming {run_dir} at update 8 of 20" in lines
    kept = sorted(p.name for p in (run_dir / "checkpoints" / DAMAGED).iterdir())
    assert kept == [DATA.format(n=10), "ckpt-10.index"]
    assert [r["step"] for r in update_records(run_dir)] == list(range(1, 21))  # each update once
    epochs = [r["epoch"] for r in records(run_dir)]
    assert epochs.count(1) == 11  # epoch 1's 10 updates (8 kept, 2 again) and its record, once
    ours, theirs = np.load(run_dir / "weights.npz"), np.load(runs[1] / "weights.npz")
    assert sorted(ours) == sorted(theirs)
    for key in ours:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=0, atol=1e-6, err_msg=key)


@pytest.mark.slow
def test_no_intact_checkpoint_is_one_line_exit_2_and_nothing_changed(tmp_path, runs):
    run_dir = tmp_path / "run"
    shutil.copytree(runs[0], run_dir)
    folder = run_dir / "checkpoints"
    truncate(folder / DATA.format(n=10))
    (folder / DATA.format(n=8)).unlink()
    (folder / "ckpt-4.index").unlink()
    before = snapshot(run_dir)
    result = cli("run", "--resume", run_dir, "--set", "epochs=2")
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: --resume {run_dir}: no intact checkpoint in {folder} (ckpt-10: Read less bytes than requested, "
        f"ckpt-8: {folder / DATA.format(n=8)}; No such file or directory, ckpt-4: its .index file is missing); "
        f"nothing was changed: start a new run\n"
    )
    assert snapshot(run_dir) == before


@pytest.mark.slow
def test_readers_use_the_newest_intact_checkpoint_and_move_nothing(tmp_path, runs):
    run_dir = tmp_path / "run"
    shutil.copytree(runs[0], run_dir)
    (run_dir / "checkpoints" / "ckpt-10.index").unlink()
    before = snapshot(run_dir)
    result = cli("export", run_dir, "--output", tmp_path / "model.keras")
    assert result.exit_code == 0, result.output
    assert (
        "checkpoint ckpt-10 is damaged (its .index file is missing): using ckpt-8 instead; its files are left in place"
        in result.stderr.splitlines()
    )
    assert snapshot(run_dir) == before


def test_a_resume_passes_over_a_damaged_latest_checkpoint_and_moves_it_aside(tmp_path, repo_root):
    """The default suite's case: a small MLP's latest checkpoint truncated; the resume says so in one line, moves
    its files to checkpoints/damaged/, goes on from the one before and ends with every update once."""
    sets = ["model.name=mlp", "model.hidden=32", "data.train_limit=600", "data.test_limit=100", "epochs=2"]
    sets = [item for s in [*sets, "checkpoint.every_steps=4", "log_every=2"] for item in ("--set", s)]
    out = tmp_path / "run"
    assert cli("run", repo_root / "configs" / "smoke.yaml", "--output-dir", out, *sets).exit_code == 0
    assert checkpoint_numbers(out / "checkpoints") == [20, 16, 12]
    truncate(out / "checkpoints" / DATA.format(n=20))
    (out / "summary.json").unlink()  # as if killed after the last checkpoint
    result = cli("run", "--resume", out)
    assert result.exit_code == 0, result.output
    assert (
        f"checkpoint ckpt-20 is damaged (Read less bytes than requested): using ckpt-16 instead; its files are "
        f"moved to {out / 'checkpoints' / DAMAGED}" in result.stdout.splitlines()
    )
    assert sorted(p.name for p in (out / "checkpoints" / DAMAGED).iterdir()) == [DATA.format(n=20), "ckpt-20.index"]
    assert [r["step"] for r in update_records(out)] == list(range(1, 21))
    assert json.loads((out / "summary.json").read_text())["steps"] == 20
