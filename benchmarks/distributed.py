"""Accumulate-then-reduce vs a reduction per micro-batch, on MirroredStrategy.

(a) accum-train's DistributedUpdate: each replica accumulates its k local
    micro-batches, then one all-reduce of the gradients per update.
(n) the naive way: every micro-batch is its own strategy.run whose gradients
    are all-reduced into the cache (k all-reduces), then the apply.
Both on the seed convnet (norm none) over --devices logical CPUs, same batch;
interleaved rounds; collective counts from a counting CrossDeviceOps.

    python benchmarks/distributed.py            # 2 logical CPUs, k=8
"""

from __future__ import annotations

import argparse
import statistics
import time

import accum_train  # noqa: F401
from accum_train.config import StrategyConfig
from accum_train.distribute import CountingCrossDeviceOps, make_strategy


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--micro", type=int, default=32, help="micro-batch size per replica")
    parser.add_argument("--width", type=float, default=0.125)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=3)
    args = parser.parse_args()

    ops = CountingCrossDeviceOps()
    strategy = make_strategy(StrategyConfig(name="mirrored", cpu_devices=args.devices), cross_device_ops=ops)
    import numpy as np
    import tensorflow as tf

    from accum_train.config import ModelConfig, OptimizerConfig
    from accum_train.distribute import DistributedUpdate
    from accum_train.engine import sparse_softmax_loss
    from accum_train.models import build_model
    from accum_train.optim import make_optimizer

    def setup():
        with strategy.scope():
            model = build_model(ModelConfig(width=args.width, norm="none"), 0)
            opt = make_optimizer(OptimizerConfig(learning_rate=1e-3), 1e-3, model.trainable_variables)
        return model, opt, sparse_softmax_loss(model.forward)

    batch = args.devices * args.k * args.micro
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((batch, 28, 28, 1), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, batch).astype(np.int32))

    model, opt, loss_fn = setup()
    ours = DistributedUpdate(strategy, loss_fn, model.trainable_variables, opt, args.k)

    naive_model, naive_opt, naive_loss = setup()
    variables = naive_model.trainable_variables
    with strategy.scope():
        cache = [tf.Variable(tf.zeros(v.shape), trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                             aggregation=tf.VariableAggregation.SUM) for v in variables]
    replicas = strategy.num_replicas_in_sync

    def micro_local(xb, yb):
        with tf.GradientTape() as tape:
            share = tf.reduce_sum(naive_loss(xb, yb)) / batch
        grads = tape.gradient(share, variables)
        summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
        for slot, grad in zip(cache, summed):
            slot.assign_add(grad / replicas)  # every replica holds the sum; Keras will sum the copies again

    def apply_local():
        naive_opt.apply_gradients(zip([slot.read_value() for slot in cache], variables))
        for slot in cache:
            slot.assign(tf.zeros_like(slot))

    @tf.function
    def naive_micro(xb, yb):
        def share(ctx, tensor):
            per = tf.shape(tensor)[0] // ctx.num_replicas_in_sync
            return tensor[ctx.replica_id_in_sync_group * per:(ctx.replica_id_in_sync_group + 1) * per]
        xs = strategy.experimental_distribute_values_from_function(lambda ctx: share(ctx, xb))
        ys = strategy.experimental_distribute_values_from_function(lambda ctx: share(ctx, yb))
        strategy.run(micro_local, args=(xs, ys))

    naive_apply = tf.function(lambda: strategy.run(apply_local))
    step = args.devices * args.micro

    def naive_update():
        for i in range(args.k):
            naive_micro(x[i * step:(i + 1) * step], y[i * step:(i + 1) * step])
        naive_apply()

    def ours_update():
        ours.update(x, y)

    def traced(fn):
        """Collectives in the graphs fn traces (each traced graph runs once per call)."""
        before = ops.batch_reduce_calls + ops.reduce_calls
        fn()
        return ops.batch_reduce_calls + ops.reduce_calls - before

    # ours: one call of each graph per update. naive: the micro-step graph runs k times per update.
    counts = {"accumulate-then-reduce": traced(ours_update),
              "reduce per micro-batch": args.k * traced(lambda: naive_micro(x[:step], y[:step]))
              + traced(naive_apply)}
    times = {name: [] for name in counts}
    for _ in range(args.rounds):
        for name, fn in (("accumulate-then-reduce", ours_update), ("reduce per micro-batch", naive_update)):
            start = time.perf_counter()
            for _ in range(args.updates):
                fn()
            float(tf.reduce_sum(variables[0]))  # wait for the work
            times[name].append((time.perf_counter() - start) / args.updates)
    print(f"MirroredStrategy over {args.devices} logical CPUs, k={args.k} micro-batches of {args.micro} per "
          f"replica (batch {batch}), seed convnet x{args.width}, {args.rounds} rounds x {args.updates} updates")
    print(f"{'method':<26} {'collectives/update':>19} {'median s/update':>16}")
    for name in counts:
        print(f"{name:<26} {counts[name]:>19} {statistics.median(times[name]):>16.3f}")
    ratio = statistics.median(times["reduce per micro-batch"]) / statistics.median(times["accumulate-then-reduce"])
    print(f"per-micro-batch reduction takes {ratio:.2f}x the time per update")


if __name__ == "__main__":
    main()
