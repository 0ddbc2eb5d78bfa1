"""`accum-train bench`: one fresh process per k, bench.json read back, a PNG
that decodes, and its input errors."""

import json

import matplotlib.image
import pytest
from accum_train.cli.main import main
from accum_train.trainer import runtime
from click.testing import CliRunner


@pytest.mark.slow  # one fresh process per k
def test_bench_writes_json_png_and_table(tmp_path, repo_root):
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        main,
        [
            "bench",
            str(repo_root / "configs" / "smoke.yaml"),
            "--subdivisions",
            "1,4,1",  # each k measured once
            "--steps",
            "2",
            "--set",
            "batch_size=256",
            "--output-dir",
            str(out),
        ],
    )
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
    assert table[-5].split()[:3] == ["precision", "k", "micro"]
    assert table[-4].split()[:3] == ["float32", "1", "256"] and table[-3].split()[:3] == ["float32", "4", "64"]
    assert table[-2] == ("(ratios against float32 k=1; 2 updates per measurement, one fresh process each; one round)")
    assert table[-1] == f"written: {out / 'bench.json'}, {out / 'bench.png'}"
    assert not list(out.glob("config-k*.yaml"))  # the workers' configs are cleaned up
    # each worker ran under the thread pools a run of its k sets (0: TensorFlow's default)
    assert [r["parallel_micro_steps"] for r in rows] == [1, runtime.auto_parallel(4)]
    for r in rows:
        pools = runtime.thread_pools(r["parallel_micro_steps"]) or {"intra": 0, "inter": 0}
        assert (r["intra_op_threads"], r["inter_op_threads"]) == (pools["intra"], pools["inter"])
    # the table says so
    assert table[-4].endswith("  1 in flight, defaults")
    in_flight = rows[1]["parallel_micro_steps"]
    pools = runtime.thread_pools(in_flight)
    said = f"intra {pools['intra']}, inter {pools['inter']}" if pools else "defaults"
    assert table[-3].endswith(f"  {in_flight} in flight, {said}")


@pytest.mark.slow  # 2 rounds x 2 variants, a fresh process each
def test_bench_rounds_alternate_precisions_and_report_ratio_spreads(tmp_path, repo_root):
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        main,
        [
            "bench",
            str(repo_root / "configs" / "smoke.yaml"),
            "--subdivisions",
            "4",
            "--precision",
            "float32,mixed_bfloat16",
            "--rounds",
            "2",
            "--steps",
            "2",
            "--output-dir",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench.json").read_text())
    assert data["rounds"] == 2
    first, bf16 = data["rows"]
    assert (first["precision"], bf16["precision"]) == ("float32", "mixed_bfloat16")
    assert len(bf16["rounds_s_per_update"]) == len(bf16["rounds_cpu_s_per_example"]) == 2
    # each ratio is taken within a round: the median of the two per-round ratios
    ratios = [b / f for b, f in zip(bf16["rounds_cpu_s_per_example"], first["rounds_cpu_s_per_example"])]
    assert bf16["cpu_ratio"] == pytest.approx({"median": sum(ratios) / 2, "min": min(ratios), "max": max(ratios)})
    assert first["cpu_ratio"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    lines = result.stdout.splitlines()
    assert lines[-4].split()[:3] == ["float32", "4", "16"] and lines[-3].split()[:3] == ["mixed_bfloat16", "4", "16"]
    assert lines[-2].endswith("medians over 2 alternating rounds, [min-max] of the per-round ratios)")


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--subdivisions", "1,x"],
            "--subdivisions '1,x' must be a comma-separated list of integers >= 1, e.g. 1,2,4,8,16",
        ),
        (
            ["--subdivisions", "0,2"],
            "--subdivisions '0,2' must be a comma-separated list of integers >= 1, e.g. 1,2,4,8,16",
        ),
        (
            ["--subdivisions", "1,100"],
            "--subdivisions 100 is more than batch_size=64: a micro-batch holds at least one example",
        ),
        (
            ["--micro-batch-size", "16,x"],
            "--micro-batch-size '16,x' must be a comma-separated list of integers >= 1, e.g. 500,250",
        ),
        (["--micro-batch-size", "16", "--subdivisions", "4"], "give --subdivisions or --micro-batch-size, not both"),
    ],
)
def test_bench_bad_subdivisions(tmp_path, repo_root, args, message):
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        main, ["bench", str(repo_root / "configs" / "smoke.yaml"), *args, "--output-dir", str(out)]
    )
    assert (result.exit_code, result.stderr) == (2, f"error: {message}\n")
    assert not out.exists()


def test_bench_bad_precision(tmp_path, repo_root):
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        main,
        ["bench", str(repo_root / "configs" / "smoke.yaml"), "--precision", "float32,fp16", "--output-dir", str(out)],
    )
    message = "--precision 'float32,fp16' must be a comma-separated list of float32, mixed_bfloat16, mixed_float16"
    assert (result.exit_code, result.stderr) == (2, f"error: {message}\n")
    assert not out.exists()
