"""accum_train.fit on Keras' JAX backend beside Keras' own accumulation on JAX and one whole-batch pass (issue 76).

Two models, each built the same way from the same seed for every method, with the same data, batch (k x micro),
micro-batch and Adam learning rate:

- "seed": the README's Keras model (scripts/make_keras_model.py: conv, BatchNorm, conv, dense: the seed net's
  Keras twin; the seed net itself is a TensorLayer net, which only TensorFlow runs) on Fashion-MNIST-shaped
  images (synthetic uint8, scaled by 1/255, and 10 class labels), sparse cross-entropy on logits;
- "lm": peers_causal_lm.py's GPT-2 causal LM (KerasHub, offline) on its synthetic skewed-length sequences.

Methods, each in its own process under KERAS_BACKEND=jax (JAX_PLATFORMS=cpu, XLA's default threads):

  (a)  accum_train.fit(batch_size=k*micro, subdivisions=k, epochs=1, shuffle=False), one call per round
  (c)  lm only: (a) with trim_padding=True
  (b)  Keras on JAX: Adam(gradient_accumulation_steps=k), steps_per_execution=k (one jitted call per update),
       model.fit(batch_size=micro) over the same examples: Keras' best on JAX (it always compiles with XLA there)
  (e)  plain model.fit(batch_size=k*micro): one whole-batch pass per update, the floor

Time: each process warms up with one untimed round, then answers "go" with its CPU (time.process_time) and wall
(time.perf_counter) seconds of one call; --rounds interleaved rounds; medians per example, and each ratio taken
round by round (paired.py: median of the per-round ratios and its distribution-free 95% interval). A parity target
is met when the median reaches it or the interval contains 1. The optimizer's update count is checked every round.

Memory: XLA keeps no allocator statistics on a CPU (jax's memory_stats() is None there), so the peak is the
process's: after one untimed update, the kernel's resident high-water mark (VmHWM) is reset (writing 5 to
/proc/self/clear_refs), one more update runs, and its peak is VmHWM minus the resident size (VmRSS) just before it:
what the update's activations, gradients and buffers added at their highest, for (a), (c) and (e) of the lm.

    python benchmarks/peers_jax.py --updates 20 --output docs/peers-jax.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import paired
import peers_causal_lm as lm
import tables

A, C, B, E = "(a) accum_train.fit", "(c) accum_train.fit, trim_padding", "(b) keras accumulation", "(e) whole batch"
METHODS = {"seed": (A, B, E), "lm": (A, C, B, E)}
PEAKED = (A, C, E)
TARGETS = {  # (part, ours, theirs, measure): target
    ("seed", A, E, "cpu"): "<= 1.05",  # CPU per example against the whole-batch pass (a cost: lower is better)
    ("seed", A, B, "cpu"): ">= 1.0",
    ("seed", A, B, "wall"): ">= 1.0",
    ("lm", A, B, "cpu"): ">= 1.0",
    ("lm", A, B, "wall"): ">= 1.0",
    ("lm", C, B, "cpu"): ">= 1.5",
    ("lm", C, B, "wall"): ">= 1.5",
}
PEAK_TARGET = "<= 0.3"
MAKE_MODEL = Path(__file__).resolve().parent.parent / "scripts" / "make_keras_model.py"


def seed_data(n, seed):
    rng = np.random.default_rng(seed)
    x = (rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8) / np.float32(255)).astype(np.float32)
    return x, rng.integers(0, 10, n).astype(np.int32), None


def build(part, args, n):
    """(model, x, y, sample weights) of ``part`` for ``n`` examples."""
    import keras

    if part == "lm":
        x, y, w, _ = lm.make_data(n, args, "random")
        return lm.build_model(args), x, y, w
    path = Path(args.scratch) / "seed.keras"
    if not path.exists():
        subprocess.run([sys.executable, str(MAKE_MODEL), str(path)], check=True, env=os.environ)
    return keras.models.load_model(path), *seed_data(n, args.seed)


def training(part, name, args, n):
    """One training call of method ``name`` over ``n`` examples, and the model it trains."""
    import accum_train
    import keras

    model, x, y, w = build(part, args, n)
    k, micro = args.k, args.micro
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if name == B:
        optimizer = keras.optimizers.Adam(args.lr, gradient_accumulation_steps=k)
        model.compile(optimizer=optimizer, loss=loss, steps_per_execution=k)
    else:
        model.compile(optimizer=keras.optimizers.Adam(args.lr), loss=loss)
    if name in (A, C):
        return model, lambda: accum_train.fit(
            model, x, y, sample_weight=w, batch_size=k * micro, subdivisions=k, epochs=1, shuffle=False, verbose=0,
            trim_padding=name == C,
        )  # fmt: skip
    size = micro if name == B else k * micro
    return model, lambda: model.fit(x, y, sample_weight=w, batch_size=size, epochs=1, shuffle=False, verbose=0)


def iterations(model) -> int:
    import keras

    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def serve(part, name, args):
    """A timing child: one untimed round, then one timed round per "go"."""
    model, run = training(part, name, args, args.updates * args.k * args.micro)
    updates = lambda: iterations(model)  # noqa: E731
    started = time.perf_counter()
    run()
    print(json.dumps({"ready": True, "warmup_wall_s": time.perf_counter() - started, "updates": updates()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        cpu, wall = time.process_time(), time.perf_counter()
        run()
        print(json.dumps({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall, "updates": updates()}))
        sys.stdout.flush()


def status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def peak(part, name, args):
    """A memory child: the resident peak one update adds, after one untimed update (module docstring)."""
    model, run = training(part, name, args, args.k * args.micro)
    run()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = status_kib("VmRSS")
    run()
    if iterations(model) != 2:
        raise RuntimeError(f"{name}: not 2 updates")
    print(json.dumps({"peak_added_bytes": 1024 * (status_kib("VmHWM") - before), "rss_before_bytes": 1024 * before}))


def child(args, *serve_as):
    argv = [sys.executable, __file__, "--serve", *serve_as, *(f"--{key}={value}" for key, value in shared(args))]
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    return argv, env


def shared(args):
    keys = (*lm.MODEL, "k", "micro", "seed_k", "seed_micro", "updates", "lr", "seed", "scratch")
    return [(key.replace("_", "-"), getattr(args, key)) for key in keys]


def reply(name, process) -> dict:
    while True:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"{name}: the process ended early (exit code {process.wait()})")
        if line.startswith("{"):
            return json.loads(line)
        sys.stderr.write(f"[{name}] {line}")


def time_part(part, args) -> dict:
    """Each method's rounds, seconds per example."""
    examples = args.updates * args.k * args.micro if part == "lm" else args.updates * args.seed_k * args.seed_micro
    processes, rounds = {}, {name: {"cpu": [], "wall": []} for name in METHODS[part]}
    try:
        for name in METHODS[part]:
            argv, env = child(args, part, name)
            processes[name] = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            reply(name, processes[name])
        for r in range(args.rounds):
            for name, process in processes.items():
                process.stdin.write("go\n")
                process.stdin.flush()
                answer = reply(name, process)
                if answer["updates"] != (r + 2) * args.updates:
                    raise RuntimeError(f"{part} {name}: {answer['updates']} updates, not {(r + 2) * args.updates}")
                for measure in ("cpu", "wall"):
                    rounds[name][measure].append(answer[measure] / examples)
    finally:
        for process in processes.values():
            process.kill()
            process.wait()
    return {
        name: {
            "rounds_cpu_s_per_example": r["cpu"],
            "rounds_wall_s_per_example": r["wall"],
            "cpu_s_per_example": statistics.median(r["cpu"]),
            "wall_s_per_example": statistics.median(r["wall"]),
        }
        for name, r in rounds.items()
    }


