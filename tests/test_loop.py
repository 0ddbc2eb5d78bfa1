"""The training loop's edges, each asserted with numbers: one graph call per
update, metrics.jsonl complete before every checkpoint, the max_bad_steps
stop at the update that reaches it, the learning rate logged as applied, and
a schedule that a longer resume does not bend."""

import signal

import pytest
import tensorflow as tf
import yaml
from accum_train.config import load_config
from accum_train.errors import Interrupted, TrainingStopped
from accum_train.from_config.lifecycle import train
from accum_train.from_config.source import resume_config
from accum_train.progress import Progress
from accum_train.trainer.store.rundir import RunDirectory
from helpers import GraphCalls, InterruptAt, poison, update_records

# What these tests assert is the loop's bookkeeping, the same for any model and any length of run: smoke.yaml
# with a small MLP (BatchNorm kept: its deferred statistics are still committed and checkpointed) on 600
# examples, 9 full updates and a short one of 24 per epoch. A run is then mostly its start-up (tracing).
SHORT = ["model.name=mlp", "model.hidden=32", "data.train_limit=600", "data.test_limit=100"]


class Said(Progress):
    def __init__(self):
        self.lines = []

    def message(self, text):
        self.lines.append(text)


@pytest.mark.parametrize("k", [1, 8])
def test_one_graph_call_per_update(tmp_path, repo_root, monkeypatch, k):
    """Python enters TensorFlow's graphs once per update, whatever k (evaluation, writing the records and
    checkpoints aside). And the noise scale's records: k=1 has no estimate (null everywhere, said once), k=8 one
    from the first update."""
    from accum_train.from_config.lifecycle import NO_NOISE_SCALE

    graph, said = GraphCalls(monkeypatch.setattr), Said()
    cfg = load_config(repo_root / "configs" / "smoke.yaml", [*SHORT, f"subdivisions={k}", "epochs=1", "log_every=3"])
    summary = train(cfg, tmp_path / "run", progress=said)
    assert summary["steps"] == 10
    assert graph.calls == 10
    estimates = [r["noise_scale"] for r in update_records(tmp_path / "run")]
    assert said.lines.count(NO_NOISE_SCALE) == (1 if k == 1 else 0)
    if k == 1:
        assert estimates == [None] * 10 and summary["noise_scale"] is None
    else:
        assert estimates[0] is not None and summary["noise_scale"] == estimates[-1]


class KilledAfter(BaseException):
    """Stands in for kill -9: nothing after it runs, no handler catches it."""


@pytest.mark.parametrize(
    "every_steps, log_every, kill_after_save",
    [(3, 10, 2), pytest.param(4, 3, 3, marks=pytest.mark.slow), pytest.param(5, 50, 4, marks=pytest.mark.slow)],
)
def test_every_checkpoint_follows_its_metrics(
    tmp_path, repo_root, monkeypatch, every_steps, log_every, kill_after_save
):
    """A checkpoint never counts updates that metrics.jsonl lacks; after a kill and a resume every update
    is in metrics.jsonl exactly once, whatever every_steps and log_every."""
    cfg = load_config(
        repo_root / "configs" / "smoke.yaml",
        [*SHORT, f"checkpoint.every_steps={every_steps}", f"log_every={log_every}"],
    )
    real_save, saves = RunDirectory.save, [0]

    def save_then_die(self, step):
        real_save(self, step)
        saves[0] += 1
        if saves[0] == kill_after_save:  # ckpt-0 is the first save
            raise KilledAfter(step)

    monkeypatch.setattr(RunDirectory, "save", save_then_die)
    with pytest.raises(KilledAfter) as killed:
        train(cfg, tmp_path / "run")
    step = killed.value.args[0]
    assert step == every_steps * (kill_after_save - 1)
    assert [r["step"] for r in update_records(tmp_path / "run")] == list(range(1, step + 1))
    monkeypatch.undo()
    train(cfg, tmp_path / "run", resume=True)
    assert [r["step"] for r in update_records(tmp_path / "run")] == list(range(1, 21))


@pytest.mark.parametrize(
    "bad_steps, limit, stop_at",
    [
        (set(range(6, 200)), 3, 8),  # 6, 7, 8 in a row
        ({2, 3, 5, 6, 8, 9, 10, 11}, 3, 10),  # the good updates 4 and 7 reset the count
        (set(range(1, 200)), 1, 1),
    ],
)
def test_max_bad_steps_stops_at_the_update_that_reaches_it(tmp_path, repo_root, monkeypatch, bad_steps, limit, stop_at):
    poison(monkeypatch, bad_steps)
    cfg = load_config(repo_root / "configs" / "smoke.yaml", [*SHORT, "log_every=50", f"max_bad_steps={limit}"])
    with pytest.raises(TrainingStopped) as err:
        train(cfg, tmp_path / "run")
    assert str(err.value).startswith(
        f"{limit} updates in a row had a non-finite loss or gradient "
        f"(max_bad_steps={limit}), the last at update {stop_at}; "
    )
    reader = tf.train.load_checkpoint(str(tmp_path / "run" / "checkpoints"))
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == stop_at
    assert reader.get_tensor("bad_updates_in_a_row/.ATTRIBUTES/VARIABLE_VALUE") == limit
    assert reader.get_tensor("skipped_updates/.ATTRIBUTES/VARIABLE_VALUE") == len(bad_steps & set(range(stop_at + 1)))
    records = update_records(tmp_path / "run")
    assert [r["step"] for r in records] == list(range(1, stop_at + 1))
    assert [r["step"] for r in records if r["skipped"]] == sorted(bad_steps & set(range(stop_at + 1)))


