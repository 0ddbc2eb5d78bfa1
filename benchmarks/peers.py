"""accum-train's engine side by side with what users would use instead.

One run, interleaved rounds, ratios printed. Methods, all on the seed convnet
(scaled by --width; a Keras-layer twin and a raw-op TF1 twin where a peer
needs its own), the same Fashion-MNIST batch and the same micro-batch:

  (a)  accum-train: AccumulatingUpdate, one graph call per update
  (b)  Keras 3: Adam(gradient_accumulation_steps=k) with model.fit, compile
       defaults (jit_compile="auto", steps_per_execution=1)
  (b') the same with steps_per_execution=k: one graph call per k micro-steps,
       i.e. per update, like (a)
  (c)  the seed's TF1 pattern: graph + Session, accumulate op run once per
       micro-batch through feed_dict, then the apply op
  (d)  plain training at the micro-batch size (the cost floor)
  (e)  one pass over the whole batch (the memory ceiling)

Time: each round runs --updates updates of every method in turn, each in its
idiomatic form: (a), (c), (d), (e) a Python loop of --updates updates; (b) and
(b') ONE model.fit call per round (epochs=1, batch_size=micro-batch, graph
mode) over --updates copies of the batch, i.e. --updates x k micro-batches,
so that fit's per-call setup (data adapter, iterator, callbacks) is paid once
per round, as in training, and not once per update. The number of optimizer
updates each fit made is checked (optimizer.iterations, which Keras keeps at
micro-steps // k). Every method is warmed up with one untimed round
(tracing). CPU and wall time per example are the medians over rounds. Memory: (a) at k=--mem-k and (e) on a batch of
--mem-batch, each in a fresh process (accum_train.bench), TF allocator peak
over the timed updates.

Ratios are kept at full precision in the JSON (--output) and printed with 3
decimals rounded against accum-train (down where higher is better for it, up
where lower is better), so the display never flatters it. The a/b ratios are
taken against the faster of (b) and (b').

    python benchmarks/peers.py --output docs/peers.json   # the README's figures
    python benchmarks/peers.py --rounds 3 --updates 5 --mem-batch 1024   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path

import accum_train  # noqa: F401  (allocator statistics on, before TensorFlow loads)
import keras
import numpy as np
import tensorflow as tf

from accum_train.config import ModelConfig, OptimizerConfig, config_from_dict
from accum_train.engine import AccumulatingUpdate, PlainUpdate, sparse_softmax_loss
from accum_train.models import SEED_CHANNELS, SEED_STRIDES, build_model
from accum_train.optim import make_optimizer

LR = 0.001
INPUT_SHAPE, NUM_CLASSES = (28, 28, 1), 10  # Fashion-MNIST; the Keras and TF1 twins hard-code them too


def channels(width):
    return [max(1, round(c * width)) for c in SEED_CHANNELS]


# Each method factory returns run(updates): that many optimizer updates on its
# batch, in the method's idiomatic form, returning when the work is done.

# ---------------------------------------------------------------- (a), (d), (e)

def ours(width, k, x, y, plain=False):
    model = build_model(ModelConfig(width=width), 0, INPUT_SHAPE, NUM_CLASSES)
    opt = make_optimizer(OptimizerConfig(learning_rate=LR), LR, model.trainable_variables)
    loss_fn = sparse_softmax_loss(model.forward)
    if plain:
        engine = PlainUpdate(loss_fn, model.trainable_variables, opt, clip_norm=None,
                             norm_layers=model.norm_layers)
    else:
        engine = AccumulatingUpdate(loss_fn, model.trainable_variables, opt, k, clip_norm=None,
                                    norm_layers=model.norm_layers)

    def run(updates):  # a training loop: one engine call per update, the loss read back
        for _ in range(updates):
            float(engine.update(tf.constant(x), tf.constant(y))["loss"])
    return run


# ---------------------------------------------------------------- (b), (b')

def keras_twin(width):
    layers = [keras.Input(INPUT_SHAPE)]
    for c, s in zip(channels(width), SEED_STRIDES):
        layers += [keras.layers.Conv2D(c, 3, s, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5),
                   keras.layers.LeakyReLU(negative_slope=0.2)]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(NUM_CLASSES)]
    return keras.Sequential(layers)


class KerasAccumulation:
    """model.fit with Adam(gradient_accumulation_steps=k): one fit call per round."""

    def __init__(self, width, k, micro, x, y, updates, steps_per_execution=1):
        keras.utils.set_random_seed(0)
        self.model = keras_twin(width)
        self.model.compile(optimizer=keras.optimizers.Adam(LR, gradient_accumulation_steps=k),
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           steps_per_execution=steps_per_execution)
        # `updates` copies of the batch: updates x k micro-batches, built once
        # (data preparation, not a cost of accumulation).
        self.updates = updates
        self.x = np.concatenate([x] * updates)
        self.y = np.concatenate([y] * updates)
        self.micro = micro

    def __call__(self, updates):
        if updates != self.updates:
            raise ValueError(f"built for {self.updates} updates per fit, asked for {updates}")
        self.model.fit(self.x, self.y, batch_size=self.micro, epochs=1, verbose=0, shuffle=False)

    def optimizer_updates(self):
        return int(self.model.optimizer.iterations.numpy())


# ---------------------------------------------------------------- (c)

def tf1_session(width, k, micro, xs, ys):
    graph = tf.Graph()
    with graph.as_default():
        v1 = tf.compat.v1
        x = v1.placeholder(tf.float32, [None, 28, 28, 1])
        y = v1.placeholder(tf.int32, [None])
        net, c_in = x, 1
        init = v1.glorot_uniform_initializer(seed=0)
        for i, (c, s) in enumerate(zip(channels(width), SEED_STRIDES)):
            w = v1.get_variable(f"conv{i}", [3, 3, c_in, c], initializer=init)
            net = tf.nn.conv2d(net, w, s, "SAME")
            mean, var = tf.nn.moments(net, [0, 1, 2])
            gamma = v1.get_variable(f"gamma{i}", [c], initializer=v1.ones_initializer())
            beta = v1.get_variable(f"beta{i}", [c], initializer=v1.zeros_initializer())
            net = tf.nn.leaky_relu(tf.nn.batch_normalization(net, mean, var, beta, gamma, 1e-5), 0.2)
            c_in = c
        w = v1.get_variable("dense", [c_in, 10], initializer=init)
        b = v1.get_variable("bias", [10], initializer=v1.zeros_initializer())
        logits = tf.matmul(tf.reduce_mean(net, [1, 2]), w) + b
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        variables = v1.trainable_variables()
        cache = [tf.Variable(tf.zeros(v.shape), trainable=False) for v in variables]
        grads = tf.gradients(loss, variables)
        accumulate = tf.group(*[c.assign_add(g / k) for c, g in zip(cache, grads)])
        apply = v1.train.AdamOptimizer(LR).apply_gradients(zip([c.read_value() for c in cache], variables))
        with tf.control_dependencies([apply]):
            apply_and_clear = tf.group(*[c.assign(tf.zeros_like(c)) for c in cache])
        session = v1.Session(graph=graph)
        session.run(v1.global_variables_initializer())

    def run(updates):  # the seed's loop: k feeds of the accumulate op, then the apply op
        for _ in range(updates):
            for i in range(k):
                session.run(accumulate, {x: xs[i * micro:(i + 1) * micro], y: ys[i * micro:(i + 1) * micro]})
            session.run(apply_and_clear)
    return run


# ---------------------------------------------------------------- timing

A, B, B_SPE, C, D, E = ("(a) accum-train", "(b) keras GA, fit", "(b') keras GA, fit, spe=k",
                        "(c) tf1 session", "(d) plain, micro-batch", "(e) plain, whole batch")


def time_methods(args, x, y):
    k, micro, updates = args.k, args.micro, args.updates
    batch = k * micro
    keras_default = KerasAccumulation(args.width, k, micro, x[:batch], y[:batch], updates)
    keras_spe = KerasAccumulation(args.width, k, micro, x[:batch], y[:batch], updates, steps_per_execution=k)
    methods = {  # name: (run, examples per update)
        A: (ours(args.width, k, x[:batch], y[:batch]), batch),
        B: (keras_default, batch),
        B_SPE: (keras_spe, batch),
        C: (tf1_session(args.width, k, micro, x[:batch], y[:batch]), batch),
        D: (ours(args.width, 1, x[:micro], y[:micro], plain=True), micro),
        E: (ours(args.width, 1, x[:batch], y[:batch], plain=True), batch),
    }
    for run, _ in methods.values():  # warm up with one untimed round: tracing, graph building
        run(updates)
    for name, fit in ((B, keras_default), (B_SPE, keras_spe)):
        if fit.optimizer_updates() != updates:
            raise RuntimeError(f"{name}: one fit made {fit.optimizer_updates()} optimizer updates, not {updates}")
    cpu = {name: [] for name in methods}
    wall = {name: [] for name in methods}
    for _ in range(args.rounds):
        for name, (run, n) in methods.items():
            c0, w0 = time.process_time(), time.perf_counter()
            run(updates)
            cpu[name].append((time.process_time() - c0) / (updates * n))
            wall[name].append((time.perf_counter() - w0) / (updates * n))
    for name, fit in ((B, keras_default), (B_SPE, keras_spe)):
        expected = (args.rounds + 1) * updates
        if fit.optimizer_updates() != expected:
            raise RuntimeError(f"{name}: {fit.optimizer_updates()} optimizer updates in all, not {expected}")
    keras_jit = {name: bool(fit.model.jit_compile) for name, fit in ((B, keras_default), (B_SPE, keras_spe))}
    return {name: {"cpu_s_per_example": statistics.median(cpu[name]),
                   "wall_s_per_example": statistics.median(wall[name]),
                   "examples_per_s": 1.0 / statistics.median(wall[name]),
                   "examples_per_cpu_s": 1.0 / statistics.median(cpu[name]),
                   "rounds_cpu_s_per_example": cpu[name],
                   "rounds_wall_s_per_example": wall[name]} for name in methods}, keras_jit


def memory(args):
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        for label, baseline, k in ((A, False, args.mem_k), (E, True, 1)):
            cfg = config_from_dict({"model": {"width": args.width}, "batch_size": args.mem_batch,
                                    "subdivisions": k, "baseline": baseline})
            path = Path(scratch) / "cfg.yaml"
            path.write_text(cfg.to_yaml())
            out = subprocess.run([sys.executable, "-m", "accum_train.bench", str(path), str(k), "2"],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"memory worker for {label} failed ({out.returncode}):\n{out.stderr[-3000:]}")
            rows[label] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


# name: (target, True where a higher value is better for accum-train)
TARGETS = {
    "a/b examples per CPU-second": (">= 1.10", True),
    "a/b examples per wall-second": (None, True),
    "a/c examples per second": (">= 1.00", True),
    "a/d CPU time per example": ("<= 1.03", False),
    "a/e TF allocator peak": ("<= 0.125", False),
}


def shown(value, higher_is_better):
    """3 decimals, rounded against accum-train: never up where up flatters it."""
    rounding = ROUND_FLOOR if higher_is_better else ROUND_CEILING
    return str(Decimal(repr(value)).quantize(Decimal("0.001"), rounding=rounding))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=float, default=0.125)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=20,
                        help="updates per method per round (for (b): one fit over this many updates)")
    parser.add_argument("--mem-batch", type=int, default=4096)
    parser.add_argument("--mem-k", type=int, default=16)
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args()

    from accum_train.datasets import fashion_mnist
    data = fashion_mnist.load(train_limit=args.k * args.micro)
    x = data.train.images[..., None].astype(np.float32) / 255.0
    y = data.train.labels.astype(np.int32)

    load_before = os.getloadavg()
    started = time.perf_counter()
    times, keras_jit = time_methods(args, x, y)
    print(f"time: seed convnet x{args.width}, k={args.k}, micro-batch {args.micro}, {args.rounds} rounds x "
          f"{args.updates} updates per method (one fit per round for (b), (b')), medians; keras jit_compile "
          f"resolved to {keras_jit[B]}")
    print(f"{'method':<27} {'CPU ms/example':>15} {'wall ms/example':>16} {'examples/s':>11}")
    for name, r in times.items():
        print(f"{name:<27} {1000 * r['cpu_s_per_example']:>15.3f} {1000 * r['wall_s_per_example']:>16.3f} "
              f"{r['examples_per_s']:>11.0f}")
    a = times[A]
    best_cpu = min((B, B_SPE), key=lambda name: times[name]["cpu_s_per_example"])
    best_wall = min((B, B_SPE), key=lambda name: times[name]["wall_s_per_example"])
    ratios = {
        "a/b examples per CPU-second": a["examples_per_cpu_s"] / times[best_cpu]["examples_per_cpu_s"],
        "a/b examples per wall-second": a["examples_per_s"] / times[best_wall]["examples_per_s"],
        "a/c examples per second": a["examples_per_s"] / times[C]["examples_per_s"],
        "a/d CPU time per example": a["cpu_s_per_example"] / times[D]["cpu_s_per_example"],
    }
    details = {
        "a/b examples per CPU-second, (b) compile defaults": a["examples_per_cpu_s"] / times[B]["examples_per_cpu_s"],
        "a/b examples per CPU-second, (b') spe=k": a["examples_per_cpu_s"] / times[B_SPE]["examples_per_cpu_s"],
        "a/b examples per wall-second, (b) compile defaults": a["examples_per_s"] / times[B]["examples_per_s"],
        "a/b examples per wall-second, (b') spe=k": a["examples_per_s"] / times[B_SPE]["examples_per_s"],
    }
    timing_s = time.perf_counter() - started
    mem = memory(args)
    ratios["a/e TF allocator peak"] = (mem[A]["peak_memory_bytes"] / mem[E]["peak_memory_bytes"])
    print(f"\nmemory: batch {args.mem_batch}, (a) at k={args.mem_k} vs (e) one pass, fresh process each")
    for name, r in mem.items():
        print(f"{name:<27} TF allocator peak {r['peak_memory_bytes'] / 2**20:>7.0f} MiB, "
              f"peak RSS {r['peak_rss_bytes'] / 2**20:>6.0f} MiB")
    print(f"\nratios, 3 decimals rounded against accum-train (full precision in the JSON); "
          f"a/b against the faster Keras: CPU {best_cpu}, wall {best_wall}")
    print(f"  {'ratio':<32} {'target':>8} {'measured':>9}  full precision")
    for name, value in ratios.items():
        target, higher = TARGETS[name]
        print(f"  {name:<32} {target or '-':>8} {shown(value, higher):>9}  {value!r}")
    for name, value in details.items():
        print(f"  {name:<50} {shown(value, True):>9}  {value!r}")
    if args.output:
        args.output.write_text(json.dumps({
            "args": {k: str(v) for k, v in vars(args).items()},
            "environment": {"tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__,
                            "python": platform.python_version(), "cpus": os.cpu_count(),
                            "load_average_before": load_before, "timing_wall_s": timing_s,
                            "keras_jit_compile": keras_jit},
            "time": times, "memory": mem, "ratios": ratios, "ratios_a_b_per_keras_variant": details,
            "a_b_against": {"cpu": best_cpu, "wall": best_wall},
            "targets": {name: {"target": t, "higher_is_better": h} for name, (t, h) in TARGETS.items()},
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
