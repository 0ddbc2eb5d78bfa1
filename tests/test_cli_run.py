"""`accum-train run` end to end on configs/smoke.yaml: every file of the run
directory read back, interrupt + --resume equal to an uninterrupted run, and
the run-directory errors."""

import json
import os
import shutil
import signal

import helpers
import numpy as np
import pytest
import tensorflow as tf
import yaml
from accum_train.cli.main import main
from accum_train.config import load_config
from accum_train.errors import Interrupted
from accum_train.from_config.lifecycle import train
from click.testing import CliRunner
from helpers import InterruptAt, max_difference, records

SUMMARY_KEYS = {
    "test_accuracy",
    "test_loss",
    "steps",
    "examples_seen",
    "wall_time_s",
    "peak_memory_bytes",
    "peak_rss_bytes",
}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, repo_root):
    out = tmp_path_factory.mktemp("runs") / "smoke"
    result = CliRunner().invoke(
        main,
        [
            "run",
            str(repo_root / "configs" / "smoke.yaml"),
            "--output-dir",
            str(out),
            "--set",
            "checkpoint.every_steps=20",
        ],
    )
    assert result.exit_code == 0, result.output
    return out, result, load_config(repo_root / "configs" / "smoke.yaml", ["checkpoint.every_steps=20"])


def test_run_prints_accuracy_and_epoch_lines(smoke_run):
    out, result, _ = smoke_run
    lines = result.stdout.splitlines()
    assert lines[0] == "batch_size=64 as 4 micro-batches of 16 examples"
    assert [line.split(":")[0] for line in lines[1:3]] == ["epoch 1/2", "epoch 2/2"]
    summary = json.loads((out / "summary.json").read_text())
    assert lines[-1].startswith(f"test accuracy {summary['test_accuracy']:.4f} ")
    assert lines[-1].endswith(f"run directory: {out}")


def test_config_yaml_is_the_resolved_config(smoke_run):
    out, _, cfg = smoke_run
    assert load_config(out / "config.yaml") == cfg
    assert yaml.safe_load((out / "config.yaml").read_text())["subdivisions"] == 4


def test_metrics_jsonl_has_every_update_and_epoch(smoke_run):
    out, _, _ = smoke_run
    records = helpers.records(out)
    updates = [r for r in records if "loss" in r]
    epochs = [r for r in records if "test_accuracy" in r]
    # 3000 examples / 64 = 46 full updates and one of 56, per epoch.
    assert [r["step"] for r in updates] == list(range(1, 95))
    one_epoch = [64 * i for i in range(1, 47)] + [3000]
    assert [r["examples_seen"] for r in updates] == one_epoch + [3000 + n for n in one_epoch]
    assert [r["epoch"] for r in updates] == [1] * 47 + [2] * 47
    assert all(set(r) >= {"epoch", "step", "examples_seen", "loss", "learning_rate"} for r in updates)
    assert all(r["learning_rate"] == pytest.approx(0.003) and np.isfinite(r["loss"]) for r in updates)
    assert [(r["epoch"], r["step"]) for r in epochs] == [(1, 47), (2, 94)]
    assert all(set(r) >= {"epoch", "test_loss", "test_accuracy", "elapsed_s", "examples_per_s"} for r in epochs)
    assert updates[-1]["loss"] < updates[0]["loss"]


def test_tensorboard_events_hold_the_scalars(smoke_run):
    out, _, _ = smoke_run
    files = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    tags, values = {}, {}
    for event in tf.compat.v1.train.summary_iterator(str(files[0])):
        for value in event.summary.value:
            tags.setdefault(value.tag, []).append(event.step)
            values.setdefault(value.tag, []).append(float(tf.make_ndarray(value.tensor)))
    assert tags["train/loss"] == list(range(1, 95))
    assert tags["epoch/test_accuracy"] == [47, 94]
    # each update's scalars are its record's, as float32 (written a flush at a time, one graph call per tag)
    records = helpers.records(out)
    updates = [r for r in records if "loss" in r]
    for key in ("loss", "learning_rate", "noise_scale"):
        expected = [r[key] for r in updates if r[key] is not None]
        assert values[f"train/{key}"] == np.float32(expected).tolist()
    accuracies = [r["test_accuracy"] for r in records if "elapsed_s" in r]
    assert values["epoch/test_accuracy"] == np.float32(accuracies).tolist()


