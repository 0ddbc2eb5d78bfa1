"""accum-train's engine side by side with what users would use instead.

One run, interleaved rounds, ratios printed. Methods, all on the seed convnet
(scaled by --width; a Keras-layer twin and a raw-op TF1 twin where a peer
needs its own), the same Fashion-MNIST batch and the same micro-batch:

  (a) accum-train: AccumulatingUpdate, one graph call per update
  (b) Keras 3: Adam(gradient_accumulation_steps=k) with model.fit
  (c) the seed's TF1 pattern: graph + Session, accumulate op run once per
      micro-batch through feed_dict, then the apply op
  (d) plain training at the micro-batch size (the cost floor)
  (e) one pass over the whole batch (the memory ceiling)

Time: each round runs --updates updates of every method in turn; CPU and wall
time per example are the medians over rounds. Memory: (a) at k=--mem-k and (e)
on a batch of --mem-batch, each in a fresh process (accum_train.bench), TF
allocator peak over the timed updates.

    python benchmarks/peers.py                    # the README's figures
    python benchmarks/peers.py --rounds 3 --updates 3 --mem-batch 1024   # quicker
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
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


def channels(width):
    return [max(1, round(c * width)) for c in SEED_CHANNELS]


# ---------------------------------------------------------------- (a), (d), (e)

def ours(width, k, plain=False):
    model = build_model(ModelConfig(width=width), seed=0)
    for layer in model.norm_layers:
        layer.deferred = True
    opt = make_optimizer(OptimizerConfig(learning_rate=LR), LR, model.trainable_variables)
    loss_fn = sparse_softmax_loss(model.forward)
    if plain:
        engine = PlainUpdate(loss_fn, model.trainable_variables, opt, None, model.norm_layers)
    else:
        engine = AccumulatingUpdate(loss_fn, model.trainable_variables, opt, k, None, model.norm_layers)

    def step(x, y):
        float(engine.update(tf.constant(x), tf.constant(y))["loss"])
    return step


# ---------------------------------------------------------------- (b)

def keras_twin(width):
    layers = [keras.Input((28, 28, 1))]
    for c, s in zip(channels(width), SEED_STRIDES):
        layers += [keras.layers.Conv2D(c, 3, s, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5),
                   keras.layers.LeakyReLU(negative_slope=0.2)]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    return keras.Sequential(layers)


def keras_accumulation(width, k, micro):
    keras.utils.set_random_seed(0)
    model = keras_twin(width)
    model.compile(optimizer=keras.optimizers.Adam(LR, gradient_accumulation_steps=k),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def step(x, y):  # x holds k micro-batches: one optimizer update
        model.fit(x, y, batch_size=micro, epochs=1, verbose=0, shuffle=False)
    return step


# ---------------------------------------------------------------- (c)

def tf1_session(width, k, micro):
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

    def step(xs, ys):
        for i in range(k):
            session.run(accumulate, {x: xs[i * micro:(i + 1) * micro], y: ys[i * micro:(i + 1) * micro]})
        session.run(apply_and_clear)
    return step


# ---------------------------------------------------------------- timing

def time_methods(args, x, y):
    k, micro = args.k, args.micro
    batch = k * micro
    methods = {
        "(a) accum-train": (ours(args.width, k), batch),
        "(b) keras grad_accum": (keras_accumulation(args.width, k, micro), batch),
        "(c) tf1 session": (tf1_session(args.width, k, micro), batch),
        "(d) plain, micro-batch": (ours(args.width, 1, plain=True), micro),
        "(e) plain, whole batch": (ours(args.width, 1, plain=True), batch),
    }
    for name, (step, n) in methods.items():  # warm up: tracing, graph building
        for _ in range(2):
            step(x[:n], y[:n])
    cpu = {name: [] for name in methods}
    wall = {name: [] for name in methods}
    for _ in range(args.rounds):
        for name, (step, n) in methods.items():
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(args.updates):
                step(x[:n], y[:n])
            cpu[name].append((time.process_time() - c0) / (args.updates * n))
            wall[name].append((time.perf_counter() - w0) / (args.updates * n))
    return {name: {"cpu_s_per_example": statistics.median(cpu[name]),
                   "wall_s_per_example": statistics.median(wall[name]),
                   "examples_per_s": 1.0 / statistics.median(wall[name]),
                   "examples_per_cpu_s": 1.0 / statistics.median(cpu[name])} for name in methods}


def memory(args):
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        for label, baseline, k in (("(a) accum-train", False, args.mem_k), ("(e) plain, whole batch", True, 1)):
            cfg = config_from_dict({"model": {"width": args.width}, "batch_size": args.mem_batch,
                                    "subdivisions": k, "baseline": baseline})
            path = Path(scratch) / "cfg.yaml"
            path.write_text(cfg.to_yaml())
            out = subprocess.run([sys.executable, "-m", "accum_train.bench", str(path), str(k), "2"],
                                 capture_output=True, text=True, check=True)
            rows[label] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=float, default=0.125)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=5, help="updates per method per round")
    parser.add_argument("--mem-batch", type=int, default=4096)
    parser.add_argument("--mem-k", type=int, default=16)
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args()

    from accum_train.datasets import fashion_mnist
    data = fashion_mnist.load(train_limit=args.k * args.micro)
    x = data.train.images[..., None].astype(np.float32) / 255.0
    y = data.train.labels.astype(np.int32)

    times = time_methods(args, x, y)
    print(f"time: seed convnet x{args.width}, k={args.k}, micro-batch {args.micro}, "
          f"{args.rounds} rounds x {args.updates} updates, medians (keras jit_compile default)")
    print(f"{'method':<26} {'CPU ms/example':>15} {'wall ms/example':>16} {'examples/s':>11}")
    for name, r in times.items():
        print(f"{name:<26} {1000 * r['cpu_s_per_example']:>15.3f} {1000 * r['wall_s_per_example']:>16.3f} "
              f"{r['examples_per_s']:>11.0f}")
    a = times["(a) accum-train"]
    ratios = {
        "a/b examples per CPU-second": a["examples_per_cpu_s"] / times["(b) keras grad_accum"]["examples_per_cpu_s"],
        "a/c examples per second": a["examples_per_s"] / times["(c) tf1 session"]["examples_per_s"],
        "a/d CPU time per example": a["cpu_s_per_example"] / times["(d) plain, micro-batch"]["cpu_s_per_example"],
    }
    mem = memory(args)
    ratios["a/e TF allocator peak"] = (mem["(a) accum-train"]["peak_memory_bytes"]
                                       / mem["(e) plain, whole batch"]["peak_memory_bytes"])
    print(f"\nmemory: batch {args.mem_batch}, (a) at k={args.mem_k} vs (e) one pass, fresh process each")
    for name, r in mem.items():
        print(f"{name:<26} TF allocator peak {r['peak_memory_bytes'] / 2**20:>7.0f} MiB, "
              f"peak RSS {r['peak_rss_bytes'] / 2**20:>6.0f} MiB")
    print("\nratios (targets: a/b >= 1.10, a/c >= 1.00, a/d <= 1.03, a/e <= 0.125)")
    for name, value in ratios.items():
        print(f"  {name:<30} {value:.3f}")
    if args.output:
        args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                           "time": times, "memory": mem, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
