"""benchmarks/peers_causal_lm.py end to end at a tiny setting (a GPT-2 causal LM built offline): the JSON it writes,
medians and ratios that are what the rounds give (never displayed in accum-train's favour), the number of updates
each optimizer made, the allocator peaks, the distance from whole-batch training (accum-train's none, Keras'
accumulation's clear under the mean over valid tokens), and the results page's tables made from the JSON."""

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
tables = load_file(Path(__file__).resolve().parent.parent / "benchmarks" / "tables.py", "paired_tables")

UNTRIMMED = ["(a) accum-train", "(a') accum-train, XLA"]
TRIMMED = ["(c) accum-train, trim_padding", "(c') accum-train, trim_padding, XLA"]
KERAS = ["(b') keras GA, fit, spe=k", "(b'') keras GA, fit, spe=k, XLA"]
METHODS = UNTRIMMED + TRIMMED + KERAS
WHOLE = "(e) keras plain, whole batch"


@pytest.mark.slow  # six timing processes, three memory ones and one for the distance, each starting TensorFlow
def test_peers_causal_lm_json_ratios_updates_peaks_and_distance(tmp_path, repo_root):
    out = tmp_path / "peers-causal-lm.json"
    rounds, updates, k = 2, 1, 2
    tiny = ["--V", "50", "--L", "1", "--heads", "2", "--D", "8", "--T", "16", "--k", str(k), "--micro", "4"]
    argv = [*tiny, "--rounds", str(rounds), "--updates", str(updates), "--output", str(out)]
    script = repo_root / "benchmarks" / "peers_causal_lm.py"
    result = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    keys = {"args", "model", "environment", "data", "distance_data", "time", "best", "ratios", "paired_ratios"}
    assert set(data) == keys | {"peaks", "peak_ratios", "targets", "met", "met_rule", "distance"}
    assert data["args"]["arrange"] == "uneven"
    assert data["environment"]["thread_pools"].startswith("TensorFlow's default thread pools for every method")
    assert data["environment"]["keras_hub"]
    assert data["model"]["parameters"] > 0
    lengths = data["data"]
    assert lengths["sequences"] == updates * k * 4
    assert 4 <= lengths["median"] <= lengths["mean"] <= 16 and 0 <= lengths["at_cap"] <= 1

    times = data["time"]
    assert list(times) == METHODS
    for r in times.values():
        assert len(r["rounds_cpu_s_per_example"]) == len(r["rounds_wall_s_per_example"]) == rounds
        assert r["cpu_s_per_example"] == statistics.median(r["rounds_cpu_s_per_example"])
        assert r["wall_s_per_example"] == statistics.median(r["rounds_wall_s_per_example"])
        assert r["examples_per_cpu_s"] == pytest.approx(1 / r["cpu_s_per_example"])
        assert r["examples_per_wall_s"] == pytest.approx(1 / r["wall_s_per_example"])
        # one training call per round over every update of the round, plus the warm-up round's; Keras'
        # optimizer.iterations counts updates (its micro-steps // k) under gradient_accumulation_steps
        assert r["micro_batches_per_round"] == updates * k
        assert r["optimizer_updates"] == (rounds + 1) * updates
        assert r["threads"] == {"intra": 0, "inter": 0}  # TensorFlow's defaults, for every method
    assert data["environment"]["jit_compile"] == dict(zip(METHODS, [False, True, False, True, False, True]))

    # each side's best, by CPU and by wall time separately
    best = {
        side: {m: min(methods, key=lambda name: times[name][f"{m}_s_per_example"]) for m in ("cpu", "wall")}
        for side, methods in (("trimmed", TRIMMED), ("untrimmed", UNTRIMMED), ("keras", KERAS))
    }
    assert data["best"] == best
    ratios = data["ratios"]
    assert set(ratios) | set(data["peak_ratios"]) == set(data["targets"]) == set(data["met"])
    for words, side in (("with", "trimmed"), ("without", "untrimmed")):
        for m, unit in (("cpu", "CPU"), ("wall", "wall")):
            ours, keras = times[best[side][m]], times[best["keras"][m]]
            key = f"{words} trim_padding, examples per {unit}-second"
            assert ratios[key] == pytest.approx(keras[f"{m}_s_per_example"] / ours[f"{m}_s_per_example"])
            # the same two methods round by round: round r of Keras' time over round r of ours
            per_round = [
                k_r / o_r for o_r, k_r in zip(ours[f"rounds_{m}_s_per_example"], keras[f"rounds_{m}_s_per_example"])
            ]
            assert data["paired_ratios"][key] == {**paired.median_interval(per_round), "per_round": per_round}
            # the verdict is the paired rounds': the median, or for parity (1.0) an interval that holds 1
            target = data["targets"][key]["target"]
            assert data["met"][key] == paired.reaches(target, data["paired_ratios"][key])
    for key, value in data["peak_ratios"].items():  # one measurement each: met by its value
        assert data["met"][key] == (value <= float(data["targets"][key]["target"].split()[1]))
    # "  KEY   SHOWN  MEDIAN [LOW, HIGH]  FULL  target >= 1.5: met"
    line = re.compile(r"  (\S.*?) +(\d+\.\d{3})  (.*?) +(\S+)  target (.*): (met|NOT met)$")
    printed = {found[1]: found.groups()[1:] for found in map(line.match, result.stdout.splitlines()) if found}
    assert set(printed) == set(data["targets"])
    for key, value in {**ratios, **data["peak_ratios"]}.items():
        shown, rounds_text, full, target, said = printed[key]
        assert float(full) == value and target == data["targets"][key]["target"]
        assert said == ("met" if data["met"][key] else "NOT met")
        # 3 decimals, rounded against accum-train (down where higher is better for it): never in its favour
        higher = data["targets"][key]["higher_is_better"]
        assert (Decimal(shown) <= Decimal(repr(value))) is higher or Decimal(shown) == Decimal(repr(value))
        if key in ratios:
            rounds_r = data["paired_ratios"][key]
            expected = [tables.against(rounds_r[end], True) for end in ("median", "low", "high")]
            assert rounds_text == "{} [{}, {}]".format(*expected)
        else:
            assert rounds_text == "- (one measurement)"

    peaks = data["peaks"]
    assert list(peaks) == ["(a) accum-train", "(c) accum-train, trim_padding", WHOLE]
    for name, r in peaks.items():
        assert r["peak_memory_bytes"] >= r["in_use_before_bytes"] > 0  # the BFC allocator kept its statistics
        assert r["batch_size"] == k * 4 and r["subdivisions"] == (1 if name == WHOLE else k)
    for name in ("(a)", "(c)"):
        full_name = next(n for n in peaks if n.startswith(name))
        measured = peaks[full_name]["peak_memory_bytes"] / peaks[WHOLE]["peak_memory_bytes"]
        assert data["peak_ratios"][f"{name}/(e) TF allocator peak"] == pytest.approx(measured)

    distance = data["distance"]
    assert distance["moved"] > 0
    tokens = distance["tokens_per_micro_batch"]
    assert tokens == sorted(tokens, reverse=True) and tokens[0] > tokens[-1]  # uneven: longest first
    for name in ("accum-train", "accum-train, trim_padding", "keras GA"):
        assert distance[name]["relative"] == pytest.approx(distance[name]["max_abs"] / distance["moved"])
    # the whole-batch update, to float32 rounding; Keras' mean of the micro-batch means is another update
    assert distance["accum-train"]["relative"] < 1e-5
    assert distance["accum-train, trim_padding"]["relative"] < 1e-5
    assert distance["keras GA"]["relative"] > 1e-2
    assert distance["keras GA"]["max_abs"] > 100 * distance["accum-train"]["max_abs"]

    # the results page's tables, from the JSON alone
    page = subprocess.run([sys.executable, str(script), "--markdown", str(out)], capture_output=True, text=True)
    assert page.returncode == 0, page.stderr[-3000:]
    assert page.stdout.startswith("Measured on ")
    for name in METHODS:
        assert f"| {name} |" in page.stdout
    for key in data["targets"]:
        assert f"| {key}" in page.stdout
    for key, rounds_r in data["paired_ratios"].items():  # the verdict with the interval it came from
        said = "met" if data["met"][key] else "NOT met"
        assert f"(paired rounds {tables.interval(rounds_r, True)}: {said}) |" in page.stdout