LABELS = {"seed": "seed net's Keras twin", "lm": "GPT-2 causal LM"}


def markdown_table(report) -> str:
    """The results page's tables from the JSON ``--output`` wrote (scripts/results_tables.py)."""
    machine, command = report["machine"], report["command"]
    versions = ", ".join(f"{name} {version}" for name, version in report["versions"].items())
    caption = (
        f"Measured on {machine['cpus']} CPUs ({machine['cpu']}), {versions}, commit {machine['commit']}: `{command}`"
    )
    lines = [
        caption,
        "",
        "| model | method | examples per CPU-second | examples per wall-second |",
        "|---|---|---:|---:|",
    ]
    for part, methods in report["times"].items():
        for name, times in methods.items():
            lines.append(
                f"| {LABELS[part]} | {name} | {1 / times['cpu_s_per_example']:.1f} | "
                f"{1 / times['wall_s_per_example']:.1f} |"
            )
    lines += ["", caption + "; paired rounds, median [95% interval]; peaks: the resident set one update adds", ""]
    lines += ["| ratio | target | measured |", "|---|---|---|"]
    for row in report["results"]:
        r, better = row["ratio"], row["target"].startswith(">=")  # rounded against accum-train (tables.py)
        figure = tables.interval(r, better) if r["low"] != r["high"] else tables.against(r["median"], better)
        if row["theirs"] == E and row["measure"] in ("cpu", "wall"):  # a cost: seconds per example, ours over its
            name = f"{LABELS[row['part']]}: {row['ours']}'s {row['measure']} seconds per example over {row['theirs']}'s"
        else:
            name = f"{LABELS[row['part']]}: {row['ours']} over {row['theirs']}, {row['measure']}"
        lines.append(f"| {name} | {row['target']} | {figure}: {'met' if row['met'] else 'NOT met'} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for key, default in (("V", 1000), ("L", 2), ("heads", 4), ("D", 64), ("T", 128)):
        parser.add_argument(f"--{key}", type=int, default=default, help="the GPT-2's (peers_causal_lm.py's)")
    parser.add_argument("--k", type=int, default=8, help="the lm's micro-batches per update")
    parser.add_argument("--micro", type=int, default=8, help="the lm's micro-batch")
    parser.add_argument("--seed-k", type=int, default=8, help="the seed net's micro-batches per update")
    parser.add_argument("--seed-micro", type=int, default=64, help="the seed net's micro-batch")
    parser.add_argument("--updates", type=int, default=10, help="updates per method per round")
    parser.add_argument("--rounds", type=int, default=paired.ROUNDS)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scratch", default="/tmp/peers-jax", help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--serve", nargs=2, default=None, help=argparse.SUPPRESS)  # PART NAME, or peak NAME
    args = parser.parse_args()
    Path(args.scratch).mkdir(parents=True, exist_ok=True)
    if args.serve:
        part, name = args.serve
        if part == "seed":  # the seed net's own batch: the GPT-2's arguments stay the lm's
            args.k, args.micro = args.seed_k, args.seed_micro
        return peak("lm", name, args) if part == "peak" else serve(part, name, args)

    peaks = {}
    for name in PEAKED:
        argv, env = child(args, "peak", name)
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
        peaks[name] = json.loads(done.stdout.strip().splitlines()[-1])
    times = {part: time_part(part, args) for part in METHODS}
    results = []
    for (part, ours, theirs, measure), target in TARGETS.items():
        if theirs == E:  # a cost against the floor: our seconds over its
            ratio = paired.paired_ratio(
                times[part][ours][f"rounds_{measure}_s_per_example"],
                times[part][theirs][f"rounds_{measure}_s_per_example"],
            )
        else:  # examples per second, ours over theirs
            ratio = paired.per_round(times[part], ours, theirs, measure)
        results.append({"part": part, "ours": ours, "theirs": theirs, "measure": measure, "target": target,
                        "ratio": ratio, "met": paired.reaches(target, ratio)})  # fmt: skip
    for name in (A, C):
        value = peaks[name]["peak_added_bytes"] / peaks[E]["peak_added_bytes"]
        ratio = {"median": value, "low": value, "high": value}  # one measurement
        results.append({"part": "lm", "ours": name, "theirs": E, "measure": "peak added RSS", "target": PEAK_TARGET,
                        "ratio": ratio, "met": paired.reaches(PEAK_TARGET, ratio)})  # fmt: skip
    for row in results:
        r = row["ratio"]
        print(
            f"{row['part']:<5} {row['ours']:<36} / {row['theirs']:<24} {row['measure']:<15} "
            f"{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}]  target {row['target']}: "
            f"{'met' if row['met'] else 'NOT met'}"
        )
    if args.output:
        import jax
        import keras
        from provenance import machine

        report = {
            "command": "python benchmarks/peers_jax.py "
            + " ".join(f"--{k} {v}" for k, v in shared(args)[:-1])
            + f" --rounds {args.rounds} --output {args.output}",
            "rounds": args.rounds,
            "versions": {"jax": jax.__version__, "keras": keras.__version__},
            "machine": machine(),
            "times": times,
            "peaks": peaks,
            "results": results,
        }
        args.output.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
