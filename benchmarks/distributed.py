"""Accumulate-then-reduce vs a reduction per micro-batch, on MirroredStrategy.

(a) accum-train's engine (Accumulator on the strategy): each replica
    accumulates its k local micro-batches in a tf.range loop (no collective
    inside), then ONE all-reduce per update carries the gradients, the loss
    and the retry flag; the apply-or-skip decision is a tf.cond in
    cross-replica context, all in one graph call.
(n) the naive way, in ONE graph call per update, so that the ratio measures
    the collectives and not Python call overhead: one tf.function whose
    replica function runs the k micro-batches Python-unrolled (collectives
    cannot sit inside a tf.range loop) and all-reduces each micro-batch's
    gradient as it is computed. The k-th all-reduce is the one
    apply_gradients performs in replica context: each replica hands in its
    last local gradient plus 1/replicas of the sum already reduced, so the
    applied gradient is the exact sum with k gradient all-reduces, not k + 1.
    (n) checks nothing, reports no loss, clips nothing, and its unrolled loop is a little faster than a
    tf.range loop on CPU (see NOTES): every difference other than the collectives favours (n).

Both on the seed convnet (norm none) over --devices logical CPUs, the same
batch and initial weights (their first updates are checked to agree);
interleaved rounds, medians. Graph calls per update are counted at run time
(top-level tf.function calls in one warm update). Collectives per update are
logged while the update's graphs are traced (each graph runs once per update;
checked: each traced once, none called twice) by a counting CrossDeviceOps,
plus strategy.reduce, which MirroredStrategy runs past the strategy's
CrossDeviceOps when the destination is a CPU.

    python benchmarks/distributed.py            # 2 logical CPUs, k=8
    python benchmarks/distributed.py --output docs/distributed.json   # docs/distributed.md's table
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path

import accum_train  # noqa: F401
import provenance  # benchmarks/ is on sys.path: this script runs from there
from accum_train.backends.tensorflow.distribute import CountingCrossDeviceOps, make_strategy


class LoggingCrossDeviceOps(CountingCrossDeviceOps):
    """CountingCrossDeviceOps that also logs each collective: (kind, tensors, elements per replica).

    A reduction's own broadcast back to the replicas (ReductionToOneDevice
    reduces to one device, then broadcasts) is part of it, not logged apart.
    ``watch`` adds what bypasses the strategy's CrossDeviceOps: MirroredStrategy's
    ``strategy.reduce`` to a CPU destination uses a private ReductionToOneDevice."""

    def __init__(self):
        super().__init__()
        self.log = []
        self._inside = 0

    @staticmethod
    def _size(value):
        parts = getattr(value, "values", (value,))  # a PerReplica value: one replica's part
        return int(parts[0].shape.num_elements() or 0)

    def _collective(self, entry, run):
        if not self._inside:
            self.log.append(entry)
        self._inside += 1
        try:
            return run()
        finally:
            self._inside -= 1

    def reduce(self, reduce_op, per_replica_value, destinations, options=None):
        return self._collective(
            ("reduce", 1, self._size(per_replica_value)),
            lambda: super(LoggingCrossDeviceOps, self).reduce(reduce_op, per_replica_value, destinations, options),
        )

    def batch_reduce(self, reduce_op, value_destination_pairs, options=None):
        pairs = list(value_destination_pairs)
        return self._collective(
            ("batch_reduce", len(pairs), sum(self._size(v) for v, _ in pairs)),
            lambda: super(LoggingCrossDeviceOps, self).batch_reduce(reduce_op, pairs, options),
        )

    def broadcast(self, tensor, destinations):
        return self._collective(
            ("broadcast", 1, self._size(tensor)),
            lambda: super(LoggingCrossDeviceOps, self).broadcast(tensor, destinations),
        )

    def watch(self, strategy):
        """Log strategy.extended.reduce_to (behind strategy.reduce) too, whichever CrossDeviceOps runs it."""
        extended = strategy.extended
        original = extended.reduce_to

        def reduce_to(reduce_op, value, destinations, options=None):
            return self._collective(
                ("reduce", 1, self._size(value)), lambda: original(reduce_op, value, destinations, options)
            )

        extended.reduce_to = reduce_to


@contextlib.contextmanager
def graph_calls():
    """Count top-level tf.function calls, and the traces each of them made, while inside."""
    import tensorflow as tf

    cls = type(tf.function(lambda: None))
    original = cls.__call__
    calls, depth = [], [0]

    def counting(self, *args, **kwargs):
        depth[0] += 1
        traces = self.experimental_get_tracing_count()
        try:
            return original(self, *args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                calls.append((self, self.experimental_get_tracing_count() - traces))

    cls.__call__ = counting
    try:
        yield calls
    finally:
        cls.__call__ = original


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--micro", type=int, default=32, help="micro-batch size per replica")
    parser.add_argument("--width", type=float, default=0.125)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    load_before = os.getloadavg()

    ops = LoggingCrossDeviceOps()
    strategy = make_strategy("mirrored", args.devices, cross_device_ops=ops)
    ops.watch(strategy)
    import numpy as np
    import tensorflow as tf
    from accum_train.backends.tensorflow.engine import Accumulator
    from accum_train.backends.tensorflow.objective import sparse_softmax_loss
    from accum_train.config import ModelConfig, OptimizerConfig
    from accum_train.from_config.optim import make_optimizer
    from accum_train.models import build_model
    from accum_train.trainer.data.batching import micro_bounds

    def setup():
        with strategy.scope():
            model = build_model(ModelConfig(width=args.width, norm="none"), 0, (28, 28, 1), 10)
            opt = make_optimizer(OptimizerConfig(learning_rate=1e-3), 1e-3, model.trainable_variables)
        return model, opt, sparse_softmax_loss(model.forward)

    k, replicas = args.k, args.devices
    batch = replicas * k * args.micro
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((batch, 28, 28, 1), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, batch).astype(np.int32))

    model, opt, loss_fn = setup()
    ours = Accumulator(loss_fn, model.trainable_variables, opt, subdivisions=k, strategy=strategy)

    naive_model, naive_opt, naive_loss = setup()
    variables = naive_model.trainable_variables
    for mine, theirs in zip(variables, model.trainable_variables):  # the same initial weights
        mine.assign(theirs.read_value())
    gradient_elements = sum(int(v.shape.num_elements()) for v in variables)

    def naive_local(xr, yr):
        """One replica's share: k micro-batches, each gradient all-reduced; the k-th inside apply_gradients."""
        ctx = tf.distribute.get_replica_context()
        local_n = int(yr.shape[0])
        reduced = None
        for i in range(k):  # Python-unrolled: the all-reduces must not sit inside a tf.range loop
            start, end = micro_bounds(i, local_n, k)
            with tf.GradientTape() as tape:
                share = tf.reduce_sum(naive_loss(xr[start:end], yr[start:end])) / batch
            grads = tape.gradient(share, variables)
            if i < k - 1:
                grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
                reduced = grads if reduced is None else [r + g for r, g in zip(reduced, grads)]
        if reduced is not None:
            grads = [g + r / ctx.num_replicas_in_sync for g, r in zip(grads, reduced)]
        naive_opt.apply_gradients(zip(grads, variables))  # Keras all-reduces (SUM) in replica context

    @tf.function
    def naive_update(xb, yb):
        def share(ctx, tensor):
            start, end = micro_bounds(ctx.replica_id_in_sync_group, batch, ctx.num_replicas_in_sync)
            return tensor[start:end]

        xs = strategy.experimental_distribute_values_from_function(lambda ctx: share(ctx, xb))
        ys = strategy.experimental_distribute_values_from_function(lambda ctx: share(ctx, yb))
        strategy.run(naive_local, args=(xs, ys))

    def ours_update():
        ours.update(x, y)

    def naive():
        naive_update(x, y)

    methods = {"(a) accumulate-then-reduce": ours_update, "(n) reduce per micro-batch": naive}

    # The first update of each: traces its graphs (collectives counted), and both must agree.
    counts = {}
    for name, fn in methods.items():
        del ops.log[:]
        with graph_calls() as calls:
            fn()
        retraced = [f for f, traces in calls if traces != 1]
        if retraced or len({id(f) for f, _ in calls}) != len(calls):
            raise SystemExit(
                f"{name}: a graph traced more than once or called twice in one update; "
                f"per-update collective counts would be wrong"
            )
        counts[name] = {"log": list(ops.log)}
    worst = max(
        float(tf.reduce_max(tf.abs(a - b)) / (tf.reduce_max(tf.abs(a)) + 1e-12))
        for a, b in zip(model.trainable_variables, variables)
    )
    if worst > 1e-4:
        raise SystemExit(f"the two methods' first updates disagree: max relative difference {worst:.2e}")
    for name, fn in methods.items():  # one warm update: graph calls at run time
        with graph_calls() as calls:
            fn()
        counts[name]["graph_calls"] = len(calls)

    cpu = {name: [] for name in methods}
    wall = {name: [] for name in methods}
    for _ in range(args.rounds):
        for name, fn in methods.items():
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(args.updates):
                fn()
            float(tf.reduce_sum(variables[0]))  # wait for the work
            float(tf.reduce_sum(model.trainable_variables[0]))
            cpu[name].append((time.process_time() - c0) / args.updates)
            wall[name].append((time.perf_counter() - w0) / args.updates)

    print(
        f"MirroredStrategy over {replicas} logical CPUs, k={k} micro-batches of {args.micro} per replica "
        f"(batch {batch}), seed convnet x{args.width} (norm none, {gradient_elements} gradient floats), "
        f"{args.rounds} rounds x {args.updates} updates; first updates agree to {worst:.1e} (max relative)"
    )
    print(
        f"{'method':<28} {'graph calls':>11} {'gradient':>10} {'other':>7} {'all':>5} "
        f"{'median s/update':>16} {'CPU s/update':>13}"
    )
    print(f"{'':<28} {'/update':>11} {'all-reduces':>10} {'x-dev':>7} {'x-dev':>5} {'(wall)':>16} {'':>13}")
    for name in methods:
        log = counts[name]["log"]
        gradient = sum(1 for kind, _, size in log if kind != "broadcast" and size >= gradient_elements)
        counts[name]["gradient_all_reduces"] = gradient
        counts[name]["other_collectives"] = len(log) - gradient
        print(
            f"{name:<28} {counts[name]['graph_calls']:>11} {gradient:>10} {len(log) - gradient:>7} "
            f"{len(log):>5} {statistics.median(wall[name]):>16.4f} {statistics.median(cpu[name]):>13.4f}"
        )
    print("collectives traced per update (kind, tensors, elements per replica):")
    for name in methods:
        summary = {}
        for entry in counts[name]["log"]:
            summary[entry] = summary.get(entry, 0) + 1
        print(
            f"  {name}: "
            + ", ".join(f"{n} x {kind}({tensors}, {size})" for (kind, tensors, size), n in summary.items())
        )
    print(
        "  (batch_reduce of all gradients: a gradient all-reduce (the engine's also carries the loss and its\n"
        "   retry flag); broadcast(1, 1): Keras' optimizer.iterations, an ONLY_FIRST_REPLICA variable, moved\n"
        "   once per apply_gradients by either method)"
    )
    a, n = "(a) accumulate-then-reduce", "(n) reduce per micro-batch"
    wall_ratio = statistics.median(wall[n]) / statistics.median(wall[a])
    cpu_ratio = statistics.median(cpu[n]) / statistics.median(cpu[a])
    print(
        f"(n)/(a) time per update, 3 decimals rounded down (against accum-train), then full precision:\n"
        f"  wall {floor3(wall_ratio)}  {wall_ratio!r}\n  CPU  {floor3(cpu_ratio)}  {cpu_ratio!r}"
    )
    if args.output:
        report = {
            "machine": {**provenance.machine(), "load_average_before": load_before, "tensorflow": tf.__version__},
            "args": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
            "gradient_elements": gradient_elements,
            "first_updates_agree": worst,
            "methods": {
                name: {
                    "graph_calls": counts[name]["graph_calls"],
                    "gradient_all_reduces": counts[name]["gradient_all_reduces"],
                    "other_collectives": counts[name]["other_collectives"],
                    "collectives": [list(entry) for entry in counts[name]["log"]],
                    "wall_s": wall[name],
                    "cpu_s": cpu[name],
                }
                for name in methods
            },
            "ratios": {"wall": wall_ratio, "cpu": cpu_ratio},
        }
        args.output.write_text(json.dumps(report, indent=2) + "\n")


def floor3(value):
    return str(Decimal(repr(value)).quantize(Decimal("0.001"), rounding=ROUND_FLOOR))


if __name__ == "__main__":
    main()
