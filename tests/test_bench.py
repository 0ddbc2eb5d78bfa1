"""`accum-train bench`: one fresh process per k, bench.json read back, a PNG
that decodes, and its input errors."""

import json

import matplotlib.image
import pytest
from click.testing import CliRunner

from accum_train.cli.main import main


@pytest.mark.slow  # one fresh process per k
def test_bench_writes_json_png_and_table(tmp_path, repo_root):
    out = tmp_path / "bench"
    result = CliRunner().invoke(main, ["bench", str(repo_root / "configs" / "smoke.yaml"), "--subdivisions", "1,4",
                                       "--steps", "2", "--set", "batch_size=256", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench.json").read_text())
    rows = data["rows"]
    assert [(r["subdivisions"], r["micro_batch_size"], r["batch_size"]) for r in rows] == [(1, 256, 256), (4, 64, 256)]
    for r in rows:
        assert r["examples_per_s"] == pytest.approx(256 / r["median_s_per_update"])
        assert r["cpu_s_per_example"] > 0 and r["peak_rss_bytes"] > 0
    # a quarter of the micro-batch needs less allocator memory
    assert rows[1]["peak_memory_bytes"] < rows[0]["peak_memory_bytes"]
    assert matplotlib.image.imread(out / "bench.png").shape[1] > 500
    table = result.stdout.splitlines()
    assert table[-5].split()[:2] == ["k", "micro"]
    assert table[-4].split()[:2] == ["1", "256"] and table[-3].split()[:2] == ["4", "64"]
    assert table[-2] == "(ratios against k=1; median of 2 updates each, one fresh process per k)"
    assert table[-1] == f"written: {out / 'bench.json'}, {out / 'bench.png'}"
    assert not list(out.glob("config-k*.yaml"))  # the workers' configs are cleaned up


@pytest.mark.parametrize("value, message", [
    ("1,x", "--subdivisions '1,x' must be a comma-separated list of integers >= 1, e.g. 1,2,4,8,16"),
    ("0,2", "--subdivisions '0,2' must be a comma-separated list of integers >= 1, e.g. 1,2,4,8,16"),
    ("1,100", "--subdivisions 100 is more than batch_size=64: a micro-batch holds at least one example"),
])
def test_bench_bad_subdivisions(tmp_path, repo_root, value, message):
    out = tmp_path / "bench"
    result = CliRunner().invoke(main, ["bench", str(repo_root / "configs" / "smoke.yaml"),
                                       "--subdivisions", value, "--output-dir", str(out)])
    assert (result.exit_code, result.stderr) == (2, f"error: {message}\n")
    assert not out.exists()
