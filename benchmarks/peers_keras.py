"""accum-train beside Keras 3's own accumulation on the user's model: a keras_file.

peers.py's side by side (same machinery, imported from it), with the model the
README's own example writes (scripts/make_keras_model.py: conv, BatchNorm,
conv, dense) saved to a .keras file at the start, and the same Fashion-MNIST
batch, micro-batch, k and Adam learning rate for every method:

  (a)  accum-train as a keras_file run trains it: build_model with
       model.name keras_file (its BatchNormalization layers pooling their
       statistics, moving statistics deferred to once per update),
       Accumulator, one graph call per update, with the micro-steps in
       flight and the thread pools accum-train itself chooses (runtime.py)
  (a1) the same, one micro-step at a time, TensorFlow's default threads
  (a1') (a1) under (a)'s thread pools, the twin of (b'')
  (b)  the same file through keras.models.load_model, compiled with
       Adam(gradient_accumulation_steps=k) and from_logits cross-entropy,
       ONE model.fit per round over --updates x k micro-batches, compile
       defaults (jit_compile="auto", steps_per_execution=1)
  (b') the same with steps_per_execution=k: one graph call per update
  (b'') (b') under (a)'s thread pools, in case they suit Keras too
  (b''') (b') compiled with jit_compile=True (XLA, which "auto" leaves off
       on a CPU)
  (e)  one plain pass over the whole batch of k x micro (accum-train's
       engine, no accumulation), TensorFlow's default threads: the update
       without micro-batches, for reference (not a Keras variant)

Every method in its own process, warmed up with one untimed round, then
--rounds interleaved timed rounds; medians of CPU and wall time per example,
and each ratio also round by round: the median of the per-round ratios with
its 95% interval (benchmarks/paired.py; peers.py's docstring).
Keras' optimizer.iterations is checked against the updates asked for. The a/b
ratios are against the fastest Keras variant, by CPU and by wall time
separately; printed with 3 decimals rounded against accum-train, full
precision in the JSON (--output).

    python benchmarks/peers_keras.py --output docs/peers-keras-file.json   # the README's figures
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import accum_train  # noqa: F401  (allocator statistics on, before TensorFlow loads)
import keras
import paired
import peers  # benchmarks/ is on sys.path: this script runs from there, and so do its timing children
from accum_train.config import ModelConfig
from peers import KERAS, A, B, E

MAKE_MODEL = Path(__file__).resolve().parent.parent / "scripts" / "make_keras_model.py"
METHODS = (A, *peers.ONE_AT_A_TIME, *KERAS, E)


def build_method(name, args, x, y):
    k, micro = args.k, args.micro
    batch = k * micro
    # a keras_file run's model: the file loaded and checked, its BatchNormalization made accumulating
    users_model = ModelConfig(name="keras_file", path=args.model_path)
    if name in (A, *peers.ONE_AT_A_TIME):
        return peers.ours(users_model, k, x[:batch], y[:batch], parallel=peers.ours_parallel(k) if name == A else 1)
    if name == E:
        return peers.ours(users_model, 1, x[:batch], y[:batch], plain=True)
    return peers.KerasAccumulation(
        lambda: keras.models.load_model(args.model_path),
        k,
        micro,
        x[:batch],
        y[:batch],
        args.updates,
        steps_per_execution=1 if name == B else k,
        jit_compile=True if name == peers.B_XLA else "auto",
    )


def write_readme_model(path: Path) -> None:
    """The README example's model, written by its own script (so that both are the same model)."""
    out = subprocess.run([sys.executable, str(MAKE_MODEL), str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{MAKE_MODEL.name} failed ({out.returncode}):\n{out.stderr[-3000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument(
        "--rounds", type=int, default=paired.ROUNDS, help="interleaved timed rounds (6: the fewest for a 95%% interval)"
    )
    parser.add_argument(
        "--updates", type=int, default=20, help="updates per method per round (for (b): one fit over this many updates)"
    )
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--model-path", default=None, help=argparse.SUPPRESS)  # the children's copy of the file
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # a timing child: see peers.serve()
    args = parser.parse_args()

    if args.serve:
        x, y = peers.fashion_mnist_batch(args.k * args.micro)
        return peers.serve(build_method(args.serve, args, x, y), args.updates)

    with tempfile.TemporaryDirectory() as scratch:
        args.model_path = str(Path(scratch) / "readme_example.keras")
        write_readme_model(Path(args.model_path))
        load_before = os.getloadavg()
        started = time.perf_counter()
        spec = {name: peers.method_spec(args)[name] for name in METHODS}
        times, keras_jit = peers.time_methods(
            args, spec, script=__file__, shared_args=("k", "micro", "updates", "model_path")
        )
        timing_s = time.perf_counter() - started
    print(
        f"time: the README's keras_file model (scripts/make_keras_model.py), k={args.k}, micro-batch {args.micro}, "
        f"{args.rounds} rounds x {args.updates} updates per method (one fit per round for Keras), each method in "
        f"its own process, medians; keras jit_compile resolved to {keras_jit[B]}"
    )
    peers.print_times(times)
    ratios, details, (best_cpu, best_wall), one = peers.against_keras(times)
    paired_ratios, paired_details = peers.paired_against_keras(times, (best_cpu, best_wall), one)
    print(
        f"\nratios, 3 decimals rounded against accum-train (full precision in the JSON); "
        f"a/b against the faster Keras: CPU {best_cpu}, wall {best_wall}. Each: the ratio of the medians above, the "
        f"median of the {args.rounds} per-round ratios [its interval, "
        f"{100 * paired_ratios['a/b examples per CPU-second']['confidence']:.2f}% coverage], full precision"
    )
    peers.print_details({**ratios, **details}, {**paired_ratios, **paired_details})
    if args.output:
        args.output.write_text(
            json.dumps(
                {
                    "args": {key: str(value) for key, value in vars(args).items() if key != "model_path"},
                    "model": "scripts/make_keras_model.py (the README's keras_file example)",
                    "environment": peers.environment(load_before, timing_s, keras_jit),
                    "time": times,
                    "ratios": ratios,
                    "ratios_a_b_per_keras_variant": details,
                    "a_b_against": {"cpu": best_cpu, "wall": best_wall},
                    "a1_best": one,
                    # each ratio round by round: median, 95% interval, per-round ratios (paired.py)
                    "paired_ratios": paired_ratios,
                    "paired_ratios_a_b_per_keras_variant": paired_details,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