def test_the_noise_scale_is_in_every_record_and_in_tensorboard(smoke_run):
    """Each update's record carries the running estimate after it, each epoch's the estimate at its last update,
    summary.json the last; TensorBoard has both (k = 4 micro-batches: every applied update measures)."""
    out, _, _ = smoke_run
    records = helpers.records(out)
    updates = [r for r in records if "loss" in r]
    epochs = [r for r in records if "elapsed_s" in r]
    assert all(isinstance(r["noise_scale"], float) and r["noise_scale"] > 0 for r in updates[5:])
    assert [e["noise_scale"] for e in epochs] == [updates[46]["noise_scale"], updates[93]["noise_scale"]]
    assert json.loads((out / "summary.json").read_text())["noise_scale"] == epochs[-1]["noise_scale"]
    tags = {}
    for event in tf.compat.v1.train.summary_iterator(str(next((out / "tensorboard").glob("events.out.tfevents.*")))):
        for value in event.summary.value:
            tags.setdefault(value.tag, []).append(event.step)
    assert tags["epoch/noise_scale"] == [47, 94]
    assert tags["train/noise_scale"] == [r["step"] for r in updates if r["noise_scale"] is not None]


def test_summary_and_weights_match_the_last_checkpoint(smoke_run):
    out, _, _ = smoke_run
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS
    assert (summary["steps"], summary["examples_seen"]) == (94, 6000)
    # 10 classes: chance is 0.1; the smoke config reaches 0.696 (deterministic on CPU)
    assert summary["test_accuracy"] >= 0.6
    assert summary["peak_memory_bytes"] > 0 and summary["peak_rss_bytes"] > summary["peak_memory_bytes"] / 10
    weights = np.load(out / "weights.npz")
    assert "conv1/filters" in weights and "bn5/moving_var" in weights and "logits/weights" in weights
    latest = tf.train.latest_checkpoint(str(out / "checkpoints"))
    assert latest.endswith("ckpt-94")
    reader = tf.train.load_checkpoint(latest)
    saved = {k: reader.get_tensor(k) for k, _ in tf.train.list_variables(latest) if k.startswith("weights/")}
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 94
    assert sorted(int(a.size) for a in saved.values()) == sorted(int(a.size) for a in weights.values())
    # every_steps=20 saves steps 20, 40, 60, 80 as well as the epoch ends 47 and 94; keep=3 keeps the last three
    kept = sorted(
        int(p.split("-")[-1])
        for p in tf.train.get_checkpoint_state(str(out / "checkpoints")).all_model_checkpoint_paths
    )
    assert kept == [60, 80, 94]


# smoke.yaml on 600 examples, 10 updates per epoch (the last a short one of 24): a resume reaches the
# uninterrupted weights after any number of updates, and a few keep the three runs short
SHORT = ["data.train_limit=600", "data.test_limit=100"]


# epoch 1, epoch 2: both in the slow suite (test_loop's in-process signals and test_kills cover the default one)
@pytest.mark.parametrize("stop_at", [pytest.param(2, marks=pytest.mark.slow), pytest.param(15, marks=pytest.mark.slow)])
def test_interrupt_then_resume_equals_an_uninterrupted_run(tmp_path, repo_root, data_dir, stop_at):
    cfg = load_config(repo_root / "configs" / "smoke.yaml", [*SHORT, "log_every=1", "optimizer.schedule.name=cosine"])
    full = train(cfg, tmp_path / "full")
    with pytest.raises(Interrupted) as stop:
        train(cfg, tmp_path / "cut", progress=InterruptAt(stop_at))
    assert stop.value.step == stop_at and stop.value.signum == signal.SIGINT
    assert not (tmp_path / "cut" / "weights.npz").exists()
    resumed = train(cfg, tmp_path / "cut", resume=True)
    a, b = np.load(tmp_path / "full" / "weights.npz"), np.load(tmp_path / "cut" / "weights.npz")
    assert sorted(a) == sorted(b)
    assert max_difference(a, b) < 1e-6
    assert resumed["steps"] == full["steps"] == 20
    assert resumed["test_accuracy"] == pytest.approx(full["test_accuracy"], abs=1e-6)
    # metrics.jsonl: each update and epoch exactly once, as in the uninterrupted run
    cut = helpers.records(tmp_path / "cut")
    ref = helpers.records(tmp_path / "full")
    assert [(r["step"], "loss" in r) for r in cut] == [(r["step"], "loss" in r) for r in ref]
    assert [r.get("loss") for r in cut] == pytest.approx([r.get("loss") for r in ref], abs=1e-5)
    # the epoch resumed mid-way still reports the train loss of all its updates
    assert [r.get("train_loss") for r in cut] == pytest.approx([r.get("train_loss") for r in ref], abs=1e-6)


