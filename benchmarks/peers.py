"""accum-train's engine side by side with what users would use instead.

One run, interleaved rounds, ratios printed. Methods, all on the seed convnet
(scaled by --width; a Keras-layer twin and a raw-op TF1 twin where a peer
needs its own), the same Fashion-MNIST batch and the same micro-batch:

  (a)  accum-train: Accumulator, one graph call per update, with the
       micro-steps in flight and the thread pools accum-train itself chooses
       (runtime.py: on this CPU two micro-steps at once, one thread per op)
  (a1) the same, one micro-step at a time, TensorFlow's default threads
  (a1') (a1) under (a)'s thread pools (TF_NUM_INTRAOP_THREADS and
       TF_NUM_INTEROP_THREADS, which a run leaves to rule), the twin of (b'')
  (b)  Keras 3: Adam(gradient_accumulation_steps=k) with model.fit, compile
       defaults (jit_compile="auto", steps_per_execution=1)
  (b') the same with steps_per_execution=k: one graph call per k micro-steps,
       i.e. per update, like (a)
  (b'') (b') under (a)'s thread pools, in case they suit Keras too
  (b''') (b') compiled with jit_compile=True: XLA, which compile's default
       ("auto") leaves off on a CPU and which can make Keras faster there
  (c)  the seed's TF1 pattern: graph + Session, accumulate op run once per
       micro-batch through feed_dict, then the apply op
  (d)  plain training at the micro-batch size (the cost floor)
  (e)  one pass over the whole batch (the memory ceiling)

Time: every method lives in its own process (thread pools are fixed per
process), built and warmed up once; each round then asks every process in turn
for --updates updates, each in its idiomatic form: (a), (c), (d), (e) a Python loop of --updates updates; (b) and
(b') ONE model.fit call per round (epochs=1, batch_size=micro-batch, graph
mode) over --updates copies of the batch, i.e. --updates x k micro-batches,
so that fit's per-call setup (data adapter, iterator, callbacks) is paid once
per round, as in training, and not once per update. The number of optimizer
updates each fit made is checked (optimizer.iterations, which Keras keeps at
micro-steps // k). Every method is warmed up with one untimed round
(tracing). CPU and wall time per example are the medians over rounds. Memory: (a) at k=--mem-k and (e) on a batch of
--mem-batch, each in a fresh process (accum_train.bench), TF allocator peak
over the timed updates.

Paired rounds: every timed ratio is also taken round by round (round r of
one method against round r of the other: they ran in the same round, one
after the other) and reported as the median of those per-round ratios with a
distribution-free 95% interval for it (benchmarks/paired.py; --rounds
defaults to 6, the fewest whose interval reaches 95%). A target is met when
that median meets it; a parity target (>= 1.00) also when the interval
contains 1. The memory ratios are single measurements.

Ratios are kept at full precision in the JSON (--output) and printed with 3
decimals rounded against accum-train (down where higher is better for it, up
where lower is better), so the display never flatters it. The a/b ratios are
taken against the fastest of (b), (b'), (b'') and (b''').

    python benchmarks/peers.py --output docs/peers.json   # the README's figures
    python benchmarks/peers.py --rounds 3 --updates 5 --mem-batch 1024   # quicker, no 95% interval

peers_keras.py runs (a), (a1) and the Keras variants on the user's own model
(a keras_file) with this machinery.
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
import paired
import provenance  # benchmarks/ is on sys.path: this script runs from there
import tensorflow as tf
from accum_train.backends.tensorflow.builtin import SEED_STRIDES
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.backends.tensorflow.objective import sparse_softmax_loss
from accum_train.config import ModelConfig, OptimizerConfig, config_from_dict
from accum_train.from_config.build import parallel_micro_steps
from accum_train.from_config.optim import make_optimizer
from accum_train.models import SEED_CHANNELS, build_model
from accum_train.trainer.data.feed import held
from accum_train.trainer.runtime import child_environment, thread_pools
from tables import fastest, interval

LR = 0.001
INPUT_SHAPE, NUM_CLASSES = (28, 28, 1), 10  # Fashion-MNIST; the Keras and TF1 twins hard-code them too


def channels(width):
    return [max(1, round(c * width)) for c in SEED_CHANNELS]


# Each method factory returns run(updates): that many optimizer updates on its
# batch, in the method's idiomatic form, returning when the work is done.

# ---------------------------------------------------------------- (a), (d), (e)


def ours(model_cfg, k, x, y, plain=False, parallel=1):
    model = build_model(model_cfg, 0, INPUT_SHAPE, NUM_CLASSES)
    opt = make_optimizer(OptimizerConfig(learning_rate=LR), LR, model.trainable_variables)
    loss_fn = sparse_softmax_loss(model.forward)
    if plain:
        engine = Accumulator(
            loss_fn, model.trainable_variables, opt, clip_norm=None, norm_layers=model.norm_layers, one_pass=True
        )
    else:
        engine = Accumulator(
            loss_fn, model.trainable_variables, opt, subdivisions=k, norm_layers=model.norm_layers, parallel=parallel
        )

    def run(updates):  # a training loop over the batch's pipeline: one engine call per update, the loss read back
        iterator, n, pulls, size = held(engine, (x, y), updates=updates)
        for _ in range(updates):
            float(engine.update_from(iterator, n, pulls, 0, size, held=True)["loss"])

    return run


# ---------------------------------------------------------------- (b), (b')


def keras_twin(width):
    layers = [keras.Input(INPUT_SHAPE)]
    for c, s in zip(channels(width), SEED_STRIDES):
        layers += [
            keras.layers.Conv2D(c, 3, s, padding="same", use_bias=False),
            keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5),
            keras.layers.LeakyReLU(negative_slope=0.2),
        ]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(NUM_CLASSES)]
    return keras.Sequential(layers)


class KerasAccumulation:
    """model.fit with Adam(gradient_accumulation_steps=k): one fit call per round. ``network()`` gives the
    uncompiled Keras model (the seed net's twin here, the user's file in peers_keras.py)."""

    def __init__(self, network, k, micro, x, y, updates, steps_per_execution=1, jit_compile="auto"):
        keras.utils.set_random_seed(0)
        self.model = network()
        self.model.compile(
            optimizer=keras.optimizers.Adam(LR, gradient_accumulation_steps=k),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps_per_execution,
            jit_compile=jit_compile,
        )
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
                session.run(accumulate, {x: xs[i * micro : (i + 1) * micro], y: ys[i * micro : (i + 1) * micro]})
            session.run(apply_and_clear)

    return run


# ---------------------------------------------------------------- timing

A, A1, A1_T, B, B_SPE, B_SPE_T, B_XLA, C, D, E = (
    "(a) accum-train",
    "(a1) accum-train, 1 at a time",
    "(a1') accum-train, 1 at a time, threads",
    "(b) keras GA, fit",
    "(b') keras GA, fit, spe=k",
    "(b'') keras GA, spe=k, threads",
    "(b''') keras GA, spe=k, XLA",
    "(c) tf1 session",
    "(d) plain, micro-batch",
    "(e) plain, whole batch",
)
KERAS = (B, B_SPE, B_SPE_T, B_XLA)
ONE_AT_A_TIME = (A1, A1_T)


def ours_parallel(k):
    """The micro-steps in flight that accum-train's auto chooses for this k on this machine."""
    return parallel_micro_steps(config_from_dict({"batch_size": 1024, "subdivisions": k}))


