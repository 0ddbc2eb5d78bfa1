"""Where the time of one update goes: a tf.profiler trace, op time by kind.

Three variants of the same update (seed convnet x1/8, batch 256, Adam), each in
its own process (thread pools are per process), traced over --updates updates
after a warm-up:

  k=1            one pass over the batch, TensorFlow's default threads
  k=8, 1 at once the micro-steps one after another, default threads
  k=8, 2 at once what accum-train chooses on a CPU (runtime.py): two micro-steps
                 in flight, each op on half the cores (one thread on 2 cores),
                 two ops side by side

Kernel time is each op's duration in the trace (TensorFlow's executor
threads), summed over those threads and divided by the updates. An op that
hands its work to the intra-op pool counts the time it waits for it, and two
ops in flight at once both count: kernel time is not CPU time, and shares
between variants compare only on a quiet machine. Kinds, by op type and by
where the op sits:

  convolutions    Conv2D forward and both backward ops, MatMul
  batch norm      FusedBatchNormV3 and its gradient
  activations     LeakyRelu(Grad), the loss, the mean pool and its gradient
  accumulation    adds into the gradient cache and BatchNorm sums (variable
                  adds, or the loop-carried adds)
  loop, slicing   while-loop control, micro-batch bounds and slices
  other in loop   the rest of the micro-step (small elementwise ops)
  after the loop  all-reduce, finite check, norm, the optimizer's apply,
                  the BatchNorm fold, clearing the cache

    python benchmarks/profile.py                              # the table, printed
    python benchmarks/profile.py --output docs/profile.json   # and kept: docs/performance.md's table
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import provenance  # benchmarks/ is on sys.path: this script runs from there

VARIANTS = {"k=1": (1, 1), "k=8, 1 at once": (8, 1), "k=8, 2 at once": (8, 2)}  # label: (k, parallel)
KINDS = (
    "convolutions",
    "batch norm",
    "activations",
    "accumulation",
    "loop, slicing",
    "other in loop",
    "after the loop",
)
LOOP_CONTROL = {
    "Enter",
    "Exit",
    "Merge",
    "Switch",
    "NextIteration",
    "LoopCond",
    "StridedSlice",
    "Less",
    "FloorDiv",
    "Minimum",
    "Identity",
    "Const",
    "Shape",
    "Cast",
    "Pack",
}


def kind(name: str, op: str) -> str:
    if "while/" not in name:
        return "after the loop"
    if "Conv2D" in op or "MatMul" in op:
        return "convolutions"
    if "FusedBatchNorm" in op:
        return "batch norm"
    if (
        op
        in ("LeakyRelu", "LeakyReluGrad", "SparseSoftmaxCrossEntropyWithLogits", "Mean", "Tile", "BroadcastTo", "Sum")
        and "pending" not in name
    ):
        return "activations"
    if op == "AssignAddVariableOp" or (re.search(r"while/add_\d+$", name) and "gradient_tape" not in name):
        return "accumulation"
    if op in LOOP_CONTROL:
        return "loop, slicing"
    return "other in loop"


def measure(k: int, parallel: int, updates: int) -> dict:
    import accum_train  # noqa: F401
    import numpy as np
    import tensorflow as tf
    from accum_train.backends.tensorflow.engine import Accumulator
    from accum_train.backends.tensorflow.objective import sparse_softmax_loss
    from accum_train.config import ModelConfig, OptimizerConfig
    from accum_train.datasets import fashion_mnist
    from accum_train.from_config.optim import make_optimizer
    from accum_train.models import build_model
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    data = fashion_mnist.load(train_limit=256)
    x = tf.constant(data.train.images[..., None].astype(np.float32) / 255.0)
    y = tf.constant(data.train.labels.astype(np.int32))
    model = build_model(ModelConfig(width=0.125), 0, (28, 28, 1), 10)
    opt = make_optimizer(OptimizerConfig(learning_rate=1e-3), 1e-3, model.trainable_variables)
    engine = Accumulator(
        sparse_softmax_loss(model.forward),
        model.trainable_variables,
        opt,
        subdivisions=k,
        norm_layers=model.norm_layers,
        parallel=parallel,
    )
    for _ in range(3):
        float(engine.update(x, y)["loss"])
    trace = tempfile.mkdtemp()
    tf.profiler.experimental.start(trace)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(updates):
        float(engine.update(x, y)["loss"])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    with open(glob.glob(f"{trace}/**/*.xplane.pb", recursive=True)[0], "rb") as f:
        space.ParseFromString(f.read())
    ms = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and not name.startswith(("ExecutorState", "ThreadpoolListener")):
                    node, op = name.rsplit(":", 1)
                    ms[kind(node, op)] += event.duration_ps / 1e9 / updates
    return {"wall_ms": 1000 * wall / updates, "cpu_ms": 1000 * cpu / updates, "op_ms": dict(ms)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)  # k parallel
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.updates)))
        return
    rows = {}
    from accum_train.trainer.runtime import child_environment, thread_pools

    for label, (k, parallel) in VARIANTS.items():
        # the pools threads.configure sets for that many micro-steps in flight (none: TensorFlow's defaults)
        out = subprocess.run(
            [sys.executable, __file__, "--updates", str(args.updates), "--child", str(k), str(parallel)],
            capture_output=True,
            text=True,
            env=child_environment(thread_pools(parallel)),
        )
        if out.returncode:
            raise SystemExit(f"{label} failed:\n{out.stderr[-3000:]}")
        rows[label] = json.loads(out.stdout.strip().splitlines()[-1])
    labels = list(rows)
    print(f"ms per update (seed convnet x1/8, batch 256, {args.updates} traced updates each)")
    print(f"{'':<28}" + "".join(f"{label:>16}" for label in labels))
    for key in ("wall_ms", "cpu_ms"):
        print(
            f"{'wall' if key == 'wall_ms' else 'CPU':<28}" + "".join(f"{rows[label][key]:>16.1f}" for label in labels)
        )
    for name in KINDS:
        kernels = "".join(f"{rows[label]['op_ms'].get(name, 0.0):>16.1f}" for label in labels)
        print(f"{'  ' + name:<28}" + kernels)
    print(f"{'  all kernels':<28}" + "".join(f"{sum(rows[label]['op_ms'].values()):>16.1f}" for label in labels))
    if args.output:
        report = {"machine": provenance.machine(), "updates": args.updates, "kinds": list(KINDS), "variants": rows}
        args.output.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