def test_cli_interrupt_exit_code_and_resume_line(tmp_path, repo_root, monkeypatch):
    import accum_train.cli.main as cli

    # smoke.yaml has log_every=10: the first report, and so the signal, comes after update 10
    monkeypatch.setattr(cli, "BarProgress", lambda show_bar: InterruptAt(1))
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)])
    assert result.exit_code == 130
    assert result.stderr == (
        f"stopped by SIGINT after update 10; checkpoint saved. Resume with: accum-train run --resume {out}\n"
    )
    assert tf.train.latest_checkpoint(str(out / "checkpoints")).endswith("ckpt-10")


@pytest.mark.slow  # test_kills.py has the same as a real process, also slow
def test_second_interrupt_stops_at_once_in_one_line(tmp_path, repo_root, monkeypatch):
    import accum_train.cli.main as cli

    monkeypatch.setattr(cli, "BarProgress", lambda show_bar: InterruptAt(1, signals=2))  # after update 10
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)])
    assert result.exit_code == 130
    # the second signal came before the first could checkpoint update 10: ckpt-0 is the last, and intact
    assert result.stderr == (
        f"stopped at once by a second SIGINT; the last checkpoint (update 0) is intact. "
        f"Resume with: accum-train run --resume {out}\n"
    )
    assert tf.train.latest_checkpoint(str(out / "checkpoints")).endswith("ckpt-0")
    monkeypatch.undo()
    resumed = CliRunner().invoke(main, ["run", "--resume", str(out)])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((out / "summary.json").read_text())["steps"] == 94


def test_a_run_directory_with_a_renamed_key_is_evaluated_and_resumed(tmp_path, smoke_run):
    """config.yaml as an earlier release wrote it (max_bad_updates, now max_bad_steps): evaluate reads it, and a
    resume goes on and writes it under today's names."""
    import shutil

    out, _, _ = smoke_run
    old = tmp_path / "old"
    shutil.copytree(out, old, ignore=shutil.ignore_patterns("writer.lock", "evaluate"))
    written = (old / "config.yaml").read_text()
    (old / "config.yaml").write_text(written.replace("max_bad_steps: 10", "max_bad_updates: 10"))
    assert "max_bad_updates: 10" in (old / "config.yaml").read_text()  # the premise
    evaluated = CliRunner().invoke(main, ["evaluate", str(old)])
    assert evaluated.exit_code == 0, evaluated.output
    summary = json.loads((old / "summary.json").read_text())
    assert json.loads((old / "evaluate" / "evaluate.json").read_text())["test_accuracy"] == summary["test_accuracy"]
    resumed = CliRunner().invoke(main, ["run", "--resume", str(old), "--set", "epochs=3"])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((old / "summary.json").read_text())["steps"] == 141  # 47 updates per epoch
    assert "max_bad_steps: 10" in (old / "config.yaml").read_text()


def test_run_dir_errors(tmp_path, repo_root, smoke_run):
    smoke = str(repo_root / "configs" / "smoke.yaml")
    done, _, _ = smoke_run
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    a_file = tmp_path / "file"
    a_file.write_text("x")

    def refused(change):
        return (
            f"--resume {done}: the config changes {change}, which the run cannot continue with; only epochs, "
            f"log_every, checkpoint.every_steps, checkpoint.keep, data.dir, strategy, optimizer.learning_rate, "
            f"optimizer.clip_norm, subdivisions, micro_batch_size may change"
        )

    cases = [
        (
            ["run", smoke, "--output-dir", str(busy)],
            f"--output-dir {busy} is not empty: choose an empty or new directory",
        ),
        (
            ["run", smoke, "--output-dir", str(done)],
            f"--output-dir {done} is not empty: continue it with --resume {done}",
        ),
        (["run", smoke, "--output-dir", str(a_file)], f"--output-dir {a_file} is a file: name a directory"),
        (
            ["run", "--resume", str(tmp_path / "missing")],
            f"--resume {tmp_path / 'missing'} does not exist: pass a directory written by 'accum-train run'",
        ),
        (
            ["run", "--resume", str(busy)],
            f"--resume {busy} is not a run directory (no config.yaml and checkpoints/): "
            f"pass a directory written by 'accum-train run'",
        ),
        *(
            (["run", "--resume", str(done), "--set", setting], refused(change))
            for setting, change in (
                ("batch_size=200", "batch_size (64 -> 200)"),
                ("model.width=0.125", "model.width (0.0625 -> 0.125)"),
                ("optimizer.name=sgd", "optimizer.name ('adam' -> 'sgd')"),
                ("data.train_limit=640", "data.train_limit (3000 -> 640)"),
            )
        ),
        (["run"], "missing CONFIG: pass a YAML file, e.g. 'accum-train run configs/fmnist.yaml', or --resume RUN_DIR"),
        (
            ["run", "--resume", str(done), "--set", "epochs=1"],
            f"--resume {done}: the run is at update 94, past the end of epochs=1 (update 47): resume with a larger "
            f"epochs",
        ),
    ]
    recorded = (done / "config.yaml").read_text()
    for args, message in cases:
        before = sorted(p.name for p in tmp_path.rglob("*"))
        result = CliRunner().invoke(main, args)
        assert (result.exit_code, result.stderr) == (2, f"error: {message}\n"), args
        assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert (busy / "notes.txt").read_text() == "mine"
    assert (done / "config.yaml").read_text() == recorded


