"""`run --workers N`: the supervisor checks once, hands every worker the same
resolved config file, and never imports TensorFlow (fresh interpreters: this
test process has TensorFlow loaded). The workers themselves are exercised in
test_distribute.py (slow)."""

import json
import subprocess
import sys

import yaml
from accum_train.config import load_config

SUPERVISOR = """
import json, sys
import accum_train.launcher as launcher
from accum_train.cli.main import main
seen = {}
def launch(args, workers, timeout_s, echo):
    seen.update(args=args, workers=workers, timeout_s=timeout_s, config=open(args[0]).read(),
                tensorflow="tensorflow" in sys.modules)
    return 1, "worker 1 exited with code 9 (for the test)"
launcher.launch = launch
try:
    main(sys.argv[1:])
except SystemExit as done:
    seen["code"] = done.code
seen["tensorflow_at_exit"] = "tensorflow" in sys.modules
print(json.dumps(seen))
"""


def supervise(*args):
    done = subprocess.run([sys.executable, "-c", SUPERVISOR, "run", *args], capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_supervisor_hands_over_one_resolved_config_without_tensorflow(tmp_path, repo_root):
    smoke = repo_root / "configs" / "smoke.yaml"
    out = tmp_path / "run"
    seen, stderr = supervise(
        str(smoke), "--set", "model.norm=none", "--set", "subdivisions=3", "--output-dir", str(out), "--workers", "2"
    )
    assert seen["code"] == 1
    assert stderr.strip().splitlines()[-1] == "error: worker 1 exited with code 9 (for the test)"
    assert not seen["tensorflow"] and not seen["tensorflow_at_exit"]
    assert seen["args"][1:] == ["--output-dir", str(out), "--quiet"] and seen["workers"] == 2
    handed = yaml.safe_load(seen["config"])
    expected = load_config(smoke, ["model.norm=none", "subdivisions=3", "strategy.name=multi_worker"])
    assert handed == expected.to_dict()
    assert not out.exists()  # the chief creates the run directory; the supervisor writes nothing there


def test_supervisor_reports_bad_input_once_before_any_worker(tmp_path, repo_root):
    out = tmp_path / "run"
    seen, stderr = supervise(
        str(repo_root / "configs" / "smoke.yaml"),
        "--set",
        "data.dir=" + str(tmp_path / "no"),
        "--set",
        "model.norm=none",
        "--output-dir",
        str(out),
        "--workers",
        "2",
    )
    assert seen["code"] == 2 and "args" not in seen  # no worker was started
    assert stderr.startswith(f"error: data.dir={tmp_path / 'no'} does not exist: ")
    assert stderr.count("\n") == 1
    assert not seen["tensorflow_at_exit"] and not out.exists()
