"""Elastic resume: a run continues on another strategy and number of replicas, with the same
global batch, data order, schedule and update count, and ends at the uninterrupted weights.

Fresh processes for every segment (logical devices and the multi-worker runtime are fixed
once TensorFlow runs), all under the same thread pools, workers on loopback inside a private
network namespace (test_distribute.private_network)."""

import json
import math
import sys

import helpers
import pytest
from accum_train.from_config.lifecycle import adapt_subdivisions
from helpers import max_difference
from test_distribute import CLI, SMALL, private_network, run, same_thread_pools, weights  # noqa: F401

# test_distribute's small run (200 examples / batch 64: 4 updates per epoch, the last one short; BN-free,
# constant rate, k=3); each test sets its own epochs after it (a later --set wins).
ARGS = SMALL


@pytest.mark.parametrize(
    ("batch_size", "replicas_before", "k_before", "replicas", "expected"),
    [
        (64, 2, 3, 1, 6),  # shares of 32 as 11, 11, 10: the whole batch needs 6 of at most 11
        (64, 1, 6, 2, 3),
        (64, 2, 3, 2, 3),  # no change
        (64, 1, 1, 4, 1),  # smaller shares never need more micro-batches
        (10, 3, 1, 1, 3),  # shares 4, 3, 3: micro-batches of at most 4
        (7, 1, 7, 4, 2),  # shares of 2: at most 1 example each
    ],
)
def test_adapted_subdivisions_keep_every_micro_batch_within_the_old_largest(
    batch_size, replicas_before, k_before, replicas, expected
):
    assert adapt_subdivisions(batch_size, replicas_before, k_before, replicas) == expected
    old = math.ceil(math.ceil(batch_size / replicas_before) / k_before)
    new = math.ceil(math.ceil(batch_size / replicas) / expected)
    assert new <= old


@pytest.mark.slow
@pytest.mark.workers
@pytest.mark.parametrize("optimizer", ["adam"])  # its moments must carry over too (SGD's case is a part of it)
def test_two_workers_then_one_device_then_mirrored_end_at_the_uninterrupted_weights(tmp_path, repo_root, optimizer):
    config = str(repo_root / "configs" / "smoke.yaml")
    args = [*ARGS, "--set", f"optimizer.name={optimizer}"]
    whole = run(
        private_network(
            CLI + [config, *args, "--set", "epochs=3", "--workers", "2", "--output-dir", str(tmp_path / "whole")]
        )
    )
    assert whole.returncode == 0, whole.stderr

    cut = tmp_path / "cut"
    first = run(private_network(CLI + [config, *args, "--set", "epochs=1", "--workers", "2", "--output-dir", str(cut)]))
    assert first.returncode == 0, first.stderr
    alone = run(CLI + ["--resume", str(cut), "--set", "epochs=2", "--set", "strategy.name=default", "--quiet"])
    assert alone.returncode == 0, alone.stderr
    assert (
        "replicas changed since the checkpoint: 2 -> 1; subdivisions 3 -> 6 (micro-batches of up to 11 examples, "
        "at most as before); batch_size, data order, learning-rate schedule and update count unchanged"
    ) in alone.stdout.splitlines()
    mirrored = run(
        CLI
        + [
            "--resume",
            str(cut),
            "--set",
            "epochs=3",
            "--set",
            "strategy.name=mirrored",
            "--set",
            "strategy.cpu_devices=2",
            "--quiet",
        ]
    )
    assert mirrored.returncode == 0, mirrored.stderr
    assert "replicas changed since the checkpoint: 1 -> 2; subdivisions 6 -> 3" in mirrored.stdout

    difference = max_difference(weights(cut), weights(tmp_path / "whole"))
    print(f"{optimizer}: 2 workers, then 1 device, then mirrored against 2 workers throughout: {difference:.1e}")
    assert difference < 1e-5
    records = helpers.records(cut)
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 13))  # every update once
    assert [r["epoch"] for r in records if "elapsed_s" in r] == [1, 2, 3]
    history = [json.loads(line) for line in (cut / "history.jsonl").read_text().splitlines()]
    assert [
        (h["event"], h["step"], h["strategy"], h["workers"], h["launcher"], h["replicas"], h["subdivisions"])
        for h in history
    ] == [
        ("start", 0, "multi_worker", 2, True, 2, 3),  # started by --workers: describe's way to go on repeats it
        ("resume", 4, "default", 1, False, 1, 6),
        ("resume", 8, "mirrored", 1, False, 2, 3),
    ]
    summary = json.loads((cut / "summary.json").read_text())
    assert (summary["replicas"], summary["subdivisions"], summary["steps"]) == (2, 3, 12)


@pytest.mark.slow
@pytest.mark.workers
def test_one_device_resumed_on_two_workers(tmp_path, repo_root):
    """The other way: --resume --workers 2 takes a one-device run over to workers (its config's
    strategy replaced); k halves with the shares."""
    config = str(repo_root / "configs" / "smoke.yaml")
    args = [*ARGS, "--set", "optimizer.name=sgd", "--set", "subdivisions=6"]
    whole = run(CLI + [config, *args, "--set", "epochs=2", "--output-dir", str(tmp_path / "whole")])
    assert whole.returncode == 0, whole.stderr
    cut = tmp_path / "cut"
    first = run(CLI + [config, *args, "--set", "epochs=1", "--output-dir", str(cut)])
    assert first.returncode == 0, first.stderr
    workers = run(private_network(CLI + ["--resume", str(cut), "--set", "epochs=2", "--workers", "2", "--quiet"]))
    assert workers.returncode == 0, workers.stderr
    assert "replicas changed since the checkpoint: 1 -> 2; subdivisions 6 -> 3" in workers.stdout
    assert max_difference(weights(cut), weights(tmp_path / "whole")) < 1e-5
    assert "name: multi_worker" in (cut / "config.yaml").read_text()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-m", "slow", "-s"]))
