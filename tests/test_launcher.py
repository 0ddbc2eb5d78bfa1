"""`run --workers N`: the supervisor checks once, hands every worker the same
resolved config file, and never imports TensorFlow (fresh interpreters: this
test process has TensorFlow loaded). The workers themselves are exercised in
test_distribute.py (slow)."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from accum_train.config import load_config

SUPERVISOR = """
import json, os, sys
from pathlib import Path
import accum_train.from_config.launcher as launcher
from accum_train.cli.main import main
seen = {"launches": []}
# ACCUM_TEST_CODES: the exit code of each launch in turn (default: one failure); a launch writes the first
# checkpoint, and a successful one summary.json
codes = [int(c) for c in os.environ.get("ACCUM_TEST_CODES", "1").split(",")]
def launch(args, workers, timeout_s, say, env=None):
    seen.update(args=args, workers=workers, timeout_s=timeout_s, config=open(args[0]).read(),
                tensorflow="tensorflow" in sys.modules)
    seen["launches"].append({"args": args[1:], "env": env})
    code = codes[len(seen["launches"]) - 1]
    run_dir = Path(args[2])
    if os.environ.get("ACCUM_TEST_CODES"):
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        (run_dir / "checkpoints" / "ckpt-0.index").touch()
    if code == 0:
        (run_dir / "summary.json").write_text(json.dumps({"restarts": int(env["ACCUM_TRAIN_RESTARTS"])}))
        return 0, None
    if code in (130, 143):  # the chief's own line, as a stopped run prints it
        name = "SIGINT" if code == 130 else "SIGTERM"
        return code, f"stopped by {name} after update 3; checkpoint saved. Resume with: accum-train run " + \
            f"--resume {run_dir}"
    return code, f"worker {len(seen['launches']) % 2} exited with code {code} (for the test)"
launcher.launch = launch
try:
    main(sys.argv[1:])
except SystemExit as done:
    seen["code"] = done.code
