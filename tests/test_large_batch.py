"""Large batches: micro_batch_size, learning-rate scaling and batch-size schedules.

The layout of updates (accum/trainer/data/timeline.py) and the rates are checked as tables; a
few short runs (BN-free, in this process) check that a schedule's batches, k and
rates are the ones trained with, and that a growing batch with a fixed
micro-batch gives the update of each whole batch. The kill across a change of
phase is in the slow suite.
"""

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from accum_train import UserError, run
from accum_train.cli.main import main
from accum_train.config import ConfigError, as_config, load_config
from accum_train.from_config.optim import run_schedule
from accum_train.trainer.data.timeline import Timeline
from accum_train.trainer.optim import learning_rate_at
from click.testing import CliRunner
from helpers import load_file, max_difference, update_records

SCHEDULE = [{"epoch": 1, "batch_size": 500}, {"epoch": 3, "batch_size": 2000}]


def timeline_of(cfg, n):
    """The timeline of a run of ``cfg`` on ``n`` training examples, as a run lays it out."""
    cfg = cfg.for_data(n)
    return Timeline(n, cfg.epochs, cfg.batch_size, cfg.batch_changes)


@pytest.mark.parametrize(
    "config, n, total, segments",
    [
        # one batch size: ceil(n / B) updates an epoch, the last short
        ({"batch_size": 500, "epochs": 2}, 1200, 6, [(0, 0, 0, 1200, 500), (1, 3, 0, 1200, 500)]),
        # by epoch: the batch changes where epoch 3 starts
        (
            {"micro_batch_size": 500, "epochs": 3, "batch_schedule": SCHEDULE},
            5200,
            25,
            [(0, 0, 0, 5200, 500), (1, 11, 0, 5200, 500), (2, 22, 0, 5200, 2000)],
        ),
        # by step: after 13 updates, in the middle of epoch 2, on from the examples that follow
        (
            {"batch_size": 500, "epochs": 3, "batch_schedule": [{"step": 13, "batch_size": 2000}]},
            5200,
            19,
            [(0, 0, 0, 5200, 500), (1, 11, 0, 1000, 500), (1, 13, 1000, 5200, 2000), (2, 16, 0, 5200, 2000)],
        ),
        # a change at an epoch's first update and a later one that shrinks the batch
        (
            {
                "batch_size": 4,
                "subdivisions": 1,
                "epochs": 2,
                "batch_schedule": [{"step": 3, "batch_size": 8}, {"step": 4, "batch_size": 2}],
            },
            10,
            5,
            [(0, 0, 0, 10, 4), (1, 3, 0, 8, 8), (1, 4, 8, 10, 2)],
        ),
    ],
)
def test_timeline_lays_the_updates_out(config, n, total, segments):
    timeline = timeline_of(as_config(config), n)
    assert timeline.total_steps == total
    assert [(s.epoch, s.first_step, s.start, s.end, s.batch_size) for s in timeline.segments] == segments
    # every update is counted once, in order: examples_seen grows by each update's batch
    seen = [timeline.examples_seen(step) for step in range(total + 1)]
    sizes = [min(timeline.batch_size(step), n - timeline.offset(step)) for step in range(total)]
    assert np.diff(seen).tolist() == sizes
    assert seen[-1] == n * timeline.epochs


def test_timeline_resumes_in_the_middle_of_a_segment():
    timeline = timeline_of(
        as_config({"batch_size": 500, "epochs": 3, "batch_schedule": [{"step": 13, "batch_size": 2000}]}), 5200
    )
    assert [(s.first_step, s.start, s.end, s.batch_size) for s in timeline.rest_of_epoch(12)] == [
        (12, 500, 1000, 500),
        (13, 1000, 5200, 2000),
    ]
    assert [(s.first_step, s.start) for s in timeline.rest_of_epoch(14)] == [(14, 3000)]
    assert [timeline.epoch_of(s) for s in (10, 11, 15, 16, 19)] == [0, 1, 1, 2, 3]
    assert [timeline.epoch_of(s) for s in (0, 11, 12, 16, 19)] == [0, 1, 1, 2, 3]
    assert [(p.step, p.epoch, p.batch_size) for p in timeline.phases] == [(0, 0, 500), (13, 1, 2000)]


