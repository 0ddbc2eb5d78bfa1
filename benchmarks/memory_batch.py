"""Memory against batch size at a fixed micro-batch: does it follow the micro-batch?

The setting: configs/fmnist.yaml's net at width 1/8, no augmentation,
micro-batches of at most 500 computed one at a time (micro_batch_size: 500,
parallel_micro_steps: 1), one epoch of the 60000 training examples at each
batch size. Each row is a fresh `accum-train run` (its own allocator), and
the figure is its summary's TensorFlow allocator peak (over the whole run:
the model, the optimizer state, the gradient cache, the micro-batches in
flight, one micro-step's activations, and the evaluation's batches) and the
process's peak RSS, which also counts the data set, stored once as uint8 in
host memory outside the allocator.

    python benchmarks/memory_batch.py --output docs/memory-batch.json
    python benchmarks/memory_batch.py --batches 500,60000   # a quick look
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from decimal import ROUND_CEILING, Decimal
from pathlib import Path

import provenance  # benchmarks/ is on sys.path: this script runs from there
from tables import caption

ROOT = Path(__file__).resolve().parents[1]

SETTING = [
    "model.width=0.125",
    "data.augment.crop=0",
    "micro_batch_size=500",
    "subdivisions=null",
    "parallel_micro_steps=1",
    "epochs=1",
    "log_every=1000",
]


def measure(batch: int, scratch: Path) -> dict:
    """One fresh run at ``batch``: its summary's figures."""
    out = scratch / f"batch-{batch}"
    command = [str(Path(sys.executable).parent / "accum-train"), "run", str(ROOT / "configs" / "fmnist.yaml")]
    for setting in [*SETTING, f"batch_size={batch}", "optimizer.schedule.warmup_steps=0"]:
        command += ["--set", setting]
    subprocess.run([*command, "--output-dir", str(out), "--quiet"], check=True, cwd=ROOT)
    summary = json.loads((out / "summary.json").read_text())
    return {
        "batch_size": batch,
        "subdivisions": summary["subdivisions"],
        "updates": summary["steps"],
        "peak_memory_bytes": summary["peak_memory_bytes"],
        "peak_rss_bytes": summary["peak_rss_bytes"],
        "wall_time_s": summary["wall_time_s"],
        "test_accuracy": summary.get("test_accuracy"),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="500,4000,16000,60000", help="batch sizes, comma-separated")
    parser.add_argument("--output", type=Path, help="write the rows here as JSON")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for batch in (int(b) for b in args.batches.split(",")):
            rows.append(measure(batch, Path(scratch)))
            print(json.dumps(rows[-1]), flush=True)
    first = rows[0]["peak_memory_bytes"]
    print(f"\n| batch | k | updates | TF allocator peak | over batch {rows[0]['batch_size']} | peak RSS |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        peak = row["peak_memory_bytes"]
        print(
            f"| {row['batch_size']} | {row['subdivisions']} | {row['updates']} | {peak / 2**20:.0f} MiB | "
            f"{peak / first:.2f}x | {row['peak_rss_bytes'] / 2**20:.0f} MiB |"
        )
    if args.output:
        result = {"setting": SETTING, "commit": provenance.commit(), "machine": provenance.machine(), "rows": rows}
        args.output.write_text(json.dumps(result, indent=2) + "\n")


def table(report: dict) -> str:
    """The JSON of --output as docs/memory.md's table, its caption naming the machine and commit.

    "over batch B" is rounded up, to 3 decimals: a peak that grew with the batch never reads as flat."""
    rows = report["rows"]
    first = rows[0]
    batches = ",".join(str(row["batch_size"]) for row in rows)
    machine = report.get("machine")  # recorded since benchmarks/provenance.py
    where = f"{machine['cpus']} CPUs ({machine['cpu']})" if machine else "a machine the JSON does not record"
    lines = [
        caption(
            where,
            report.get("commit"),
            f"python benchmarks/memory_batch.py --batches {batches} --output docs/memory-batch.json",
        ),
        "",
        f"| batch | k | updates | allocator peak | over batch {first['batch_size']} | peak RSS |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        over = Decimal(row["peak_memory_bytes"]) / Decimal(first["peak_memory_bytes"])
        lines.append(
            f"| {row['batch_size']} | {row['subdivisions']} | {row['updates']} | "
            f"{row['peak_memory_bytes'] / 2**20:.0f} MiB | {over.quantize(Decimal('0.001'), ROUND_CEILING)}x | "
            f"{row['peak_rss_bytes'] / 2**20:.0f} MiB |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
