"""The Python API: ``accum_train.run`` as the CLI's one code path, and the package's public names.
(``accum_train.fit``: tests/test_fit_*.py.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import accum_train
import numpy as np
import pytest
from accum_train import UserError


def test_run_raises_user_error_and_never_exits(tmp_path):
    with pytest.raises(UserError) as caught:
        accum_train.run({"batch_size": 0}, output_dir=tmp_path / "x")
    assert str(caught.value) == "config: batch_size=0 must be >= 1 and <= 1000000"
    with pytest.raises(UserError) as caught:
        accum_train.run()
    assert str(caught.value) == (
        "missing CONFIG: pass a YAML file, e.g. 'accum-train run configs/fmnist.yaml', or --resume RUN_DIR"
    )
    assert not (tmp_path / "x").exists()


def test_the_public_names():
    assert sorted(accum_train.__all__) == ["Progress", "UserError", "__version__", "fit", "run"]


SMOKE = {
    "model": {"name": "mlp", "hidden": 16},
    "batch_size": 64,
    "subdivisions": 3,
    "epochs": 1,
    "data": {"train_limit": 256, "test_limit": 100},
}


@pytest.mark.slow  # two fresh processes of ~15 s each
def test_run_from_a_dict_ends_at_the_bits_of_the_cli(tmp_path, repo_root, data_dir):
    """Both in fresh processes of the same environment (thread pools included)."""
    env = {**os.environ, "ACCUM_TRAIN_DATA": str(data_dir), "TF_NUM_INTRAOP_THREADS": "1"}
    config = tmp_path / "smoke.yaml"
    config.write_text(json.dumps(SMOKE))  # JSON is YAML
    cli = subprocess.run(
        [sys.executable, "-m", "accum_train.cli.main", "run", str(config), "--output-dir", str(tmp_path / "cli")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    script = (
        f"import sys, json, accum_train; accum_train.run(json.loads(sys.argv[1]), output_dir={str(tmp_path / 'api')!r})"
    )
    api = subprocess.run([sys.executable, "-c", script, json.dumps(SMOKE)], env=env, capture_output=True, text=True)
    assert api.returncode == 0, api.stderr
    a, b = np.load(tmp_path / "cli" / "weights.npz"), np.load(tmp_path / "api" / "weights.npz")
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    assert Path(tmp_path / "api" / "config.yaml").read_text() == Path(tmp_path / "cli" / "config.yaml").read_text()
