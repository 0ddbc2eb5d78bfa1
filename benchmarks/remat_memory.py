"""The memory ladder's last rung, measured: TensorFlow's allocator peak of one micro-step of a small GPT-2 causal LM
at each micro-batch size, as built and with its layers' activations recomputed in the backward pass (what
``micro_batch_size="auto"`` turns on where one example per micro-batch does not fit: accum/trainer/memory.py's
``rematerialiser``, keras.RematScope(mode="activations")).

The model: KerasHub's GPT2Backbone with random weights (no download) in a GPT2CausalLM without a preprocessor,
compiled with its default loss (SparseCategoricalCrossentropy on logits) and Adam; the data: token ids of full
length T. Each (mode, micro-batch) pair runs in a fresh process, so that no other tensor of the benchmark is alive
in the allocator: one accum_train.fit call traces the engine, then one micro-step is probed twice (the probe of
``choose_subdivisions``: forward, backward, add to the cache) and the second peak is kept.

    python benchmarks/remat_memory.py --output docs/remat-memory.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import provenance  # benchmarks/ is on sys.path: this script runs from there
from tables import caption

MODES = ("as built", "activations recomputed")


def serve(args) -> None:
    """One (mode, micro-batch) pair in this process: its micro-step's allocator peak as a JSON line."""
    import accum_train  # before TensorFlow: the allocator mode it reads at import
    import keras
    import keras_hub
    import numpy as np
    from accum_train.backends.tensorflow.backend import peak_during
    from accum_train.keras_fit.train import _ENGINES
    from accum_train.trainer.memory import rematerialiser

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=args.vocabulary,
        num_layers=args.layers,
        num_heads=4,
        hidden_dim=args.hidden,
        intermediate_dim=4 * args.hidden,
        max_sequence_length=args.T,
        dropout=0.0,
    )
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    rng = np.random.default_rng(0)
    micro = args.serve_micro
    tokens = rng.integers(1, args.vocabulary, (micro, args.T)).astype(np.int32)
    x = {"token_ids": tokens, "padding_mask": np.ones_like(tokens, bool)}
    y = np.roll(tokens, -1, axis=1)
    accum_train.fit(model, x, y, batch_size=micro, subdivisions=1, epochs=1, verbose=0)  # the engine, traced
    (engine, _), *_ = _ENGINES[model].values()
    if args.serve_mode == MODES[1]:
        rematerialiser(model, engine)()
    peaks = []
    for _ in range(2):  # the first traces the probe's graph
        _, peak = peak_during(lambda: engine.accumulate(x, y, micro))
        engine.reset()
        peaks.append(peak)
    print(json.dumps({"mode": args.serve_mode, "micro": micro, "peak_bytes": peaks[-1]}), flush=True)


def table(report: dict) -> str:
    """The JSON of --output as docs/results/memory.md's table."""
    env, args = report["environment"], report["args"]
    machine = f"{env['cpus']} CPUs ({env['cpu']}), TensorFlow {env['tensorflow']}, Keras {env['keras']}"
    options = " ".join(f"--{key} {args[key]}" for key in ("T", "layers", "hidden", "micro", "output"))
    lines = [
        caption(machine, env["commit"], f"python benchmarks/remat_memory.py {options}"),
        "",
        "| micro-batch | allocator peak, as built | activations recomputed | recomputed / as built |",
        "|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        plain, remat = row["peak_bytes"][MODES[0]], row["peak_bytes"][MODES[1]]
        lines.append(f"| {row['micro']} | {plain / 2**20:.1f} MiB | {remat / 2**20:.1f} MiB | {remat / plain:.3f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--T", type=int, default=256, help="sequence length")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--vocabulary", type=int, default=1000)
    parser.add_argument("--micro", default="1,2,4,8", help="micro-batch sizes, comma-separated")
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--serve-mode", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve-micro", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_mode:
        return serve(args)

    shared = [f"--T={args.T}", f"--layers={args.layers}", f"--hidden={args.hidden}", f"--vocabulary={args.vocabulary}"]
    rows = []
    for micro in (int(m) for m in args.micro.split(",")):
        peaks = {}
        for mode in MODES:
            command = [sys.executable, __file__, *shared, f"--serve-mode={mode}", f"--serve-micro={micro}"]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{mode}, micro-batch {micro}: the process failed:\n{done.stderr[-3000:]}")
            peaks[mode] = json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"]
        rows.append({"micro": micro, "peak_bytes": peaks})
        print(
            f"micro-batch {micro:>3}: {peaks[MODES[0]] / 2**20:8.1f} MiB as built, "
            f"{peaks[MODES[1]] / 2**20:8.1f} MiB recomputed ({peaks[MODES[1]] / peaks[MODES[0]]:.3f}x)",
            flush=True,
        )
    if args.output:
        import keras
        import tensorflow as tf

        environment = {
            **provenance.machine(),
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
        }
        args_json = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
        for key in ("serve_mode", "serve_micro"):
            args_json.pop(key)
        report = {"args": args_json, "environment": environment, "rows": rows}
        args.output.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
