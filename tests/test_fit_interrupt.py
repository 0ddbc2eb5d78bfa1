"""Ctrl-C in accum_train.fit, as a Keras user's script meets it (issue 77): a KeyboardInterrupt in every mode, after
the checkpoint of the update in hand where there is a run directory, so that ``except KeyboardInterrupt`` catches it
and ``except Exception`` does not swallow it; uncaught, it ends the process in its one line. A process started
with SIGINT ignored (a background job: ``python train.py &``) keeps ignoring it, and trains to its end. Each case runs
in a process of its own, which sends itself SIGINT after its second update."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a process per case, seconds each

SCRIPT = r"""
import json, signal, sys, numpy as np, keras, accum_train
from helpers import signal_after

mode, output_dir = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
if mode == "ignored":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job

keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x, y = np.ones((40, 3), "float32"), np.ones((40, 1), "float32")
callback = signal_after(2)  # SIGINT after the second update
fit = lambda: accum_train.fit(model, x, y, batch_size=10, subdivisions=2, epochs=2, verbose=0, output_dir=output_dir,
                              callbacks=[callback])
if mode == "uncaught":
    fit()
elif mode == "except Exception":
    try:
        fit()
    except Exception as err:
        print(json.dumps({"caught by": "Exception", "type": type(err).__name__}))
else:
    try:
        fit()
        print(json.dumps({"finished": int(model.optimizer.iterations), "updates": callback.seen,
                          "SIGINT": str(signal.getsignal(signal.SIGINT))}))
    except KeyboardInterrupt as err:
        print(json.dumps({"caught by": "KeyboardInterrupt", "type": type(err).__name__, "line": str(err),
                          "updates": int(model.optimizer.iterations)}))
"""


def call(mode, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", SCRIPT, mode, *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip


def said(done) -> dict:
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("with_dir", [True, False], ids=["output_dir", "no output_dir"])
def test_ctrl_c_in_fit_is_a_keyboard_interrupt_after_the_update_in_hand(tmp_path, with_dir):
    done = call("caught", *([tmp_path / "run"] if with_dir else []))
    found = said(done)
    assert found["caught by"] == "KeyboardInterrupt"
    if with_dir:  # the run directory's: after update 2, its checkpoint saved, with the way to go on
        assert (found["type"], found["updates"]) == ("Interrupted", 2)
        assert found["line"] == (
            f"stopped by SIGINT after update 2; checkpoint saved; to go on, call accum_train.fit again with "
            f"output_dir={str(tmp_path / 'run')!r}"
        )
        assert (tmp_path / "run" / "checkpoints" / "ckpt-2.index").is_file()
    else:
        assert found["type"] == "KeyboardInterrupt"


def test_an_except_exception_block_does_not_swallow_ctrl_c_and_uncaught_it_ends_in_one_line(tmp_path):
    """Uncaught, the traceback ends in the line that says where the run stopped; the exit code is 1 (CPython ends
    by SIGINT, the shell's 130, only for KeyboardInterrupt itself, not a subclass: its run_eval_code_obj)."""
    for mode in ("except Exception", "uncaught"):
        done = call(mode, tmp_path / mode.replace(" ", "-"))
        assert "caught by" not in done.stdout and done.returncode == 1
        assert (
            done.stderr.strip()
            .splitlines()[-1]
            .startswith(
                "accum_train.errors.Interrupted: stopped by SIGINT after update 2; checkpoint saved; to go on, call "
            )
        )


def test_a_process_started_with_sigint_ignored_keeps_ignoring_it(tmp_path):
    found = said(call("ignored", tmp_path / "run"))
    assert found == {"finished": 8, "updates": 8, "SIGINT": str(signal.SIG_IGN)}
