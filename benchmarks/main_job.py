"""The main job (`make main`: configs/fmnist.yaml), run and kept as JSON: its summary, and each epoch's test
accuracy, time and gradient noise scale, for the README's figure and the docs pages' tables.

    python benchmarks/main_job.py --output docs/main-job.json     # about half an hour on 2 cores
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

SUMMARY_KEYS = (
    "test_accuracy",
    "test_loss",
    "steps",
    "wall_time_s",
    "cpu_time_s",
    "peak_memory_bytes",
    "peak_rss_bytes",
    "subdivisions",
    "batch_size",
    "parallel_micro_steps",
)
EPOCH_KEYS = ("epoch", "test_accuracy", "noise_scale", "elapsed_s")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="for a quick look only")
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    machine = {**provenance.machine(), "load_average_before": os.getloadavg()}  # the code that runs, at its start
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch) / "main"
        command = [str(Path(sys.executable).parent / "accum-train"), "run", "configs/fmnist.yaml", "--quiet"]
        command += [part for value in args.overrides for part in ("--set", value)]
        subprocess.run([*command, "--output-dir", str(run_dir)], check=True, cwd=provenance.ROOT)
        summary = json.loads((run_dir / "summary.json").read_text())
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [{key: r.get(key) for key in EPOCH_KEYS} for r in records if "elapsed_s" in r]
    report = {
        "machine": {**machine, "load_average_after": os.getloadavg()},
        "command": "accum-train run configs/fmnist.yaml" + "".join(f" --set {o}" for o in args.overrides),
        "summary": {key: summary.get(key) for key in SUMMARY_KEYS},
        "epochs": epochs,
    }
    print(json.dumps(report["summary"]))
    if args.output:
        args.output.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
