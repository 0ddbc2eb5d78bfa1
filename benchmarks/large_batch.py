"""Large batches that train well: recipes at batch 4000 and 16000 against batch 500.

The setting: configs/fmnist.yaml's net at width 1/8, no augmentation,
10 epochs for every row, Adam at 3e-3 on a cosine with one epoch of warm-up,
micro-batches of at most 500 (micro_batch_size: 500, one micro-batch computed
at a time: the same memory in every row). 5000 training examples are held
out as a validation split: the best recipe of each batch size is the one with
the best validation accuracy, and only then is its test accuracy compared with
the reference's (choices are never made on the test split).

Rows, each a fresh `accum-train run` (its own thread pools and allocator):
  reference   batch 500, the setting above
  (a)         batch B at the reference's rate
  (b)         the linear rule (rate x B/500) with 1 and with 3 epochs of
              warm-up, and the square-root rule (rate x sqrt(B/500))
  (c)         LAMB tuned over five rates: 1e-3, the reference's 3e-3, the
              square-root rule's, the linear rule's and twice that
  (d)         LARS (momentum 0.9, trust coefficient 0.001) at 0.5, 2, 8, 16, 32
  (e)         batch 500 growing to 4000 (500, 1000, 2000, 4000 from epochs 1,
              5, 7, 9, or later: 1, 6, 8, 10) at the reference's peak rate held
              constant after the warm-up, against the reference's cosine decay
              (Smith et al. 2018)
  (f)         batch 4000 given the reference's number of updates (8x the
              epochs), at the best 10-epoch recipe of (a)-(b)
  (g)         batch_schedule's rule: the batch grown at each epoch's end to
              the gradient noise scale the run measures (McCandlish et al.
              2018), from 500 in micro-batches of 250: constant rate, the sqrt
              rule, or the reference's cosine over its 990 updates after warm-up
Every row at batch B sets model.bn_momentum to 0.9^(B/500): BatchNorm's moving
statistics move once per update, and this keeps their history as many examples
long as the reference's (at 0.9, batch 16000's 40 updates left them holding
their initial values, and evaluation was at chance).

Columns: validation and test accuracy, updates, wall time, TF allocator peak.

    python benchmarks/large_batch.py --output docs/large-batch.json   # the README's table (one run)
    python benchmarks/large_batch.py --epochs 2 --rows reference,4000-a  # a quick look
    python benchmarks/large_batch.py --combine first.json second.json --output docs/large-batch.json
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = 60000 - 5000  # training examples after the validation split
RATE = 0.003
BN_MOMENTUM = 0.9  # the reference's (fmnist.yaml's default)

BASE = [
    "model.width=0.125",
    "data.augment.crop=0",
    "data.validation=5000",
    "micro_batch_size=500",
    "subdivisions=null",
    "parallel_micro_steps=1",
    "log_every=1000",
]


def warmup(batch: int, epochs: int = 1) -> int:
    return epochs * math.ceil(TRAIN / batch)


def rows(epochs: int) -> list[tuple[str, str, list[str]]]:
    """(name, recipe, --set overrides) of every row."""
    out = [
        (
            "reference",
            "batch 500, Adam 3e-3, cosine",
            ["batch_size=500", f"optimizer.schedule.warmup_steps={warmup(500)}"],
        )
    ]
    for batch in (4000, 16000):
        up = warmup(batch)
        # BatchNorm's moving statistics move once per update: at batch B they keep as many examples'
        # worth of history as at batch 500 with momentum 0.9^(B/500). At 0.9 they still held 1.5% of
        # their initial variance (1.0, against batch variances near 1e-4) after batch 16000's 40
        # updates, and every evaluation was at chance (test accuracy 0.10 and 0.25, train loss 0.76).
        momentum = f"model.bn_momentum={BN_MOMENTUM ** (batch / 500):.4g}"
        common = [f"batch_size={batch}", f"optimizer.schedule.warmup_steps={up}", momentum]
        sqrt_rate = RATE * math.sqrt(batch / 500)
        linear_rate = RATE * batch / 500
        out += [
            (f"{batch}-a", "(a) the reference's rate", common),
            (
                f"{batch}-linear",
                "(b) linear rule, 1 epoch warm-up",
                common + ["optimizer.scale_learning_rate={rule: linear, base_batch_size: 500}"],
            ),
            (
                f"{batch}-linear-3",
                "(b) linear rule, 3 epochs warm-up",
                [f"batch_size={batch}", f"optimizer.schedule.warmup_steps={warmup(batch, 3)}", momentum]
                + ["optimizer.scale_learning_rate={rule: linear, base_batch_size: 500}"],
            ),
            (
                f"{batch}-sqrt",
                "(b) sqrt rule, 1 epoch warm-up",
                common + ["optimizer.scale_learning_rate={rule: sqrt, base_batch_size: 500}"],
            ),
            (
                f"{batch}-lamb-0.001",
                "(c) LAMB at 1e-3",
                common + ["optimizer.name=lamb", "optimizer.learning_rate=0.001"],
            ),
            (
                f"{batch}-lamb-0.003",
                "(c) LAMB at the reference's rate",
                common + ["optimizer.name=lamb", f"optimizer.learning_rate={RATE}"],
            ),
            (
                f"{batch}-lamb-sqrt",
                "(c) LAMB at the sqrt rule's rate",
                common + ["optimizer.name=lamb", f"optimizer.learning_rate={sqrt_rate:.6g}"],
            ),
            (
                f"{batch}-lamb-linear",
                "(c) LAMB at the linear rule's rate",
                common + ["optimizer.name=lamb", f"optimizer.learning_rate={linear_rate:.6g}"],
            ),
            (
                f"{batch}-lamb-2x-linear",
                "(c) LAMB at twice the linear rule's rate",
                common + ["optimizer.name=lamb", f"optimizer.learning_rate={2 * linear_rate:.6g}"],
            ),
            (f"{batch}-lars-0.5", "(d) LARS at 0.5", common + ["optimizer.name=lars", "optimizer.learning_rate=0.5"]),
            (f"{batch}-lars-2", "(d) LARS at 2", common + ["optimizer.name=lars", "optimizer.learning_rate=2"]),
            (f"{batch}-lars-8", "(d) LARS at 8", common + ["optimizer.name=lars", "optimizer.learning_rate=8"]),
            (f"{batch}-lars-16", "(d) LARS at 16", common + ["optimizer.name=lars", "optimizer.learning_rate=16"]),
            (f"{batch}-lars-32", "(d) LARS at 32", common + ["optimizer.name=lars", "optimizer.learning_rate=32"]),
        ]
    # (f) batch 4000 given the reference's number of updates (8x its epochs), at the best 10-epoch recipe
    # of the first table (the linear rule, 3 epochs of warm-up)
    long_epochs = epochs * 8
    out.append(
        (
            "4000-long",
            f"(f) batch 4000 for {long_epochs} epochs (the reference's updates), linear rule, 3 epochs warm-up",
            [
                "batch_size=4000",
                f"optimizer.schedule.warmup_steps={warmup(4000, 3)}",
                f"model.bn_momentum={BN_MOMENTUM**8:.4g}",
                "optimizer.scale_learning_rate={rule: linear, base_batch_size: 500}",
                f"epochs={long_epochs}",
            ],
        )
    )
    # (e): the batch doubles where a step schedule would halve the rate; two timings of the doublings
    for name, fractions in (("growing", (0.4, 0.6, 0.8)), ("growing-late", (0.5, 0.7, 0.9))):
        # 10 epochs: 1, 5, 7, 9 and 1, 6, 8, 10; fewer (a quick look): as many doublings as fit
        starts = sorted({1} | {min(epochs, max(2, round(epochs * f) + 1)) for f in fractions})
        phases = list(zip(starts, (500, 1000, 2000, 4000)))
        schedule = ", ".join(f"{{epoch: {e}, batch_size: {b}}}" for e, b in phases)
        out.append(
            (
                name,
                f"(e) batch {' -> '.join(str(b) for _, b in phases)} from epochs {', '.join(map(str, starts))}, "
                "constant rate",
                [
                    f"batch_schedule=[{schedule}]",
                    "optimizer.schedule.name=constant",
                    f"optimizer.schedule.warmup_steps={warmup(500)}",
                ],
            )
        )
    # (g) the batch grown to the gradient noise scale measured as it trains (batch_schedule's rule):
    # from 500 at each epoch's end, in micro-batches of 250 (two per batch of 500: the estimate needs two or
    # more), up to 16000; the reference's peak rate held after its warm-up, as (e), or scaled by the sqrt rule
    rule = "batch_schedule={rule: noise_scale, max_batch_size: 16000}"
    decay = epochs * math.ceil(TRAIN / 500) - warmup(500)  # the reference's cosine, which the rule cannot size
    grown = ["batch_size=500", "micro_batch_size=250", rule, "optimizer.schedule.name=constant"]
    grown.append(f"optimizer.schedule.warmup_steps={warmup(500)}")
    out += [
        ("noise-scale", "(g) batch grown to the measured noise scale, constant rate", grown),
        (
            "noise-scale-sqrt",
            "(g) batch grown to the measured noise scale, sqrt rule",
            grown + ["optimizer.scale_learning_rate={rule: sqrt, base_batch_size: 500}"],
        ),
        (
            "noise-scale-cosine",
            "(g) batch grown to the measured noise scale, the reference's cosine (counted in updates)",
            grown[:3] + [f"optimizer.schedule.warmup_steps={warmup(500)}", f"optimizer.schedule.decay_steps={decay}"],
        ),
    ]
    return out


def run_row(overrides: list[str], epochs: int, folder: Path) -> dict:
    command = [sys.executable, "-m", "accum_train.cli.main", "run", str(ROOT / "configs" / "fmnist.yaml")]
    for item in [*BASE, f"epochs={epochs}", *overrides]:
        command += ["--set", item]
    command += ["--output-dir", str(folder), "--quiet"]
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"status": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1] if done.stderr else ''}"}
    summary = json.loads((folder / "summary.json").read_text())
    return {
        "status": "ok",
        "validation_accuracy": summary["validation_accuracy"],
        "test_accuracy": summary["test_accuracy"],
        "updates": summary["steps"],
        "wall_time_s": summary["wall_time_s"],
        "process_wall_s": time.time() - started,
        "peak_memory_bytes": summary["peak_memory_bytes"],
        "subdivisions_at_end": summary["subdivisions"],
        "noise_scale_at_end": summary.get("noise_scale"),
        "batch_schedule": summary.get("batch_schedule"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rows", default=None, help="comma-separated row names (default: all)")
    parser.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--combine",
        type=Path,
        nargs="+",
        default=None,
        help="instead of running: one report of the rows of earlier runs (their JSON reports, or the row lines "
        "they printed), the first run of each row kept",
    )
    options = parser.parse_args(argv)
    if options.combine:
        return combine(options.combine, options.epochs, options.output)
    chosen = rows(options.epochs)
    if options.rows:
        wanted = options.rows.split(",")
        chosen = [row for row in chosen if row[0] in wanted]
    results = []
    with tempfile.TemporaryDirectory(prefix="large-batch-") as scratch:
        for name, recipe, overrides in chosen:
            result = {
                "row": name,
                "recipe": recipe,
                "overrides": overrides,
                **run_row(overrides, options.epochs, Path(scratch) / name),
            }
            results.append(result)
            print(json.dumps(result), flush=True)
    report = {"epochs": options.epochs, "base": BASE, "rows": results, "best": best_by_validation(results)}
    print(table(report))
    if options.output:
        options.output.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def combine(paths: list[Path], epochs: int, output: Path | None) -> int:
    rows, seen = [], set()
    for path in paths:
        text = path.read_text()
        try:
            found = json.loads(text)["rows"]
        except (json.JSONDecodeError, KeyError):
            found = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        for row in found:
            if row["row"] not in seen:
                seen.add(row["row"])
                rows.append(row)
    report = {
        "epochs": epochs,
        "base": BASE,
        "rows": rows,
        "best": best_by_validation(rows),
        "from": [str(p) for p in paths],
    }
    print(table(report))
    print(json.dumps(report["best"], indent=2))
    if output:
        output.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def best_by_validation(results: list[dict]) -> dict:
    """Per batch size, the row with the best validation accuracy, and its test accuracy's gap to the reference."""
    reference = next((r for r in results if r["row"] == "reference" and r["status"] == "ok"), None)
    best = {}
    for batch in ("4000", "16000"):
        candidates = [
            r
            for r in results
            if r["row"].startswith(batch + "-") and not r["row"].endswith("-long") and r["status"] == "ok"
        ]
        if not candidates:
            continue
        top = max(candidates, key=lambda r: r["validation_accuracy"])
        best[batch] = {
            "row": top["row"],
            "test_accuracy": top["test_accuracy"],
            "gap_to_reference": None if reference is None else reference["test_accuracy"] - top["test_accuracy"],
        }
    for group in ("growing", "noise-scale"):
        grown = [r for r in results if r["row"].startswith(group) and r["status"] == "ok"]
        top = max(grown, key=lambda r: r["validation_accuracy"]) if grown else None
        if top and reference:
            best[group] = {
                "row": top["row"],
                "test_accuracy": top["test_accuracy"],
                "gap_to_reference": reference["test_accuracy"] - top["test_accuracy"],
                "updates": top["updates"],
                "reference_updates": reference["updates"],
            }
    return best