@pytest.mark.parametrize(
    "config, batch, replicas, k",
    [
        ({"batch_size": 500, "micro_batch_size": 100}, 500, 1, 5),
        ({"batch_size": 500, "micro_batch_size": 128}, 500, 1, 4),  # 125 each: never over 128
        ({"batch_size": 500, "micro_batch_size": 128}, 4000, 1, 32),
        ({"batch_size": 500, "micro_batch_size": 100}, 500, 2, 3),  # a replica's 250 as 84, 83, 83
        ({"batch_size": 500, "micro_batch_size": 1000}, 500, 1, 1),
        ({"batch_size": 500, "subdivisions": 8}, 4000, 1, 8),  # a fixed k stays
        ({"batch_size": 500}, 500, 1, 5),  # neither given: the default k
    ],
)
def test_subdivisions_follow_micro_batch_size(config, batch, replicas, k):
    cfg = as_config(config)
    assert cfg.subdivisions_for(batch, replicas) == k
    if cfg.micro_batch_size:
        share = math.ceil(batch / replicas)
        assert math.ceil(share / k) <= cfg.micro_batch_size  # what fits, fits


@pytest.mark.parametrize(
    "scale, steps, rates",
    [
        # the configured 0.001 is for batch 256; batch_size 1024 runs at 4x (linear) or 2x (sqrt)
        ({"rule": "none"}, [0, 9], [0.001, 0.001]),
        ({"rule": "linear", "base_batch_size": 256}, [0, 9], [0.004, 0.004]),
        ({"rule": "sqrt", "base_batch_size": 256}, [0, 9], [0.002, 0.002]),
    ],
)
def test_scale_learning_rate(scale, steps, rates):
    cfg = as_config(
        {"batch_size": 1024, "epochs": 1, "optimizer": {"learning_rate": 0.001, "scale_learning_rate": scale}}
    )
    schedule = run_schedule(cfg.optimizer, cfg.batch_size, bool(cfg.batch_changes), timeline_of(cfg, 10240))
    assert [learning_rate_at(schedule, s) for s in steps] == pytest.approx(rates, rel=1e-6)


def test_scaled_rates_follow_the_batch_in_force_and_the_warm_up():
    """Warm-up over 4 updates to the rate of the batch in force; from update 6 (step 5) the batch is 4x."""
    cfg = as_config(
        {
            "batch_size": 256,
            "epochs": 2,
            "batch_schedule": [{"step": 5, "batch_size": 1024}],
            "optimizer": {
                "learning_rate": 0.01,
                "scale_learning_rate": {"rule": "linear", "base_batch_size": 256},
                "schedule": {"warmup_steps": 4},
            },
        }
    )
    schedule = run_schedule(cfg.optimizer, cfg.batch_size, bool(cfg.batch_changes), timeline_of(cfg, 2048))
    rates = [learning_rate_at(schedule, step) for step in range(8)]
    assert rates == pytest.approx([0.0025, 0.005, 0.0075, 0.01, 0.01, 0.04, 0.04, 0.04], rel=1e-6)


