"""Time and memory of one update against the number of subdivisions (and the precision).

``bench`` runs ``measure`` once per variant (a precision and a k) and round,
each in a fresh process (so each peak memory is its own), and writes
bench.json and bench.png. ``measure`` warms up (tracing), then times N
updates of the configured batch as a run makes them (each pulling its
micro-batches from the run's feed), waiting for each to finish; the
TensorFlow allocator peak is read over the timed updates only.

On a shared machine the load drifts between one process and the next, so a
ratio of two variants measured one after the other is noise. With
``rounds`` > 1 the variants alternate round by round, and each ratio to the
first variant is taken within a round, then reported as the median over the
rounds with its spread (min, max).

Run as a module, it is the worker: ``python -m accum_train.bench CONFIG K STEPS``
prints one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .backends import active, tensorflow_only
from .config import Config, load_config
from .errors import WorkerFailed
from .files import atomic_write
from .processes import run_child
from .progress import Progress
from .trainer.store.rundir import check_output_dir, pyplot, save_figure, write_result


def measure(cfg: Config, data, steps: int, warmup: int = 2) -> dict:
    from .from_config.build import build_run
    from .trainer.memory import peak_rss_bytes

    # The updates a run makes, pulled from its feed as training pulls them: the peak holds what a run holds (the
    # training set, stored, in host memory; the micro-batches in flight; the update's activations and cache).
    run = build_run(cfg, data)
    backend = active()
    reader = run.reader()

    def update(i):
        return float(reader.update(i % run.total_steps)["loss"])  # waits for the update

    for i in range(warmup):
        update(i)
    backend.reset_allocator_peak()
    wall, cpu_start = [], time.process_time()
    for i in range(warmup, warmup + steps):
        start = time.perf_counter()
        update(i)
        wall.append(time.perf_counter() - start)
    cpu = time.process_time() - cpu_start
    median = statistics.median(wall)
    return {
        "subdivisions": cfg.subdivisions_for(cfg.batch_size),
        "micro_batch_size": cfg.largest_micro_batch,
        "batch_size": cfg.batch_size,
        "steps": steps,
        "median_s_per_update": median,
        "examples_per_s": cfg.batch_size / median,
        "cpu_s_per_example": cpu / (steps * cfg.batch_size),
        "peak_memory_bytes": backend.allocator_peak_bytes(),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def bench(
    cfg: Config,
    subdivisions: Sequence[int],
    steps: int,
    out_dir: Path,
    progress: Progress | None = None,
    precisions: Sequence[str] = (),
    rounds: int = 1,
) -> dict:
    """Measure each variant in a fresh process per round; write out_dir/{bench.json, bench.png}.

    The output directory and the data are checked here, once, before any worker starts."""
    from .from_config.build import load_data

    tensorflow_only("accum-train bench")
    progress = progress or Progress()
    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    load_data(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    variants = [(p, k) for p in (precisions or [cfg.precision]) for k in subdivisions]
    samples = {v: [] for v in variants}
    for r in range(rounds):
        for precision, k in variants:
            row = _measure_in_child(
                dataclasses.replace(cfg, subdivisions=k, micro_batch_size=None, baseline=False, precision=precision),
                steps,
                out_dir,
            )
            samples[precision, k].append(row)
            progress.message(
                f"round {r + 1}/{rounds}, {precision}, subdivisions={k}: "
                f"{row['median_s_per_update']:.3f} s/update, {row['examples_per_s']:.0f} examples/s"
            )
    first = samples[variants[0]]
    rows = [_summarise(samples[v], first) for v in variants]
    result = {"config": cfg.to_dict(), "steps": steps, "rounds": rounds, "rows": rows}
    write_result(out_dir, "bench", result, plot)
    return result


def _measure_in_child(cfg: Config, steps: int, out_dir: Path) -> dict:
    config_path = out_dir / f"config-k{cfg.subdivisions}.yaml"
    atomic_write(config_path, cfg.to_yaml().encode())
    child = run_child([sys.executable, "-m", "accum_train.bench", str(config_path), str(cfg.subdivisions), str(steps)])
    config_path.unlink()
    if child.code != 0:
        raise WorkerFailed(
            f"bench worker for subdivisions={cfg.subdivisions} ({cfg.precision}) failed with "
            f"exit code {child.code}: {child.error}"
        )
    row = json.loads(child.stdout.strip().splitlines()[-1])
    row["precision"] = cfg.precision
    return row


def _spread(values) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _summarise(rounds: list, first: list) -> dict:
    """One variant over its rounds: medians, and each ratio to the first variant taken within a round."""
    row = dict(rounds[0])
    row["median_s_per_update"] = statistics.median(r["median_s_per_update"] for r in rounds)
    row["examples_per_s"] = row["batch_size"] / row["median_s_per_update"]
    row["cpu_s_per_example"] = statistics.median(r["cpu_s_per_example"] for r in rounds)
    for key in ("peak_memory_bytes", "peak_rss_bytes"):
        values = [r[key] for r in rounds if r[key] is not None]
        row[key] = max(values) if values else None
    row["rounds_s_per_update"] = [r["median_s_per_update"] for r in rounds]
    row["rounds_cpu_s_per_example"] = [r["cpu_s_per_example"] for r in rounds]
    row["time_ratio"] = _spread([r["median_s_per_update"] / f["median_s_per_update"] for r, f in zip(rounds, first)])
    row["cpu_ratio"] = _spread([r["cpu_s_per_example"] / f["cpu_s_per_example"] for r, f in zip(rounds, first)])
    row["memory_ratio"] = (
        row["peak_memory_bytes"] / max(r["peak_memory_bytes"] for r in first)
        if row["peak_memory_bytes"] and first[0]["peak_memory_bytes"]
        else None
    )
    return row


def plot(result: dict, path: Path) -> None:
    plt = pyplot()

    rows = result["rows"]
    labels = [
        f"{r['subdivisions']}"
        if len({x["precision"] for x in rows}) == 1
        else f"{r['subdivisions']}\n{r['precision'].replace('mixed_', '')}"
        for r in rows
    ]
    ks = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(ks, [r["median_s_per_update"] for r in rows], "o-", color="tab:blue", label="time per update")
    ax.set_xticks(ks, labels)
    ax.set_xlabel(f"subdivisions (batch {result['config']['batch_size']})")
    ax.set_ylabel("median seconds per update", color="tab:blue")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    mem = ax.twinx()
    allocator = [(r["peak_memory_bytes"] or 0) / 2**20 for r in rows]
    mem.plot(ks, allocator, "s--", color="tab:green", label="TensorFlow allocator peak")
    mem.plot(ks, [r["peak_rss_bytes"] / 2**20 for r in rows], "^:", color="tab:gray", label="process peak RSS")
    mem.set_ylabel("MiB")
    mem.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + mem.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper center")
    cfg = result["config"]
    ax.set_title(f"{cfg['model']['name']} x{cfg['model']['width']}: time and memory against subdivisions")
    fig.tight_layout()
    save_figure(fig, path)


def _worker(argv) -> None:
    config_path, k, steps = argv[0], int(argv[1]), int(argv[2])
    cfg = load_config(config_path, [f"subdivisions={k}"])
    from .from_config.build import configure, load_data

    # as a run would, before any op: importing keras_loss imports TensorLayer, whose import makes a Keras variable
    # and so starts the runtime, after which the pools stay TensorFlow's defaults
    threads = configure(cfg)
    print(json.dumps({**measure(cfg, load_data(cfg), steps), **threads}))


if __name__ == "__main__":
    _worker(sys.argv[1:])
