"""What a first fit call costs on a KerasHub task: accum_train.fit against model.fit, each the first call of a
fresh process (tracing, the loss probe, preprocessing), alternated round by round.

The task: the tests' tiny BertTextClassifier with its preprocessor and LoRA (tests/hub_tasks.py: an inline
vocabulary, nothing downloaded), 100 raw texts, batch 30, validation_split 0.2, two epochs; accum_train.fit cuts
each batch into micro-batches of 8. Reported: the CPU and wall seconds of the call (the process's start and the
model's build are not counted), the medians over the rounds, and ours over Keras' per round.

    python benchmarks/fit_start.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import provenance  # benchmarks/ is on sys.path: this script runs from there

SIDES = ("accum_train.fit", "model.fit")


def serve(side: str) -> None:
    sys.path.insert(0, str(provenance.ROOT / "tests"))  # the tiny tasks the tests build
    import accum_train
    import keras
    import numpy as np
    from hub_tasks import text_classifier, texts

    keras.utils.set_random_seed(3)
    model = text_classifier()
    model.backbone.enable_lora(2)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss, metrics=["accuracy"])
    x, y = texts(100, seed=1), np.arange(100) % 3
    arguments = dict(batch_size=30, validation_split=0.2, epochs=2, verbose=0)
    c0, w0 = time.process_time(), time.perf_counter()
    if side == "model.fit":
        model.fit(x, y, **arguments)
    else:
        accum_train.fit(model, list(x), y, micro_batch_size=8, **arguments)
    print(json.dumps({"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--serve", choices=SIDES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    rounds = {side: [] for side in SIDES}
    for _ in range(args.rounds):
        for side in SIDES:
            done = subprocess.run(
                [sys.executable, __file__, "--serve", side], capture_output=True, text=True, check=True
            )
            rounds[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
    ours, keras_side = rounds[SIDES[0]], rounds[SIDES[1]]
    report = {
        "environment": provenance.machine(),
        "rounds": rounds,
        "median_cpu_s": {side: statistics.median(r["cpu_s"] for r in rounds[side]) for side in SIDES},
        "median_wall_s": {side: statistics.median(r["wall_s"] for r in rounds[side]) for side in SIDES},
        "ours_over_keras_cpu": [a["cpu_s"] / b["cpu_s"] for a, b in zip(ours, keras_side)],
    }
    for side in SIDES:
        cpu = ", ".join(f"{r['cpu_s']:.2f}" for r in rounds[side])
        print(f"{side:>16}: CPU s {cpu} (median {report['median_cpu_s'][side]:.2f})")
    ratios = ", ".join(f"{r:.3f}" for r in report["ours_over_keras_cpu"])
    print(f"accum_train.fit / model.fit, CPU, per round: {ratios}")
    if args.output:
        args.output.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
