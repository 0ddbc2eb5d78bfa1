"""benchmarks/peers_masked.py end to end at a tiny setting: the JSON it writes, medians and ratios that are
what the rounds give (never displayed in accum-train's favour), the number of updates each optimizer made,
and the distance from whole-batch training: accum-train's none, Keras' accumulation's clear."""

import json
import re
import statistics
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from helpers import load_file

paired = load_file(Path(__file__).resolve().parent.parent / "benchmarks" / "paired.py", "paired")

UNTRIMMED = ["(a) accum-train", "(a') accum-train, XLA"]
OURS = [*UNTRIMMED, "(c) accum-train, trim_padding", "(c') accum-train, trim_padding, XLA"]
KERAS = ["(b) keras GA, fit", "(b') keras GA, fit, spe=k", "(b'') keras GA, fit, spe=k, XLA"]
BUCKETED = "(g) keras GA, bucketed by length, spe=k, XLA"
PLAIN = "(d) keras plain, micro-batch, spe=k, XLA"
METHODS = OURS + KERAS + [BUCKETED, PLAIN]


@pytest.mark.slow  # seven processes, each starting TensorFlow and tracing its training
def test_peers_masked_json_ratios_updates_and_distance(tmp_path, repo_root):
    out = tmp_path / "peers-masked.json"
    rounds, updates, k = 2, 1, 2
    tiny = ["--V", "50", "--T", "12", "--E", "8", "--H", "8", "--C", "4", "--k", str(k), "--micro", "4"]
    argv = [*tiny, "--rounds", str(rounds), "--updates", str(updates), "--output", str(out)]
    result = subprocess.run(
        [sys.executable, str(repo_root / "benchmarks" / "peers_masked.py"), *argv],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    keys = {"args", "model", "environment", "time", "ratios", "a_b_against", "a_b_ours", "distance"}
    paired_keys = {"paired_ratios", "paired_untrimmed", "paired_against_bucketed", "paired_against_plain_micro_batch"}
    assert set(data) == keys | {"against_plain_micro_batch", "untrimmed", "against_bucketed"} | paired_keys
    assert data["args"]["arrange"] == "uneven"
    assert data["environment"]["thread_pools"].startswith("TensorFlow's default thread pools for every method")

    times = data["time"]
    assert list(times) == METHODS
    for name, r in times.items():
        assert len(r["rounds_cpu_s_per_example"]) == len(r["rounds_wall_s_per_example"]) == rounds
        assert r["cpu_s_per_example"] == statistics.median(r["rounds_cpu_s_per_example"])
        assert r["wall_s_per_example"] == statistics.median(r["rounds_wall_s_per_example"])
        assert r["examples_per_cpu_s"] == pytest.approx(1 / r["cpu_s_per_example"])
        assert r["examples_per_wall_s"] == pytest.approx(1 / r["wall_s_per_example"])
        # one training call per round over every update of the round, plus the warm-up round's; Keras'
        # optimizer.iterations counts updates (its micro-steps // k) under gradient_accumulation_steps; (d) steps
        # once per micro-batch
        if name == BUCKETED:  # buckets may end in short micro-batches: a few more micro-steps, k per update
            assert r["micro_batches_per_round"] >= updates * k
            assert r["optimizer_updates"] == (rounds + 1) * r["micro_batches_per_round"] // k
        else:
            assert r["micro_batches_per_round"] == updates * k
            assert r["optimizer_updates"] == (rounds + 1) * updates * (k if name == PLAIN else 1)
        assert r["threads"] == {"intra": 0, "inter": 0}  # TensorFlow's defaults, for every method

    # each side's best (ours with or without XLA, Keras' three), by CPU and by wall time separately
    best = {
        side: {m: min(methods, key=lambda name: times[name][f"{m}_s_per_example"]) for m in ("cpu", "wall")}
        for side, methods in (("ours", OURS), ("keras", KERAS), ("untrimmed", UNTRIMMED))
    }
    assert data["a_b_against"] == best["keras"] and data["a_b_ours"] == best["ours"]
    assert data["untrimmed"]["a_b_ours"] == best["untrimmed"]
    jit = [False, True, False, True, False, False, True, True, True]
    assert data["environment"]["jit_compile"] == dict(zip(METHODS, jit))
    ratios = data["ratios"]
    for m in ("cpu", "wall"):
        ours, keras = times[best["ours"][m]], times[best["keras"][m]]
        assert ratios[m] == pytest.approx(keras[f"{m}_s_per_example"] / ours[f"{m}_s_per_example"])
        untrimmed = times[best["untrimmed"][m]]
        assert data["untrimmed"]["ratios"][m] == pytest.approx(
            keras[f"{m}_s_per_example"] / untrimmed[f"{m}_s_per_example"]
        )
        bucketed = times[BUCKETED][f"{m}_s_per_example"]
        assert data["against_bucketed"][m] == pytest.approx(bucketed / ours[f"{m}_s_per_example"])
    # each side's best against no accumulation at all: Keras' plain step at the micro-batch, (d)
    for side in ("ours", "keras"):
        for m in ("cpu", "wall"):
            measured = times[PLAIN][f"{m}_s_per_example"] / times[best[side][m]][f"{m}_s_per_example"]
            assert data["against_plain_micro_batch"][side][m] == pytest.approx(measured)

    # the same ratios between the same methods, round by round: round r of one against round r of the other
    def per_round(ours, theirs, m):
        key = f"rounds_{m}_s_per_example"
        return [t / o for o, t in zip(times[ours][key], times[theirs][key])]

    for m in ("cpu", "wall"):
        for got, ours, theirs in (
            (data["paired_ratios"][m], best["ours"][m], best["keras"][m]),
            (data["paired_untrimmed"][m], best["untrimmed"][m], best["keras"][m]),
            (data["paired_against_bucketed"][m], best["ours"][m], BUCKETED),
            (data["paired_against_plain_micro_batch"]["ours"][m], best["ours"][m], PLAIN),
            (data["paired_against_plain_micro_batch"]["keras"][m], best["keras"][m], PLAIN),
        ):
            ratios_r = per_round(ours, theirs, m)
            assert got == {**paired.median_interval(ratios_r), "per_round": ratios_r}
            assert got["rounds"] == rounds
    # "  LABEL   SHOWN  MEDIAN [LOW, HIGH]  FULL"
    line = re.compile(r"  (a/b examples per \S+) +(\d+\.\d{3})  (\S+) \[(\S+), (\S+)\] +(\S+)$")
    printed = {found[1]: found.groups()[1:] for found in map(line.match, result.stdout.splitlines()) if found}
    for key, name in (("cpu", "a/b examples per CPU-second"), ("wall", "a/b examples per wall-second")):
        shown, median, low, high, full = printed[name]
        assert float(full) == ratios[key]
        # 3 decimals, rounded down (higher is better for accum-train): never above the measured ratio
        assert Decimal(shown) <= Decimal(repr(ratios[key])) < Decimal(shown) + Decimal("0.001")
        assert len(shown.split(".")[1]) == 3
        rounds_r = data["paired_ratios"][key]
        for text, value in ((median, rounds_r["median"]), (low, rounds_r["low"]), (high, rounds_r["high"])):
            assert Decimal(text) <= Decimal(repr(value)) < Decimal(text) + Decimal("0.001")

    distance = data["distance"]
    assert distance["moved"] > 0
    tokens = distance["tokens_per_micro_batch"]
    assert tokens == sorted(tokens, reverse=True) and tokens[0] > tokens[-1]  # uneven: longest first
    for name in ("accum-train", "accum-train, trim_padding", "keras GA"):
        assert distance[name]["relative"] == pytest.approx(distance[name]["max_abs"] / distance["moved"])
    assert distance["accum-train"]["max_abs"] < 1e-5  # the whole-batch update, to float32 rounding
    assert distance["accum-train, trim_padding"]["max_abs"] < 1e-5
    assert distance["keras GA"]["max_abs"] > 1e-4  # the mean of the micro-batch means: another update
