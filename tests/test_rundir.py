"""The one checkpoint policy of both doors (trainer/store/rundir.py's CheckpointPolicy): when an update saves one."""

import pytest
from accum_train.defaults import CHECKPOINT_SECONDS
from accum_train.trainer.store import rundir
from accum_train.trainer.store.rundir import CheckpointPolicy

CLI = CheckpointPolicy(keep=3, every_steps=50, at_start=True)  # the CLI's: by count (checkpoint.every_steps)
FIT = CheckpointPolicy(keep=3, every_seconds=CHECKPOINT_SECONDS)  # fit's: by time since the last one


@pytest.mark.parametrize(
    ("policy", "step", "since_saved", "due"),
    [
        (CLI, 50, 0.0, True),
        (CLI, 100, 0.0, True),
        (CLI, 49, 10_000.0, False),  # no time rule: only the count
        (CLI, 51, 0.0, False),
        (FIT, 1, CHECKPOINT_SECONDS, True),
        (FIT, 7, CHECKPOINT_SECONDS - 1, False),
        (FIT, 50, 0.0, False),  # no count rule: only the time
        (CheckpointPolicy(keep=1, every_steps=4, every_seconds=60.0), 3, 60.0, True),  # either measure
        (CheckpointPolicy(keep=1, every_steps=4, every_seconds=60.0), 4, 0.0, True),
        (CheckpointPolicy(keep=1, every_steps=4, every_seconds=60.0), 5, 59.0, False),
        (CheckpointPolicy(keep=1), 10, 10_000.0, False),  # neither: epochs' ends and stops only
    ],
)
def test_an_update_checkpoints_by_the_policy_s_count_or_time(monkeypatch, policy, step, since_saved, due):
    monkeypatch.setattr(rundir.time, "time", lambda: 1_000_000.0 + since_saved)
    assert policy.due(step, saved_at=1_000_000.0) is due