def method_spec(args):
    """name: (thread pools or None for TensorFlow's defaults, examples per update)."""
    k, micro = args.k, args.micro
    ours_pools = thread_pools(ours_parallel(k))  # what threads.configure sets for (a)
    return {
        A: (ours_pools, k * micro),
        A1: (None, k * micro),
        A1_T: (ours_pools, k * micro),
        B: (None, k * micro),
        B_SPE: (None, k * micro),
        B_SPE_T: (ours_pools, k * micro),
        B_XLA: (None, k * micro),
        C: (None, k * micro),
        D: (None, micro),
        E: (None, k * micro),
    }


def build_method(name, args, x, y):
    k, micro, updates = args.k, args.micro, args.updates
    batch = k * micro
    seed_net = ModelConfig(width=args.width)
    if name == A:
        return ours(seed_net, k, x[:batch], y[:batch], parallel=ours_parallel(k))
    if name in ONE_AT_A_TIME:
        return ours(seed_net, k, x[:batch], y[:batch], parallel=1)
    if name in KERAS:
        return KerasAccumulation(
            lambda: keras_twin(args.width),
            k,
            micro,
            x[:batch],
            y[:batch],
            updates,
            steps_per_execution=1 if name == B else k,
            jit_compile=True if name == B_XLA else "auto",
        )
    if name == C:
        return tf1_session(args.width, k, micro, x[:batch], y[:batch])
    if name == D:
        return ours(seed_net, 1, x[:micro], y[:micro], plain=True)
    return ours(seed_net, 1, x[:batch], y[:batch], plain=True)