def test_unwritable_output_parent(tmp_path, repo_root, monkeypatch):
    # Tests run as root, for whom chmod changes nothing: the permission check is what is exercised.
    import accum_train.trainer.store.rundir as rundir_module

    real_access = rundir_module.os.access
    monkeypatch.setattr(
        rundir_module.os, "access", lambda path, mode: False if mode & os.W_OK else real_access(path, mode)
    )
    out = tmp_path / "locked" / "run"
    result = CliRunner().invoke(main, ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)])
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: --output-dir {out}: {tmp_path} is not writable: choose another directory\n",
    )
    assert not (tmp_path / "locked").exists()


def test_progress_bar_shows_micro_batches_loss_speed_and_eta(capsys):
    import io

    from accum_train.cli.main import BarProgress

    stream = io.StringIO()
    bar = BarProgress(True, stream=stream)
    bar.epoch_start(1, 3, 40, 0)
    bar.updates(20, 0.5432, 1234.0)
    drawn = stream.getvalue()
    assert "epoch 1/3" in drawn and "20/40 micro-batches" in drawn
    assert "loss: 0.5432" in drawn and "1234.0 examples/s" in drawn and "ETA" in drawn
    bar.epoch_end(
        {
            "epoch": 1,
            "train_loss": 0.6,
            "test_loss": 0.5,
            "test_accuracy": 0.8125,
            "elapsed_s": 2.0,
            "examples_per_s": 1000.0,
        }
    )
    assert capsys.readouterr().out == (
        "epoch 1/3: train loss 0.6000, test loss 0.5000, test accuracy 0.8125, 2.0 s, 1000 examples/s\n"
    )


