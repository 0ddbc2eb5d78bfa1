"""Subdivided against one pass: what k=8 costs in time and memory beside k=1, with two micro-steps in flight
(``parallel_micro_steps: auto`` on a CPU) and with one at a time; with ``--precision``, in each precision.

The setting: the seed convnet at width 1/8, batch 256, k=8 (micro-batches of 32) against k=1, on 4096
training examples. Each variant is ``accum-train bench`` over alternating rounds of timed updates, every
measurement in a fresh process; the ratios are taken within each round, and the medians shown with their
[min-max] over the rounds.

    python benchmarks/subdivided.py --output docs/subdivided.json
    python benchmarks/subdivided.py --precision float32,mixed_bfloat16 --output docs/subdivided-precision.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import provenance  # benchmarks/ is on sys.path: this script runs from there
from tables import against, caption

SETTING = ["model.width=0.125", "batch_size=256", "data.train_limit=4096"]
VARIANTS = {"auto": "parallel_micro_steps=auto", "one at a time": "parallel_micro_steps=1"}
MIB = 2**20


def bench(parallel: str, rounds: int, steps: int, scratch: Path, precision: str | None = None) -> dict:
    out = scratch / parallel.split("=")[1]
    sets = [part for value in [*SETTING, parallel] for part in ("--set", value)]
    command = [str(Path(sys.executable).parent / "accum-train"), "bench", "configs/fmnist.yaml"]
    command += ["--subdivisions", "1,8", "--rounds", str(rounds), "--steps", str(steps), *sets]
    command += ["--precision", precision] if precision else []
    subprocess.run([*command, "--output-dir", str(out)], check=True, cwd=provenance.ROOT)
    return json.loads((out / "bench.json").read_text())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--precision", default=None, help="instead: these precisions (comma-separated) at the default micro-steps"
    )
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        if args.precision:
            variants = {"precision": bench(VARIANTS["auto"], args.rounds, args.steps, Path(scratch), args.precision)}
        else:
            variants = {name: bench(key, args.rounds, args.steps, Path(scratch)) for name, key in VARIANTS.items()}
    report = {
        "machine": {**provenance.machine(), "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "setting": SETTING,
        "rounds": args.rounds,
        "steps": args.steps,
        "precision": args.precision,
        "variants": variants,
    }
    print(table(report))
    if args.output:
        args.output.write_text(json.dumps(report, indent=2) + "\n")


def _up(value: float) -> str:
    return against(value, False, "0.01")  # a cost rounded up: k=8's price never reads smaller than measured


def _spread(ratio: dict) -> str:
    return f"{_up(ratio['median'])}x [{_up(ratio['min'])}-{_up(ratio['max'])}]"


def _caption(report: dict, output: str) -> str:
    machine = report["machine"]
    precision = f" --precision {report['precision']}" if report.get("precision") else ""
    load = machine["load_average_before"][0]
    where = f"{machine['cpus']} CPUs ({machine['cpu']}), load average {load:.1f} before the run"
    command = f"python benchmarks/subdivided.py --rounds {report['rounds']} --steps {report['steps']}{precision}"
    return caption(where, machine["commit"], f"{command} --output {output}")


def table(report: dict) -> str:
    """The JSON of --output as docs/performance.md's table, its caption naming the machine and commit."""
    if report.get("precision"):
        return precision_table(report)
    lines = [
        _caption(report, "docs/subdivided.json"),
        "",
        "| k=8 over k=1 | wall time | CPU time per example | TF allocator peak |",
        "|---|---:|---:|---:|",
    ]
    for name, result in report["variants"].items():
        one, eight = result["rows"][0], result["rows"][1]
        peaks = f"({eight['peak_memory_bytes'] / MIB:.0f} vs {one['peak_memory_bytes'] / MIB:.0f} MiB)"
        lines.append(
            f"| `parallel_micro_steps: {'1' if name == 'one at a time' else 'auto'}` | "
            f"{_spread(eight['time_ratio'])} | {_spread(eight['cpu_ratio'])} | "
            f"{_up(eight['memory_ratio'])}x {peaks} |"
        )
    return "\n".join(lines)


def precision_table(report: dict) -> str:
    """The --precision JSON as docs/mixed-precision.md's table: every row against float32 at k=1."""
    rows = report["variants"]["precision"]["rows"]
    lines = [
        _caption(report, "docs/subdivided-precision.json"),
        "",
        "| precision | k | CPU ms/example | time x | CPU x | TF peak | memory x |",
        "|---|---:|---:|---|---|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['precision']} | {row['subdivisions']} | {1000 * row['cpu_s_per_example']:.3f} | "
            f"{_spread(row['time_ratio'])} | {_spread(row['cpu_ratio'])} | {row['peak_memory_bytes'] / MIB:.0f} MiB | "
            f"{_up(row['memory_ratio'])}x |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