def serve(run, updates):
    """The child: warm up one built method, then time one round per 'run' line on stdin.

    Each method lives in its own process so that it runs under its own thread pools (fixed per
    process), while the parent still interleaves the methods round by round."""
    run(updates)  # warm-up: tracing, graph building
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        c0, w0 = time.process_time(), time.perf_counter()
        run(updates)
        print(json.dumps({"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0}), flush=True)
    final = {"done": True}
    if isinstance(run, KerasAccumulation):
        final.update(optimizer_updates=run.optimizer_updates(), jit_compile=bool(run.model.jit_compile))
    print(json.dumps(final), flush=True)


def time_methods(args, spec, keras_names=KERAS, script=__file__, shared_args=("width", "k", "micro", "updates")):
    """Per method of ``spec`` (see method_spec), the medians over args.rounds interleaved rounds; each
    method served by ``script --serve NAME`` with the ``shared_args`` of args, in its own process.
    ``keras_names`` are the KerasAccumulation methods, whose number of optimizer updates is checked."""
    children = {}
    for name in spec:  # started one at a time: each warms up while the others wait
        argv = [sys.executable, script, "--serve", name] + [
            f"--{key.replace('_', '-')}={value}" for key, value in vars(args).items() if key in shared_args
        ]
        # through the environment, read when the child's runtime starts (TensorLayer's import already runs ops)
        child = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_environment(spec[name][0])
        )
        if not json.loads(_last_json(child)).get("ready"):
            raise RuntimeError(f"{name}: the timing process did not start")
        children[name] = child
    cpu = {name: [] for name in spec}
    wall = {name: [] for name in spec}
    for _ in range(args.rounds):
        for name, child in children.items():
            child.stdin.write("run\n")
            child.stdin.flush()
            sample = json.loads(_last_json(child))
            n = spec[name][1]
            cpu[name].append(sample["cpu"] / (args.updates * n))
            wall[name].append(sample["wall"] / (args.updates * n))
    finals = {}
    for name, child in children.items():
        child.stdin.write("quit\n")
        child.stdin.flush()
        finals[name] = json.loads(_last_json(child))
        child.wait()
    for name in keras_names:
        expected = (args.rounds + 1) * args.updates
        if finals[name]["optimizer_updates"] != expected:
            raise RuntimeError(f"{name}: {finals[name]['optimizer_updates']} optimizer updates in all, not {expected}")
    keras_jit = {name: finals[name]["jit_compile"] for name in keras_names}
    return {
        name: {
            "cpu_s_per_example": statistics.median(cpu[name]),
            "wall_s_per_example": statistics.median(wall[name]),
            "examples_per_s": 1.0 / statistics.median(wall[name]),
            "examples_per_cpu_s": 1.0 / statistics.median(cpu[name]),
            "threads": spec[name][0] or "tensorflow defaults",
            "rounds_cpu_s_per_example": cpu[name],
            "rounds_wall_s_per_example": wall[name],
            # Keras: the optimizer updates its fits made in all (warm-up included), checked above
            **({"optimizer_updates": finals[name]["optimizer_updates"]} if name in keras_names else {}),
        }
        for name in spec
    }, keras_jit


def _last_json(child) -> str:
    line = child.stdout.readline()
    if not line:
        child.wait()
        raise RuntimeError(f"a timing process ended early (exit code {child.returncode})")
    return line


def memory(args):
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        # (a1): accum-train with one micro-step at a time (what auto chooses with a GPU, and the least
        # memory); (a): auto on this machine (on a CPU, two at once: two micro-batches of activations).
        for label, baseline, k, parallel in (
            (A1, False, args.mem_k, 1),
            (A, False, args.mem_k, "auto"),
            (E, True, 1, "auto"),
        ):
            cfg = config_from_dict(
                {
                    "model": {"width": args.width},
                    "batch_size": args.mem_batch,
                    "subdivisions": k,
                    "baseline": baseline,
                    "parallel_micro_steps": parallel,
                }
            )
            path = Path(scratch) / "cfg.yaml"
            path.write_text(cfg.to_yaml())
            out = subprocess.run(
                [sys.executable, "-m", "accum_train.bench", str(path), str(k), "2"], capture_output=True, text=True
            )
            if out.returncode != 0:
                raise SystemExit(f"memory worker for {label} failed ({out.returncode}):\n{out.stderr[-3000:]}")
            rows[label] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


# name: (target, True where a higher value is better for accum-train)
TARGETS = {
    "a/b examples per CPU-second": (">= 1.5", True),
    "a/b examples per wall-second": (">= 2.0", True),
    "a/c examples per second": (">= 1.00", True),
    "a/d CPU time per example": ("<= 1.03", False),
    "a1/e TF allocator peak": ("<= 0.15", False),
    "a/e TF allocator peak": (None, False),
}


def shown(value, higher_is_better):
    """3 decimals, rounded against accum-train: never up where up flatters it."""
    rounding = ROUND_FLOOR if higher_is_better else ROUND_CEILING
    return str(Decimal(repr(value)).quantize(Decimal("0.001"), rounding=rounding))


def fashion_mnist_batch(n):
    """The first n Fashion-MNIST training images (float32 in [0, 1], NHWC) and labels: every method's data."""
    from accum_train.datasets import fashion_mnist

    data = fashion_mnist.load(train_limit=n)
    return data.train.images[..., None].astype(np.float32) / 255.0, data.train.labels.astype(np.int32)


def print_times(times):
    print(f"{'method':<31} {'CPU ms/example':>15} {'wall ms/example':>16} {'examples/s':>11}  threads")
    for name, r in times.items():
        threads = (
            r["threads"]
            if isinstance(r["threads"], str)
            else f"intra {r['threads']['intra']}, inter {r['threads']['inter']}"
        )
        print(
            f"{name:<31} {1000 * r['cpu_s_per_example']:>15.3f} {1000 * r['wall_s_per_example']:>16.3f} "
            f"{r['examples_per_s']:>11.0f}  {threads}"
        )


def against_keras(times):
    """(a) and one micro-step at a time against Keras: the two a/b ratios against the fastest Keras variant,
    taken separately by CPU and by wall time; the ratios against each variant; the fastest variants (cpu, wall);
    the faster of (a1) and (a1') by each measure (one at a time, each side under the pools that suit it best)."""
    a = times[A]
    one, keras_best = fastest(times, ONE_AT_A_TIME), fastest(times, KERAS)
    best_cpu, best_wall = keras_best["cpu"], keras_best["wall"]
    headline = {
        "a/b examples per CPU-second": a["examples_per_cpu_s"] / times[best_cpu]["examples_per_cpu_s"],
        "a/b examples per wall-second": a["examples_per_s"] / times[best_wall]["examples_per_s"],
    }
    details = {
        "a/b examples per CPU-second, (b) compile defaults": a["examples_per_cpu_s"] / times[B]["examples_per_cpu_s"],
        "a/b examples per CPU-second, (b') spe=k": a["examples_per_cpu_s"] / times[B_SPE]["examples_per_cpu_s"],
        "a/b examples per wall-second, (b) compile defaults": a["examples_per_s"] / times[B]["examples_per_s"],
        "a/b examples per wall-second, (b') spe=k": a["examples_per_s"] / times[B_SPE]["examples_per_s"],
        "a/b examples per CPU-second, (b'') spe=k, threads": a["examples_per_cpu_s"]
        / times[B_SPE_T]["examples_per_cpu_s"],
        "a/b examples per wall-second, (b'') spe=k, threads": a["examples_per_s"] / times[B_SPE_T]["examples_per_s"],
        "a/b examples per CPU-second, (b''') spe=k, XLA": a["examples_per_cpu_s"] / times[B_XLA]["examples_per_cpu_s"],
        "a/b examples per wall-second, (b''') spe=k, XLA": a["examples_per_s"] / times[B_XLA]["examples_per_s"],
        "a1/b examples per wall-second (one micro-step at a time)": times[one["wall"]]["examples_per_s"]
        / times[best_wall]["examples_per_s"],
        "a1/b examples per CPU-second (one micro-step at a time)": times[one["cpu"]]["examples_per_cpu_s"]
        / times[best_cpu]["examples_per_cpu_s"],
    }
    return headline, details, (best_cpu, best_wall), one


def paired_against_keras(times, against, one):
    """against_keras' ratios (the same keys and methods: ``against`` the fastest Keras variants (cpu, wall),
    ``one`` the faster one-at-a-time by each measure), each taken round by round (paired.py)."""
    best_cpu, best_wall = against
    headline = {
        "a/b examples per CPU-second": paired.per_round(times, A, best_cpu, "cpu"),
        "a/b examples per wall-second": paired.per_round(times, A, best_wall, "wall"),
    }
    variants = {"(b) compile defaults": B, "(b') spe=k": B_SPE, "(b'') spe=k, threads": B_SPE_T}
    variants["(b''') spe=k, XLA"] = B_XLA
    details = {
        f"a/b examples per {unit}-second, {variant}": paired.per_round(times, A, name, measure)
        for measure, unit in (("cpu", "CPU"), ("wall", "wall"))
        for variant, name in variants.items()
    }
    details["a1/b examples per wall-second (one micro-step at a time)"] = paired.per_round(
        times, one["wall"], best_wall, "wall"
    )
    details["a1/b examples per CPU-second (one micro-step at a time)"] = paired.per_round(
        times, one["cpu"], best_cpu, "cpu"
    )
    return headline, details


def print_details(details, paired_details):
    """One line per ratio: rounded against accum-train, the paired rounds' median [95% interval], full precision."""
    for name, value in details.items():
        print(f"  {name:<58} {shown(value, True):>9}  {interval(paired_details[name], True):<24} {value!r}")


def environment(load_before, timing_s, keras_jit):
    return {
        **provenance.machine(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "load_average_before": load_before,
        "timing_wall_s": timing_s,
        "keras_jit_compile": keras_jit,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=float, default=0.125)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument(
        "--rounds", type=int, default=paired.ROUNDS, help="interleaved timed rounds (6: the fewest for a 95%% interval)"
    )
    parser.add_argument(
        "--updates", type=int, default=20, help="updates per method per round (for (b): one fit over this many updates)"
    )
    parser.add_argument("--mem-batch", type=int, default=4096)
    parser.add_argument("--mem-k", type=int, default=16)
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # a timing child: see serve()
    args = parser.parse_args()

    if args.serve:
        x, y = fashion_mnist_batch(args.k * args.micro)
        return serve(build_method(args.serve, args, x, y), args.updates)

    load_before = os.getloadavg()
    started = time.perf_counter()
    times, keras_jit = time_methods(args, method_spec(args))
    print(
        f"time: seed convnet x{args.width}, k={args.k}, micro-batch {args.micro}, {args.rounds} rounds x "
        f"{args.updates} updates per method (one fit per round for Keras), each method in its own process, "
        f"medians; keras jit_compile resolved to {keras_jit[B]}"
    )
    print_times(times)
    a = times[A]
    ratios, details, (best_cpu, best_wall), one = against_keras(times)
    ratios["a/c examples per second"] = a["examples_per_s"] / times[C]["examples_per_s"]
    ratios["a/d CPU time per example"] = a["cpu_s_per_example"] / times[D]["cpu_s_per_example"]
    paired_ratios, paired_details = paired_against_keras(times, (best_cpu, best_wall), one)
    paired_ratios["a/c examples per second"] = paired.per_round(times, A, C, "wall")
    paired_ratios["a/d CPU time per example"] = paired.paired_ratio(
        a["rounds_cpu_s_per_example"], times[D]["rounds_cpu_s_per_example"]
    )
    timing_s = time.perf_counter() - started
    mem = memory(args)
    ratios["a1/e TF allocator peak"] = mem[A1]["peak_memory_bytes"] / mem[E]["peak_memory_bytes"]
    ratios["a/e TF allocator peak"] = mem[A]["peak_memory_bytes"] / mem[E]["peak_memory_bytes"]
    print(f"\nmemory: batch {args.mem_batch}, (a1) and (a) at k={args.mem_k} vs (e) one pass, fresh process each")
    for name, r in mem.items():
        print(
            f"{name:<31} TF allocator peak {r['peak_memory_bytes'] / 2**20:>7.0f} MiB, "
            f"peak RSS {r['peak_rss_bytes'] / 2**20:>6.0f} MiB"
        )
    met = {}
    for name, value in ratios.items():  # a memory ratio is one measurement: its own median and bounds
        target = TARGETS[name][0]
        if target:
            met[name] = paired.reaches(target, paired_ratios.get(name, {"median": value, "low": value, "high": value}))
    confidence = paired_ratios["a/b examples per CPU-second"]["confidence"]
    print(
        f"\nratios, 3 decimals rounded against accum-train (full precision in the JSON); "
        f"a/b against the faster Keras: CPU {best_cpu}, wall {best_wall}. Each: the ratio of the medians above, then "
        f"the median of the {args.rounds} per-round ratios [its interval, {100 * confidence:.2f}% coverage]"
    )
    print(f"  {'ratio':<32} {'target':>8} {'medians':>9}  {'paired rounds':<24} {'verdict':<8} full precision")
    for name, value in ratios.items():
        target, higher = TARGETS[name]
        rounds = interval(paired_ratios[name], higher) if name in paired_ratios else "- (one measurement)"
        verdict = ("met" if met[name] else "NOT met") if name in met else "-"
        print(f"  {name:<32} {target or '-':>8} {shown(value, higher):>9}  {rounds:<24} {verdict:<8} {value!r}")
    print(f"  (verdict: {paired.RULE})")
    print_details(details, paired_details)
    if args.output:
        args.output.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "environment": environment(load_before, timing_s, keras_jit),
                    "time": times,
                    "memory": mem,
                    "ratios": ratios,
                    "ratios_a_b_per_keras_variant": details,
                    "a_b_against": {"cpu": best_cpu, "wall": best_wall},
                    "a1_best": one,
                    "targets": {name: {"target": t, "higher_is_better": h} for name, (t, h) in TARGETS.items()},
                    # each timed ratio round by round: median, 95% interval, per-round ratios (paired.py)
                    "paired_ratios": paired_ratios,
                    "paired_ratios_a_b_per_keras_variant": paired_details,
                    "met": met,
                    "met_rule": paired.RULE,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
