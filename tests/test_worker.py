"""The core's own training process (``python -m accum_train.worker``), which ``--workers`` and ``compare``
start: it says what ``accum-train run --quiet`` says and ends as the CLI does, without the CLI."""

import json
import sys

import pytest
from accum_train import worker
from accum_train.cli.main import main as cli
from accum_train.processes import RESTARTS, training_process
from click.testing import CliRunner
from helpers import records


def test_its_command_runs_the_core_s_entry_point():
    assert training_process("c.yaml", "--output-dir", "run") == [
        sys.executable,
        "-m",
        "accum_train.worker",
        "c.yaml",
        "--output-dir",
        "run",
    ]


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["missing.yaml", "--output-dir", "out"],
            ("error: config file missing.yaml does not exist: pass the path of a YAML file, e.g. configs/fmnist.yaml"),
        ),
        (["CONFIG", "--output-dir", "out", "--set", "subdivisions=0"], None),  # the CLI's own line, compared
    ],
)
def test_bad_input_ends_in_the_cli_s_one_line_and_exit_code(args, line, repo_root, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = [str(repo_root / "configs" / "smoke.yaml") if a == "CONFIG" else a for a in args]
    with pytest.raises(SystemExit) as ended:
        worker.main(args)
    assert ended.value.code == 2
    printed = capsys.readouterr()
    by_cli = CliRunner().invoke(cli, ["run", *args])
    assert by_cli.exit_code == 2 and printed.err == by_cli.stderr
    assert printed.out == "" and len(printed.err.splitlines()) == 1
    if line is not None:
        assert printed.err == line + "\n"
    assert not (tmp_path / "out").exists()


def test_a_run_prints_the_epoch_lines_and_the_last_line(repo_root, data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ACCUM_TRAIN_DATA", str(data_dir))
    monkeypatch.setenv(RESTARTS, "2")  # what the --workers supervisor tells a worker after two restarts
    run_dir = tmp_path / "run"
    sets = ["data.train_limit=256", "data.test_limit=64", "batch_size=128", "epochs=2"]
    worker.main(
        [str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(run_dir), *(f"--set={s}" for s in sets)]
    )
    lines = capsys.readouterr().out.splitlines()
    summary = json.loads((run_dir / "summary.json").read_text())
    last = [r for r in records(run_dir) if "elapsed_s" in r][-1]
    assert lines[0] == "batch_size=128 as 4 micro-batches of 32 examples"  # the run's messages, as they come
    assert [line.split(":")[0] for line in lines[1:3]] == ["epoch 1/2", "epoch 2/2"]
    assert lines[2].startswith(f"epoch 2/2: train loss {last['train_loss']:.4f}, test loss ")
    assert summary["restarts"] == 2  # summary.json counts them (test_restarts: after real restarts)
    assert len(lines) == 4 and lines[-1] == (
        f"test accuracy {summary['test_accuracy']:.4f} (test loss {summary['test_loss']:.4f}) after 4 updates "
        f"in {summary['wall_time_s']:.0f} s; run directory: {run_dir}"
    )
