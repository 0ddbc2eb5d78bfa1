"""Issue 77: a config's or a run directory's error comes before TensorFlow (or Keras, which loads it) is imported,
so that it is reported at once (it took 5 to 7 s under `run`). Each case runs the CLI in a fresh process and asserts
the one line it ends with, its exit code, and that neither TensorFlow nor Keras was imported by then."""

import json
import subprocess
import sys

import pytest

CHECK = r"""
import sys
from accum_train.cli.main import main
try:
    main(sys.argv[1:], standalone_mode=True)
except SystemExit as end:
    print("LOADED", sorted(m for m in ("tensorflow", "keras", "jax") if m in sys.modules), end.code)
"""


def cli(args, cwd, env=None):
    done = subprocess.run([sys.executable, "-c", CHECK, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)  # fmt: skip
    line = next(line for line in done.stdout.splitlines() if line.startswith("LOADED "))
    return json.loads(line.split(" ", 1)[1].rsplit(" ", 1)[0].replace("'", '"')), int(line.rsplit(" ", 1)[1]), done


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "typo.yaml").write_text("model: {name: mlp}\nbatch_sise: 32\n")
    other = tmp_path / "jax-run"
    other.mkdir()
    (other / "config.yaml").write_text("model: {name: mlp}\n")
    (other / "checkpoints").mkdir()
    (other / "run.json").write_text(json.dumps({"door": "config", "backend": "jax", "spec": None, "data": None}))
    fit = tmp_path / "fit-run"  # what accum_train.fit(output_dir=...) records, as far as evaluate reads it first
    fit.mkdir()
    record = {"door": "fit", "backend": "tensorflow", "spec": None, "data": None, "fit": {"batch_size": 8}}
    (fit / "run.json").write_text(json.dumps(record))
    return tmp_path


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "typo.yaml"], "error: typo.yaml: unknown key 'batch_sise' (did you mean 'batch_size'?)"),
        (["run", "--resume", "nowhere"], "error: --resume nowhere does not exist: pass a directory written by "
         "'accum-train run'"),
        (["run", "--resume", "jax-run"], "error: --resume jax-run was written on Keras' jax backend, whose checkpoints "
         "the tensorflow backend does not read: resume it with KERAS_BACKEND=jax"),
        (["evaluate", "fit-run"], "error: fit-run was written by accum_train.fit, which keeps no data: pass the data "
         "to evaluate on with --data FILE.npz, saved by numpy.savez(FILE, x=inputs, y=targets[, "
         "sample_weight=weights])"),
        (["evaluate", "fit-run", "--set", "data.test_limit=3"], "error: --set data.test_limit=3: fit-run was written "
         "by accum_train.fit and keeps no config to change: pass the data to evaluate on with --data FILE.npz"),
        (["plan", "typo.yaml"], "error: typo.yaml: unknown key 'batch_sise' (did you mean 'batch_size'?)"),
        (["describe", "nowhere"], "error: nowhere is not a run directory (no config.yaml with checkpoints/, nor "
         "fit.json): pass a directory written by 'accum-train run' or by accum_train.fit(output_dir=...)"),
    ],
)  # fmt: skip
def test_a_config_or_run_directory_error_comes_before_tensorflow_loads(folder, args, message):
    loaded, code, done = cli(args, folder, env={"PATH": "/usr/bin:/bin", "KERAS_BACKEND": "tensorflow"})
    assert (code, done.stderr.strip().splitlines()[-1], loaded) == (2, message, [])