def test_logged_learning_rate_is_the_one_applied_after_a_skip(tmp_path, repo_root, monkeypatch):
    overrides = [*SHORT, "epochs=1", "log_every=5", "optimizer.schedule.name=cosine"]
    cfg = load_config(repo_root / "configs" / "smoke.yaml", overrides)
    train(cfg, tmp_path / "ref")
    poison(monkeypatch, {3})
    train(cfg, tmp_path / "skip")
    ref = [r["learning_rate"] for r in update_records(tmp_path / "ref")]
    skip = [r["learning_rate"] for r in update_records(tmp_path / "skip")]
    assert len(set(ref)) == 10  # a rate that changes every update
    # a skip does not advance the schedule: the update after it gets the rate the skipped one would have had
    assert skip[:2] == ref[:2] and skip[2] is None and skip[3:] == ref[2:-1]


def test_resume_with_more_epochs_keeps_the_schedule_it_started_on(tmp_path, repo_root):
    overrides = [*SHORT, "log_every=1", "optimizer.schedule.name=cosine", "optimizer.schedule.min_ratio=0.1"]
    cfg = load_config(repo_root / "configs" / "smoke.yaml", overrides)
    train(cfg, tmp_path / "full")
    with pytest.raises(Interrupted):
        train(cfg, tmp_path / "cut", progress=InterruptAt(5))
    # the length of a decay over "the whole run" is fixed when the run starts, in config.yaml
    assert yaml.safe_load((tmp_path / "cut" / "config.yaml").read_text())["optimizer"]["schedule"]["decay_steps"] == 20
    longer = resume_config(tmp_path / "cut", None, ["epochs=3"])
    assert longer.optimizer.schedule.decay_steps == 20 and longer.epochs == 3
    messages = []
    progress = Progress()
    progress.message = messages.append
    train(longer, tmp_path / "cut", resume=True, progress=progress)
    full = [r["learning_rate"] for r in update_records(tmp_path / "full")]
    cut = [r["learning_rate"] for r in update_records(tmp_path / "cut")]
    assert len(cut) == 30
    assert cut[:20] == full  # the updates planned before the resume keep their rates
    assert cut[20:] == [pytest.approx(0.1 * 0.003)] * 10  # then the schedule's final rate
    assert (
        "note: the cosine schedule ends at update 20 (decay_steps=20, fixed when the run started); "
        "later updates use its final learning rate"
    ) in messages
    # a config that leaves decay_steps to be computed resumes with the resolved value (20), not a new one (40)
    assert (
        resume_config(
            tmp_path / "cut", repo_root / "configs" / "smoke.yaml", [*overrides, "epochs=4"]
        ).optimizer.schedule.decay_steps
        == 20
    )


@pytest.mark.parametrize(
    "sig, signals, code, line",
    [
        (signal.SIGTERM, 1, 143, "stopped by SIGTERM after update 3; checkpoint saved. "),
        (signal.SIGTERM, 2, 143, "stopped at once by a second SIGTERM; the last checkpoint (update 0) is intact. "),
        pytest.param(  # the same path as a second SIGTERM; test_cli_run and test_kills have it too (slow)
            signal.SIGINT,
            2,
            130,
            "stopped at once by a second SIGINT; the last checkpoint (update 0) is intact. ",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_signals_in_process_stop_as_they_say_and_resume(tmp_path, repo_root, monkeypatch, sig, signals, code, line):
    """One SIGTERM (a platform preempting the machine) finishes the update and checkpoints; a second signal of
    either kind stops at once, the checkpoint before it intact; both resume to the run's end."""
    import accum_train.cli.main as cli
    from accum_train.cli.main import main
    from click.testing import CliRunner

    sets = [item for key in [*SHORT, "epochs=1", "log_every=3"] for item in ("--set", key)]
    out = tmp_path / "run"
    monkeypatch.setattr(cli, "BarProgress", lambda show_bar: InterruptAt(1, signals=signals, sig=sig))
    result = CliRunner().invoke(
        main, ["run", str(repo_root / "configs" / "smoke.yaml"), *sets, "--output-dir", str(out)]
    )
    assert (result.exit_code, result.stderr) == (code, f"{line}Resume with: accum-train run --resume {out}\n")
    assert tf.train.latest_checkpoint(str(out / "checkpoints")).endswith(f"ckpt-{3 if signals == 1 else 0}")
    monkeypatch.undo()
    resumed = CliRunner().invoke(main, ["run", "--resume", str(out)])
    assert resumed.exit_code == 0, resumed.output
    assert [r["step"] for r in update_records(out)] == list(range(1, 11))
