"""benchmarks/peers_keras.py end to end at a tiny setting: the JSON it writes, the number of updates
Keras made, and ratios that are what the times give, never displayed in accum-train's favour."""

import json
import statistics
import subprocess
import sys
from decimal import ROUND_FLOOR, Decimal

import pytest

METHODS = [
    "(a) accum-train",
    "(a1) accum-train, 1 at a time",
    "(a1') accum-train, 1 at a time, threads",
    "(b) keras GA, fit",
    "(b') keras GA, fit, spe=k",
    "(b'') keras GA, spe=k, threads",
    "(b''') keras GA, spe=k, XLA",
    "(e) plain, whole batch",
]
KERAS = METHODS[3:7]  # (e) is no Keras variant: never the one the a/b ratios are taken against


@pytest.mark.slow  # eight timing processes, each starting TensorFlow and tracing its update
def test_peers_keras_json_ratios_and_keras_updates(tmp_path, repo_root):
    out = tmp_path / "peers-keras.json"
    rounds, updates = 2, 1
    argv = ["--k", "4", "--micro", "8", "--rounds", str(rounds), "--updates", str(updates), "--output", str(out)]
    result = subprocess.run(
        [sys.executable, str(repo_root / "benchmarks" / "peers_keras.py"), *argv],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    keys = {"args", "model", "environment", "time", "ratios", "ratios_a_b_per_keras_variant", "a_b_against", "a1_best"}
    assert set(data) == keys | {"paired_ratios", "paired_ratios_a_b_per_keras_variant"}
    times = data["time"]
    assert list(times) == METHODS
    for name, r in times.items():
        assert len(r["rounds_cpu_s_per_example"]) == len(r["rounds_wall_s_per_example"]) == rounds
        assert r["cpu_s_per_example"] == statistics.median(r["rounds_cpu_s_per_example"])
        assert r["examples_per_cpu_s"] == pytest.approx(1 / r["cpu_s_per_example"])
        # one fit per round over every update of the round, plus the warm-up round's
        assert r.get("optimizer_updates") == ((rounds + 1) * updates if "keras" in name else None)
    assert times[METHODS[0]]["threads"] == {"intra": 1, "inter": 2}  # accum-train's own choice on this CPU
    assert times[METHODS[2]]["threads"] == times[METHODS[0]]["threads"]  # (a1'): one at a time under (a)'s pools

    assert times[METHODS[7]]["threads"] == "tensorflow defaults"  # (e): one pass, TensorFlow's own pools
    best_cpu = min(KERAS, key=lambda name: times[name]["cpu_s_per_example"])
    best_wall = min(KERAS, key=lambda name: times[name]["wall_s_per_example"])
    assert data["a_b_against"] == {"cpu": best_cpu, "wall": best_wall}
    ratios = data["ratios"]
    a = times[METHODS[0]]
    assert ratios["a/b examples per CPU-second"] == pytest.approx(
        times[best_cpu]["cpu_s_per_example"] / a["cpu_s_per_example"]
    )
    assert ratios["a/b examples per wall-second"] == pytest.approx(
        times[best_wall]["wall_s_per_example"] / a["wall_s_per_example"]
    )
    # one micro-step at a time: the faster of (a1) and (a1') by each measure, against the same Keras variants
    one = {m: min(METHODS[1:3], key=lambda name: times[name][f"{m}_s_per_example"]) for m in ("cpu", "wall")}
    assert data["a1_best"] == one
    details = data["ratios_a_b_per_keras_variant"]
    for m, best in (("cpu", best_cpu), ("wall", best_wall)):
        unit = "CPU" if m == "cpu" else "wall"
        measured = times[best][f"{m}_s_per_example"] / times[one[m]][f"{m}_s_per_example"]
        assert details[f"a1/b examples per {unit}-second (one micro-step at a time)"] == pytest.approx(measured)
    # each ratio also round by round, between the same methods: (a) against the same Keras variant
    for unit, m, best in (("CPU", "cpu", best_cpu), ("wall", "wall", best_wall)):
        got = data["paired_ratios"][f"a/b examples per {unit}-second"]
        key = f"rounds_{m}_s_per_example"
        assert got["per_round"] == pytest.approx([b / o for o, b in zip(a[key], times[best][key])])
        assert got["rounds"] == rounds and got["low"] <= got["median"] <= got["high"]
    assert set(data["paired_ratios_a_b_per_keras_variant"]) == set(data["ratios_a_b_per_keras_variant"])
    # "  NAME   SHOWN  MEDIAN [LOW, HIGH]  FULL"
    printed = {line[:60].strip(): line[60:].split() for line in result.stdout.splitlines() if line.startswith("  a")}
    every_paired = {**data["paired_ratios"], **data["paired_ratios_a_b_per_keras_variant"]}
    for name, value in {**ratios, **data["ratios_a_b_per_keras_variant"]}.items():
        shown, median, low, high, full = printed[name]
        assert float(full) == value
        # 3 decimals, rounded down (higher is better for accum-train): never above the measured ratio
        assert Decimal(shown) <= Decimal(repr(value)) < Decimal(shown) + Decimal("0.001")
        rounds_r = every_paired[name]
        floor = [
            str(Decimal(repr(rounds_r[end])).quantize(Decimal("0.001"), ROUND_FLOOR))
            for end in ("median", "low", "high")
        ]
        assert (median, low, high) == (floor[0], f"[{floor[1]},", f"{floor[2]}]")