def table(report: dict) -> str:
    """The rows as Markdown: one table per machine and commit they were measured on (each row's ``measured``),
    named once above it."""
    groups: dict = {}
    for r in report["rows"]:
        groups.setdefault(r.get("measured", "this run"), []).append(r)
    out = []
    for measured, rows in groups.items():
        lines = [
            f"Measured on {measured}:",
            "",
            "| row | recipe | validation accuracy | test accuracy | updates | wall time | TF allocator peak |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            if r["status"] != "ok":
                lines.append(f"| {r['row']} | {r['recipe']} | {r['status']} | | | | |")
                continue
            lines.append(
                f"| {r['row']} | {r['recipe']} | {r['validation_accuracy']:.4f} | {r['test_accuracy']:.4f} | "
                f"{r['updates']} | {r['wall_time_s']:.0f} s | {r['peak_memory_bytes'] / 2**20:.0f} MiB |"
            )
        out.append("\n".join(lines))
    return "\n\n".join(out)


# The targets set for the tuned rows: (what, the rows that compete, chosen on validation, the most test accuracy
# it may be short of the reference, the most updates as a share of the reference's)
TARGETS = [
    ("LAMB or LARS at batch 4000, 10 epochs", ("4000-lamb", "4000-lars"), 0.015, None),
    ("the noise-scale rule, from batch 500", ("noise-scale",), 0.003, 0.5),
]


def targets(report: dict) -> str:
    """The targets table: per target the row chosen on validation, its test accuracy against the reference's."""
    rows = [r for r in report["rows"] if r["status"] == "ok"]
    reference = next(r for r in rows if r["row"] == "reference")
    lines = [
        f"| target | chosen on validation | test accuracy | short of the reference ({reference['test_accuracy']:.4f}) "
        f"| updates (reference {reference['updates']}) | target | met |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for what, prefixes, short, share in TARGETS:
        candidates = [r for r in rows if r["row"].startswith(prefixes)]
        if not candidates:
            continue
        top = max(candidates, key=lambda r: r["validation_accuracy"])
        gap = reference["test_accuracy"] - top["test_accuracy"]
        goal = f"within {short}" + (f", at most {share:.0%} of the updates" if share else "")
        met = gap <= short and (share is None or top["updates"] <= share * reference["updates"])
        lines.append(
            f"| {what} | {top['row']} | {top['test_accuracy']:.4f} | {gap:.4f} | {top['updates']} | {goal} | "
            f"{'yes' if met else 'no'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