# (config, message): each bad large-batch setting gets its one line (as_config's source is "config")
BAD = [
    (
        {"subdivisions": 4, "micro_batch_size": 100},
        "config: give subdivisions or micro_batch_size, not both (subdivisions=4, micro_batch_size=100): remove one",
    ),
    ({"micro_batch_size": 0}, "config: micro_batch_size=0 must be >= 1 and <= 1000000"),
    (
        {"batch_schedule": [{"epoch": 2, "step": 5, "batch_size": 800}]},
        "config: batch_schedule[0] needs an epoch or a step, not both or neither "
        "(e.g. {epoch: 6, batch_size: 2000} or {step: 600, batch_size: 2000})",
    ),
    (
        {"batch_schedule": [{"epoch": 2}]},
        "config: batch_schedule[0] needs a batch_size (e.g. {epoch: 6, batch_size: 2000})",
    ),
    (
        {"batch_schedule": [{"epoch": 3, "batch_size": 800}, {"epoch": 2, "batch_size": 1000}]},
        "config: batch_schedule[1] (epoch 2) must come after batch_schedule[0] (epoch 3): "
        "list the changes in increasing epochs",
    ),
    (
        {"batch_schedule": [{"epoch": 3, "batch_size": 800}, {"step": 900, "batch_size": 1000}]},
        "config: batch_schedule mixes epoch and step entries: key every entry by epoch",
    ),
    (
        {"batch_schedule": [{"epoch": 11, "batch_size": 800}]},
        "config: batch_schedule starts batch_size=800 at epoch 11, after the last epoch (epochs=10): "
        "raise epochs or remove the entry",
    ),
    (
        {"batch_size": 400, "batch_schedule": [{"epoch": 1, "batch_size": 500}]},
        "config: batch_size=400 and batch_schedule[0] (epoch 1, batch_size=500) both set the first batch size: "
        "remove one",
    ),
    (
        {"batch_size": 64, "subdivisions": 8, "batch_schedule": [{"epoch": 2, "batch_size": 4}]},
        "config: subdivisions=8 cannot cut batch_schedule's batch_size=4 (a micro-batch holds at least one "
        "example): give micro_batch_size instead, so that k follows the batch",
    ),
    (
        {"subdivisions": "auto", "memory_limit": "1GiB", "batch_schedule": [{"epoch": 2, "batch_size": 800}]},
        "config: batch_schedule needs micro_batch_size or a fixed subdivisions (auto probes one batch size): "
        "set micro_batch_size to what fits",
    ),
    (
        {"data": {"train_limit": 1000}, "batch_schedule": [{"epoch": 2, "batch_size": 2000}]},
        "config: data.train_limit=1000 is smaller than batch_schedule's batch_size=2000: raise it or lower that "
        "batch size",
    ),
    (
        {"batch_schedule": {"epoch": 2, "batch_size": 800}},
        "config: batch_schedule={batch_size: 800, epoch: 2} must be a list of changes, e.g. [{epoch: 6, "
        "batch_size: 2000}], or a rule, e.g. {rule: noise_scale, max_batch_size: 16000}",
    ),
    (
        {"optimizer": {"scale_learning_rate": {"rule": "square"}}},
        "config: optimizer.scale_learning_rate.rule='square' is not one of none, linear, sqrt; did you mean 'sqrt'?",
    ),
    (
        {"optimizer": {"scale_learning_rate": {"base_batch_size": 0}}},
        "config: optimizer.scale_learning_rate.base_batch_size=0 must be >= 1 and <= 1000000",
    ),
    (
        {"optimizer": {"weight_decay": 0.01}},
        "config: optimizer.weight_decay is only for optimizer.name=lars or lamb, not adam: remove it or change "
        "the optimizer",
    ),
    (
        {"optimizer": {"name": "lamb", "trust_coefficient": 0.01}},
        "config: optimizer.trust_coefficient is only for optimizer.name=lars, not lamb: remove it or change "
        "the optimizer",
    ),
    (
        {"optimizer": {"name": "sgd", "exclude_from_adaptation": ["bias"]}},
        "config: optimizer.exclude_from_adaptation is only for optimizer.name=lars or lamb, not sgd: remove it "
        "or change the optimizer",
    ),
    (
        {"optimizer": {"name": "lars", "exclude_from_adaptation": "bias"}},
        "config: optimizer.exclude_from_adaptation='bias' must be a list of strings, e.g. ['bias', 'norm']",
    ),
    (
        {"optimizer": {"name": "lars", "exclude_from_adaptation": ["conv1/(bias"]}},
        "config: optimizer.exclude_from_adaptation has 'conv1/(bias', not a regular expression (missing ), "
        "unterminated subpattern at position 6): escape it, e.g. 'conv1/bias'",
    ),
    ({"optimizer": {"name": "lars", "weight_decay": 2}}, "config: optimizer.weight_decay=2 must be <= 1.0"),
]


@pytest.mark.parametrize("config, message", BAD)
def test_bad_large_batch_settings_get_one_line(config, message):
    with pytest.raises(ConfigError) as caught:
        as_config(config)
    assert str(caught.value) == message