@pytest.mark.slow  # two fresh processes
def test_a_run_starts_quietly_unless_verbose(tmp_path, repo_root):
    """No TensorFlow start-up or C++ log lines (oneDNN, absl, grappler's remapper for norm=none) on stderr."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "accum_train.cli.main",
            "run",
            str(repo_root / "configs" / "smoke.yaml"),
            "--set",
            "model.norm=none",
            "--set",
            "epochs=1",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines()[-1].startswith("test accuracy ")
    check = (
        "import os, sys; from accum_train.outcome import quiet_tensorflow; quiet_tensorflow(True); "
        "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'), 'tensorflow' in sys.modules)"
    )
    verbose = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60, env=env)
    assert verbose.stdout.split() == ["None", "False"]  # --verbose: TensorFlow's logging left as it is


def _kept(run_dir):
    return sorted(int(p.name.split("-")[1].split(".")[0]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))


def test_describe_tells_a_cli_run_directory_as_it_stands(smoke_run, tmp_path, monkeypatch):
    """describe reads config.yaml, metrics.jsonl, checkpoints/ and summary.json back: finished, then the same
    directory without its summary (a run stopped before its end, which says how to go on), then while a process
    holds its lock (training)."""
    from accum_train.trainer.store.lock import LOCK_HELD, writing
    from accum_train.trainer.store.rundir import RunDirectory

    out, _, _ = smoke_run
    last = [r for r in records(out) if "loss" in r][-1]
    kept = ", ".join(f"ckpt-{n}" for n in _kept(out))
    body = [
        "  model      seed_convnet",
        "  batch      64 in 4 micro-batches, seed 0",
        f"  progress   94 updates logged, 2 epochs ended, last loss {last['loss']:.4g}, noise scale "
        f"{[r for r in records(out) if r.get('noise_scale')][-1]['noise_scale']:.4g}",
        f"  kept       {kept}",
    ]
    result = CliRunner().invoke(main, ["describe", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"{out}: written by accum-train run, finished", *body]
    as_json = json.loads(CliRunner().invoke(main, ["describe", str(out), "--json"]).output)
    assert as_json["summary"] == json.loads((out / "summary.json").read_text())
    assert (as_json["updates_logged"], as_json["checkpoints"], as_json["next"]) == (94, _kept(out), None)

    stopped = tmp_path / "stopped"
    shutil.copytree(out, stopped)
    (stopped / "summary.json").unlink()
    before = sorted(p.name for p in stopped.iterdir())
    result = CliRunner().invoke(main, ["describe", str(stopped)])
    assert result.output.splitlines() == [
        f"{stopped}: written by accum-train run, stopped before its end",
        *body,
        f"  go on      accum-train run --resume {stopped}",
    ]
    assert sorted(p.name for p in stopped.iterdir()) == before  # nothing written
    assert json.loads((out / "history.jsonl").read_text().splitlines()[-1])["launcher"] is False
    # as a chief under 'accum-train run --workers 2' logs its start (its supervisor holds the lock): go on so
    with monkeypatch.context() as patched:
        patched.setenv(LOCK_HELD, str(stopped.resolve()))
        patched.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}}))
        RunDirectory(stopped, True, "--resume ", "").log_start(94, True, "multi_worker", 2, 4)
    result = CliRunner().invoke(main, ["describe", str(stopped)])
    assert result.output.splitlines()[-1] == f"  go on      accum-train run --resume {stopped} --workers 2"
    with writing(stopped):
        result = CliRunner().invoke(main, ["describe", str(stopped)])
        as_json = CliRunner().invoke(main, ["describe", str(stopped), "--json"])
    assert (
        result.output.splitlines()[0]
        == f"{stopped}: written by accum-train run, training (process {os.getpid()} writes it)"
    )
    assert json.loads(as_json.output)["writer_pid"] == os.getpid()  # a number, as JSON readers expect


NOT_RUNS = [
    # (a file the directory holds, the line)
    (
        None,
        "{d} is not a run directory (no config.yaml with checkpoints/, nor fit.json): pass a directory written by "
        "'accum-train run' or by accum_train.fit(output_dir=...)",
    ),
    ("compare.json", "{d} holds the two runs of 'accum-train compare', not one: pass {d}/baseline or {d}/subdivided"),
    ("bench.json", "{d} holds the timings of 'accum-train bench' (bench.json), not a run: it has no checkpoint"),
]


@pytest.mark.parametrize("command", ["describe", "evaluate"])
@pytest.mark.parametrize(("held", "line"), NOT_RUNS, ids=["empty", "compare", "bench"])
def test_describe_and_evaluate_refuse_what_is_not_a_run_directory(tmp_path, command, held, line):
    if held:
        (tmp_path / held).write_text("{}")
    if command == "evaluate" and not held:  # evaluate's words (trainer/store/rundir.require_run_dir)
        line = "{d} is not a run directory (no config.yaml and checkpoints/): pass a directory written by 'accum-train "
        line += "run'"
    result = CliRunner().invoke(main, [command, str(tmp_path)])
    assert (result.exit_code, result.output) == (2, "error: " + line.format(d=tmp_path) + "\n")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["run", "--bogus"], "No such option '--bogus'. Did you mean '--verbose'? (see accum-train run --help)"),
        (["bogus"], "No such command 'bogus'. (see accum-train --help)"),
        (["run", "--set"], "Option '--set' requires an argument."),
    ],
    ids=["an unknown option", "an unknown command", "an option without its value"],
)
def test_a_usage_error_is_one_line_as_every_bad_input(args, line):
    """Click prints the usage, a hint and 'Error: ...' on four lines; the tool's bad input is one line."""
    result = CliRunner().invoke(main, args, prog_name="accum-train")
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {line}\n", "")


def test_ctrl_c_before_a_run_s_own_stop_is_one_line_and_exit_130(tmp_path, monkeypatch):
    """Click's 'Aborted!' and exit 1 where a signal stops a command before its own stop is in place."""
    import accum_train.describe

    def interrupted(run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(accum_train.describe, "describe", interrupted)
    result = CliRunner().invoke(main, ["describe", str(tmp_path)])
    # Click's newline first: in a terminal it ends the line of the ^C
    assert (result.exit_code, result.stderr, result.stdout) == (130, "\nstopped by SIGINT\n", "")


def test_help_and_version_still_exit_0():
    for args in (["--help"], ["run", "--help"], ["--version"]):
        result = CliRunner().invoke(main, args, prog_name="accum-train")
        assert result.exit_code == 0 and result.stdout, args