seen["tensorflow_at_exit"] = "tensorflow" in sys.modules
print(json.dumps(seen))
"""


def supervise(*args, codes=None):
    env = {**os.environ, "ACCUM_TEST_CODES": codes} if codes else None
    done = subprocess.run(
        [sys.executable, "-c", SUPERVISOR, "run", *args], capture_output=True, text=True, timeout=120, env=env
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr, done.stdout.strip().splitlines()[:-1]


def test_supervisor_hands_over_one_resolved_config_without_tensorflow(tmp_path, repo_root):
    smoke = repo_root / "configs" / "smoke.yaml"
    out = tmp_path / "run"
    seen, stderr, _ = supervise(
        str(smoke), "--set", "model.norm=none", "--set", "subdivisions=3", "--output-dir", str(out), "--workers", "2"
    )
    assert seen["code"] == 1
    assert stderr.strip().splitlines()[-1] == (
        "error: worker 1 exited with code 1 (for the test); stopped all 2 workers (the last checkpoint stays readable)"
    )
    assert not seen["tensorflow"] and not seen["tensorflow_at_exit"]
    assert seen["args"][1:] == ["--output-dir", str(out)] and seen["workers"] == 2
    handed = yaml.safe_load(seen["config"])
    expected = load_config(smoke, ["model.norm=none", "subdivisions=3", "strategy.name=multi_worker"])
    assert handed == expected.to_dict()
    assert not out.exists()  # the supervisor's lock was all there was: it is gone with the supervisor


def test_supervisor_reports_bad_input_once_before_any_worker(tmp_path, repo_root):
    out = tmp_path / "run"
    seen, stderr, _ = supervise(
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


WORKERS = ["--set", "model.norm=none", "--workers", "2"]


# (exit code of each launch, --max-restarts, exit code of the run, its stdout's restart lines, its last line)
RESTART_CASES = [
    (
        "1,1,1",
        "2",
        1,
        [
            "worker 1 exited with code 1 (for the test): restarting all 2 workers from the last checkpoint "
            "(restart 1 of 2)",
            "worker 0 exited with code 1 (for the test): restarting all 2 workers from the last checkpoint "
            "(restart 2 of 2)",
        ],
        "error: worker 1 exited with code 1 (for the test); stopped all 2 workers after 2 restarts "
        "(--max-restarts 2) (the last checkpoint stays readable)",
    ),
    (
        "-9,1,0",
        "3",
        0,
        [
            "worker 1 exited with code -9 (for the test): restarting all 2 workers from the last checkpoint "
            "(restart 1 of 3)",
            "worker 0 exited with code 1 (for the test): restarting all 2 workers from the last checkpoint "
            "(restart 2 of 3)",
        ],
        None,
    ),
    (
        "143",
        "3",
        143,
        [],
        # as one process's stop (no "error:"), resumed with as many workers
        "stopped by SIGTERM after update 3; checkpoint saved. Resume with: accum-train run --resume {out} --workers 2",
    ),
    (
        "3",
        "3",
        3,
        [],
        "error: out of memory: worker 1 exited with code 3 (for the test); stopped all 2 workers "
        "(the last checkpoint stays readable)",
    ),
]


@pytest.mark.parametrize("codes, max_restarts, code, restarts, last", RESTART_CASES)
def test_the_supervisor_restarts_every_worker_from_the_last_checkpoint(
    tmp_path, repo_root, codes, max_restarts, code, restarts, last
):
    out = tmp_path / "run"
    args = [str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out), *WORKERS]
    seen, stderr, stdout = supervise(*args, "--max-restarts", max_restarts, codes=codes)
    assert seen["code"] == code
    assert [line for line in stdout if "restart" in line] == restarts
    launches = seen["launches"]
    assert len(launches) == len(restarts) + 1
    # the first start as asked, every restart a resume of the run directory, each told its restart count
    assert [launch["args"] for launch in launches] == [["--output-dir", str(out)]] + [["--resume", str(out)]] * len(
        restarts
    )
    assert [launch["env"] for launch in launches] == [{"ACCUM_TRAIN_RESTARTS": str(i)} for i in range(len(launches))]
    if last is None:
        assert json.loads((out / "summary.json").read_text()) == {"restarts": len(restarts)}
    else:
        assert stderr.strip().splitlines()[-1] == last.format(out=out)


# (arguments after the config, the one line)
BAD_RESTARTS = [
    (["--max-restarts", "-1", "--workers", "2"], "error: --max-restarts -1 must be an integer >= 0"),
    (
        ["--max-restarts", "2"],
        "error: --max-restarts needs --workers N: the supervisor of N workers restarts them; a single process goes "
        "on with 'accum-train run --resume RUN_DIR'",
    ),
]


@pytest.mark.parametrize("args, message", BAD_RESTARTS)
def test_bad_max_restarts_is_one_line_and_exit_2(tmp_path, repo_root, args, message):
    out = tmp_path / "run"
    seen, stderr, _ = supervise(str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out), *args)
    assert (seen["code"], stderr) == (2, message + "\n")
    assert seen["launches"] == [] and not out.exists()


@pytest.mark.parametrize(
    "stderr, said",
    [
        (
            ["error: batch_size=0 must be >= 1", "I0000 00:00:1.0 port.cc:153] oneDNN"],
            "error: batch_size=0 must be >= 1",
        ),
        (["Traceback (most recent call last):", '  File "x.py", line 1', "ValueError: bad"], "ValueError: bad"),
        # Python compiling a module without its .pyc warns on stderr: not why the child failed
        (
            [
                '/venv/site-packages/tensorlayer/models/seq2seq.py:93: SyntaxWarning: "is" with a literal. Did you '
                'mean "=="?',
                "  if x is 0:",
            ],
            "no message",
        ),
        (
            ["ValueError: bad", "/venv/lib/keras/src/utils.py:12: UserWarning: a deprecation"],
            "ValueError: bad",
        ),
        (["stopped by SIGTERM after update 3", "WARNING: All log messages"], "stopped by SIGTERM after update 3"),
    ],
    ids=["ours", "traceback", "compile-warning", "warning-after-the-exception", "stopped"],
)
def test_the_line_that_says_why_a_child_failed(stderr, said):
    from accum_train.processes import last_error

    assert last_error(line + "\n" for line in stderr) == said