def test_a_later_set_replaces_the_file_s_way_of_cutting_the_batch(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("batch_size: 64\nsubdivisions: 4\n")
    from accum_train.config import load_config

    assert load_config(path, ["micro_batch_size=16"]).subdivisions is None
    assert load_config(path, ["micro_batch_size=16"]).subdivisions_for(64) == 4
    path.write_text("batch_size: 64\nmicro_batch_size: 16\n")
    assert load_config(path, ["subdivisions=2"]).micro_batch_size is None


@pytest.mark.parametrize(
    ("text", "sets", "batch_size", "schedule"),
    [  # a schedule from epoch 1 and batch_size, one in the file and the other by --set: --set's word wins
        ("batch_size: 64\n", ["batch_schedule=[{epoch: 1, batch_size: 32}, {epoch: 2, batch_size: 48}]"], 32, [48]),
        ("batch_schedule: [{epoch: 1, batch_size: 32}, {epoch: 2, batch_size: 48}]\n", ["batch_size=16"], 16, [48]),
    ],
    ids=["schedule by --set", "batch_size by --set"],
)
def test_a_later_set_replaces_the_file_s_first_batch_size(tmp_path, text, sets, batch_size, schedule):
    from accum_train.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(text + "micro_batch_size: 8\n")
    cfg = load_config(path, sets)
    assert (cfg.batch_size, [change.batch_size for change in cfg.batch_schedule]) == (batch_size, schedule)


def test_a_scheduled_batch_over_the_training_set_is_one_line(repo_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        main,
        [
            "plan",
            str(repo_root / "configs" / "smoke.yaml"),
            "--set",
            "data.validation=2400",  # of smoke.yaml's 3000: 600 left to train on, which only the data knows
            "--set",
            "batch_schedule=[{epoch: 2, batch_size: 601}]",
        ],
    )
    assert (result.exit_code, result.stderr, result.stdout) == (
        2,
        "error: batch_schedule: batch_size=601 (from epoch 2) is more than the 600 training examples: lower it\n",
        "",
    )
    assert list(tmp_path.iterdir()) == []


# A BN-free net (norm none) on 192 examples: 3 epochs of batch 32 (cut in micro-batches of 16) growing to 96
# after 8 updates, in the middle of epoch 2. SGD at a rate that moves the weights, scaled linearly.
SMALL = {
    "model": {"name": "seed_convnet", "width": 0.0625, "norm": "none"},
    "data": {"train_limit": 192, "test_limit": 64},
    "batch_size": 32,
    "micro_batch_size": 16,
    "batch_schedule": [{"step": 8, "batch_size": 96}],
    "epochs": 3,
    "log_every": 1,
    "optimizer": {
        "name": "sgd",
        "learning_rate": 0.4,
        "scale_learning_rate": {"rule": "linear", "base_batch_size": 64},
    },
}


@pytest.fixture(scope="module")
def scheduled(repo_root, data_dir, tmp_path_factory):
    """The schedule with micro-batches of 16, and the same schedule with each batch in one pass (baseline)."""
    out = {}
    for name, extra in (("micro", {}), ("baseline", {"baseline": True, "micro_batch_size": None, "subdivisions": 1})):
        d = tmp_path_factory.mktemp(name) / "run"
        config = {**SMALL, **extra, "data": {**SMALL["data"], "dir": str(data_dir)}}
        out[name] = d, run(config, output_dir=d)
    return out


def test_a_growing_batch_with_a_fixed_micro_batch_is_each_whole_batch_s_update(scheduled):
    """k follows the batch (2, then 6 micro-batches of 16) and every update equals the whole batch's in one
    pass: the weights after the run, BN-free, to 1e-5."""
    (micro_dir, summary), (base_dir, _) = scheduled["micro"], scheduled["baseline"]
    ours, theirs = np.load(micro_dir / "weights.npz"), np.load(base_dir / "weights.npz")
    assert max_difference(ours, theirs) < 1e-5
    assert summary["steps"] == 6 + 2 + 2 + 2  # 6 of 32, then 96: the rest of epoch 2 (64 left: one short), 2, 2
    assert summary["batch_schedule"] == [
        {"update": 1, "epoch": 1, "batch_size": 32},
        {"update": 9, "epoch": 2, "batch_size": 96},
    ]


def test_metrics_record_each_update_s_batch_k_and_scaled_rate(scheduled):
    d, _ = scheduled["micro"]
    updates = update_records(d)
    rows = [(r["step"], r["epoch"], r["batch_size"], r["subdivisions"], r["examples_seen"]) for r in updates]
    assert rows == [
        *[(s, 1, 32, 2, 32 * s) for s in range(1, 7)],
        (7, 2, 32, 2, 224),
        (8, 2, 32, 2, 256),
        (9, 2, 96, 6, 352),
        (10, 2, 96, 6, 384),  # the epoch's last 32 examples: a short batch of the new size
        (11, 3, 96, 6, 480),
        (12, 3, 96, 6, 576),
    ]
    rates = [r["learning_rate"] for r in updates]
    assert rates == pytest.approx([0.2] * 8 + [0.6] * 4, rel=1e-6)  # 0.4 x 32/64, then 0.4 x 96/64
    config = (d / "config.yaml").read_text()
    assert config.endswith(
        "# learning rate in force (linear rule from 0.4 at base_batch_size 64):\n"
        "#   0.2 at batch_size 32 from update 1\n"
        "#   0.6 at batch_size 96 from update 9\n"
    )
    from accum_train.config import load_config

    assert load_config(d / "config.yaml").batch_schedule[0].batch_size == 96  # the comment reads as nothing


def test_plan_shows_the_phases(repo_root, data_dir, tmp_path):
    path = tmp_path / "c.yaml"
    import yaml

    path.write_text(yaml.safe_dump({**SMALL, "data": {**SMALL["data"], "dir": str(data_dir)}}))
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "updates        12 in 3 epochs" in lines
    assert (
        "batch phase    from update 1 (epoch 1): batch_size 32 (k=2 of <=16), 6 updates per epoch, learning rate 0.2"
        in lines
    )
    assert (
        "batch phase    from update 9 (epoch 2): batch_size 96 (k=6 of <=16), 2 updates per epoch, learning rate 0.6"
        in lines
    )
    assert (
        "optimizer      sgd, learning_rate 0.4 at batch 64, 0.2 at batch_size 32 (linear rule), schedule constant"
        in lines
    )
    assert not [line for line in lines if line.startswith("last batch")]  # the phases' lines say theirs
    # 200 examples: a short last batch of 8 at 32, and of 8 at 96, each phase's line says so
    path.write_text(yaml.safe_dump({**SMALL, "data": {**SMALL["data"], "dir": str(data_dir), "train_limit": 200}}))
    lines = CliRunner().invoke(main, ["plan", str(path)]).stdout.splitlines()
    phases = [line for line in lines if line.startswith("batch phase")]
    assert [phase.split(" updates per epoch, ")[1] for phase in phases] == [
        "the last of 8 examples, learning rate 0.2",
        "the last of 8 examples, learning rate 0.6",
    ]


def test_micro_batch_size_runs_as_the_subdivisions_it_gives(data_dir, tmp_path):
    """micro_batch_size=16 of batch 64 is subdivisions=4: the same bits."""
    base = {
        **SMALL,
        "batch_schedule": [],
        "epochs": 1,
        "batch_size": 64,
        "data": {**SMALL["data"], "dir": str(data_dir)},
    }
    a = run({**base, "micro_batch_size": 16}, output_dir=tmp_path / "a")
    b = run({**base, "micro_batch_size": None, "subdivisions": 4}, output_dir=tmp_path / "b")
    wa, wb = np.load(tmp_path / "a" / "weights.npz"), np.load(tmp_path / "b" / "weights.npz")
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert a["subdivisions"] == b["subdivisions"] == 4


def test_api_run_refuses_both_ways_of_cutting(tmp_path):
    with pytest.raises(UserError) as caught:
        run({"batch_size": 64, "subdivisions": 4, "micro_batch_size": 16}, output_dir=tmp_path / "x")
    assert str(caught.value) == (
        "config: give subdivisions or micro_batch_size, not both (subdivisions=4, micro_batch_size=16): remove one"
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_killed_across_a_change_of_phase_resumes_to_the_uninterrupted_weights(repo_root, data_dir, tmp_path):
    """Killed (-9) during update 10, after the checkpoint at update 7 (in the middle of epoch 2 and of its
    batch-32 segment) and the change at update 9: the resume starts inside the segment, redoes updates 8-10
    across the change and ends at the uninterrupted run's weights (1e-6), every update once."""
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump({**SMALL, "checkpoint": {"every_steps": 7}, "data": {**SMALL["data"], "dir": str(data_dir)}})
    )
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    cli = [sys.executable, "-m", "accum_train.cli.main", "run"]
    done = subprocess.run(cli + [str(path), "--output-dir", str(whole), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    runner = Path(__file__).with_name("fault_runner.py")
    killed = subprocess.run(
        [sys.executable, str(runner), "run", str(path), "--output-dir", str(cut), "--quiet"],
        capture_output=True,
        text=True,
        env={**os.environ, "ACCUM_FAULT": "update:10"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    from accum_train.trainer.store.checkpoints import checkpoint_numbers

    # the premise: the resume starts inside the segment, before the change (a late kill would test nothing)
    assert checkpoint_numbers(cut / "checkpoints")[0] == 7
    resumed = subprocess.run(cli + ["--resume", str(cut), "--quiet"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    a, b = np.load(whole / "weights.npz"), np.load(cut / "weights.npz")
    diff = max_difference(a, b)
    print(f"killed across the change of phase: {diff:.2g} from uninterrupted")
    assert diff < 1e-6
    steps = [r["step"] for r in update_records(cut)]
    assert steps == list(range(1, 13))


def test_the_large_batch_page_s_configs_are_valid(repo_root):
    """The section's YAML examples are configs as written (k and the scaled rate as its text says)."""
    import re

    import yaml

    section = (repo_root / "docs" / "large-batch.md").read_text()
    first, second = [as_config(yaml.safe_load(b)) for b in re.findall(r"```yaml\n(.*?)```", section, re.S)]
    assert first.subdivisions_for(first.batch_size) == 8
    assert first.optimizer.scale_learning_rate.factor(first.batch_size) == pytest.approx(math.sqrt(8))
    assert [first.optimizer.name, second.batch_size, second.batch_schedule[0].batch_size] == ["lamb", 500, 2000]


def test_a_scheduled_run_evaluates_and_exports_from_its_checkpoint(scheduled, tmp_path):
    """evaluate and export rebuild the run without its training set: the optimizer (a schedule scaled per
    phase, no rate variable) must restore as trained, and evaluate gives summary.json's test accuracy."""
    d, summary = scheduled["micro"]
    evaluated = CliRunner().invoke(main, ["evaluate", str(d), "--output-dir", str(tmp_path / "e")])
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads((tmp_path / "e" / "evaluate.json").read_text())["test_accuracy"] == summary["test_accuracy"]
    exported = CliRunner().invoke(main, ["export", str(d), "--output", str(tmp_path / "m.keras")])
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / "m.keras").stat().st_size > 0


def test_the_large_batch_config_is_the_table_s_best_row_as_measured(repo_root):
    """configs/fmnist-large-batch.yaml is the run of the row docs/large-batch.json chose on validation at batch
    4000 or more (the same config but for log_every), and its comment gives that row's figures."""
    import dataclasses

    bench = load_file(repo_root / "benchmarks" / "large_batch.py", "large_batch")
    report = json.loads((repo_root / "docs" / "large-batch.json").read_text())
    best = max(
        (report["best"][b] for b in ("4000", "16000") if b in report["best"]),
        key=lambda b: next(r for r in report["rows"] if r["row"] == b["row"])["validation_accuracy"],
    )
    (name, _, overrides) = next(r for r in bench.rows(report["epochs"]) if r[0] == best["row"])
    measured = next(r for r in report["rows"] if r["row"] == name)
    from_row = load_config(
        repo_root / "configs" / "fmnist.yaml", [*report["base"], f"epochs={report['epochs']}", *overrides]
    )
    ours = load_config(repo_root / "configs" / "fmnist-large-batch.yaml")
    assert dataclasses.replace(ours, log_every=1) == dataclasses.replace(from_row, log_every=1)
    text = (repo_root / "configs" / "fmnist-large-batch.yaml").read_text()
    comment = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    assert f"Row {name} " in comment
    assert (
        f"validation accuracy {measured['validation_accuracy']}, test accuracy {measured['test_accuracy']}" in comment
    )
    assert f"after {measured['updates']} updates" in comment
    assert ours.optimizer.learning_rate * ours.optimizer.scale_learning_rate.factor(4000) == pytest.approx(0.024)
