"""accum_train.fit beside Keras 3's own accumulation on a masked sequence model.

The model, built the same way from the same seed for every method:
keras.Input((None,), int32) -> Embedding(V, E, mask_zero=True) -> LSTM(H,
return_sequences=True) -> Dense(C) per token (logits), compiled with
SparseCategoricalCrossentropy(from_logits=True) and no metric. The data is
synthetic (numpy, fixed seed, no download): token ids in 1..V-1, each sequence
padded with 0 after a length drawn uniformly from [4, T], so that batches hold
very different numbers of valid tokens; a target in 0..C-1 per token, the
arrays T steps long. The model takes any length, so that (c) and (g) can give
it shorter micro-batches; every method runs the same model. Every method gets
the same micro-batch (--micro), k (--k, batch = k x micro), Adam learning rate
(--lr) and number of updates per round (--updates):

  (a)  accum-train: the model compiled with Adam(lr), then ONE
       accum_train.fit(model, x, y, batch_size=k*micro, subdivisions=k,
       epochs=1, shuffle=False, verbose=0) per round over the round's
       updates x k x micro examples (one call = --updates updates)
  (a') the same compiled with jit_compile=True: accum_train.fit then runs
       each micro-step's forward and backward pass as one XLA cluster
  (c), (c') (a) and (a') with trim_padding=True: each batch's sequences
       ordered by length, each micro-batch cut after its longest sequence
       (rounded up to a multiple of 16 steps); the same updates
  (b)  Keras 3: compiled with Adam(lr, gradient_accumulation_steps=k), ONE
       model.fit(x, y, batch_size=micro, epochs=1, shuffle=False, verbose=0)
       per round over the same examples, compile defaults (graph mode,
       jit_compile="auto", steps_per_execution=1)
  (b') the same with steps_per_execution=k: one graph call per update
  (b'') (b') compiled with jit_compile=True: XLA, which compile's default
       ("auto") leaves off on a CPU and which can run Keras' recurrent loop
       faster there
  (d)  no accumulation, for reference: compiled with Adam(lr) and
       jit_compile=True, ONE model.fit(x, y, batch_size=micro,
       steps_per_execution=k) per round, an optimizer step per micro-batch
       (k x --updates of them). What a micro-step costs Keras without
       accumulating: the micro-batch's forward and backward pass, which any
       accumulation of micro-batches run one after another pays too
  (g)  for reference, Keras' way to skip padding: (b'') fed by
       tf.data's bucket_by_sequence_length over the round's sequences
       (unpadded, in order), micro-batches of --micro from buckets 16 steps
       wide, each padded to its longest (cached, so that the bucketing is
       not timed). Other updates than every other method's: each gathers
       sequences of like length from across the data, not a batch in the
       data's order; the last micro-batch of a bucket may be short, so its
       micro-steps are a few more than k x --updates, counted and checked

Time: every method lives in its own process (started by this script with
--serve NAME), built and warmed up with one untimed round (tracing); the
parent then sends each process "go" in turn, --rounds times (interleaved:
(a) round 1, (b) round 1, (b') round 1, (a) round 2, ...), and each answers
with the CPU (time.process_time) and wall (time.perf_counter) seconds of its
training call. Medians over the rounds, per example. After every round the
number of optimizer updates is checked: Keras 3 (3.15) keeps
optimizer.iterations at micro-steps // k under gradient_accumulation_steps
(its private _iterations counts micro-steps, checked too), i.e. the number of
updates, and accum-train's optimizer counts updates. Thread pools: TensorFlow's
defaults for every method (no pool is set and TF_NUM_*_THREADS are cleared in
the children), unlike accum-train's CLI, which picks its own (1 intra-op and 2
inter-op threads on a 2-core CPU) for its engine.

The a/b ratios (examples per CPU-second, examples per wall-second) are the
fastest of (a), (a'), (c) and (c') against the fastest of (b), (b') and (b''),
by CPU and by wall time separately (each side in its best use of its options);
also without trim_padding (the faster of (a) and (a')), and against (g);
printed with 3 decimals rounded against accum-train (down: higher is better for
it), full precision in the JSON (--output). Each ratio is also taken round by
round, between the same two methods (round r of one against round r of the
other: they ran in the same round, one after the other), and reported as the
median of those per-round ratios with a distribution-free 95% interval for it
(benchmarks/paired.py; --rounds defaults to 6, the fewest whose interval
reaches 95%), in the JSON's paired_* keys.

Distance from whole-batch training (the exactness part, not timed, in its own
process before the timing ones start): from the same initial weights and data
order (shuffle=False), --distance-updates updates with SGD(--distance-lr) of
  (i)   plain Keras model.fit(batch_size=k*micro): the oracle
  (ii)  accum_train.fit(batch_size=k*micro, subdivisions=k), and the same
        with trim_padding=True
  (iii) Keras SGD(gradient_accumulation_steps=k), model.fit(batch_size=micro)
and the largest absolute weight difference of (ii) and (iii) from (i), also
relative to how far (i) moved the weights (max abs). SGD, not Adam: with Adam
on an Embedding, Keras' own whole-batch fit squares each token occurrence's
gradient separately (the gradient is a tf.IndexedSlices with repeated indices),
so it is no clean oracle there. --arrange uneven (the default) orders each
batch by length, longest first, so that its first micro-batch holds the most
valid tokens and its last the fewest: Keras' accumulation averages the k
micro-batch means, which is then not the whole batch's mean over tokens.

    python benchmarks/peers_masked.py --output docs/peers-masked.json
    python benchmarks/peers_masked.py --rounds 3 --updates 5   # quicker, no 95% interval
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import paired
import provenance  # benchmarks/ is on sys.path: this script runs from there
from tables import against, caption, fastest, interval, two_figures

A, A_XLA = "(a) accum-train", "(a') accum-train, XLA"
C, C_XLA = "(c) accum-train, trim_padding", "(c') accum-train, trim_padding, XLA"
B, B_SPE, B_XLA = "(b) keras GA, fit", "(b') keras GA, fit, spe=k", "(b'') keras GA, fit, spe=k, XLA"
D = "(d) keras plain, micro-batch, spe=k, XLA"
G = "(g) keras GA, bucketed by length, spe=k, XLA"
METHODS = (A, A_XLA, C, C_XLA, B, B_SPE, B_XLA, G, D)
OURS = (A, A_XLA, C, C_XLA)
TRIMMED = (C, C_XLA)
KERAS = (B, B_SPE, B_XLA)
DISTANCE = "distance"  # --serve distance: the exactness child
THREAD_ENV = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")  # cleared in the children: TF's defaults


# ---------------------------------------------------------------- data and model (numpy / Keras)


def make_data(n, args, arrange, lengths_too=False):
    """n sequences of token ids (0-padded after a length in [4, T]) and per-token targets, from args.seed.
    arrange="uneven": each batch of k x micro ordered longest first (its micro-batches' token counts fall).
    ``lengths_too``: (x, y, lengths)."""
    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(4, args.T + 1, n)
    x = rng.integers(1, args.V, (n, args.T)).astype(np.int32)
    y = rng.integers(0, args.C, (n, args.T)).astype(np.int32)
    if arrange == "uneven":
        batch = args.k * args.micro
        order = np.concatenate(
            [start + np.argsort(-lengths[start : start + batch], kind="stable") for start in range(0, n, batch)]
        )
        lengths, x, y = lengths[order], x[order], y[order]
    x[np.arange(args.T)[None, :] >= lengths[:, None]] = 0
    return (x, y, lengths) if lengths_too else (x, y)


def bucketed(x, y, lengths, args):
    """(g)'s data: tf.data's bucket_by_sequence_length over the round's examples in their order, micro-batches
    of --micro from buckets 16 steps wide, each padded to its longest sequence; and how many there are."""
    import tensorflow as tf

    def examples():
        for i in range(len(x)):
            yield x[i, : lengths[i]], y[i, : lengths[i]]

    spec = tf.TensorSpec([None], tf.int32)
    dataset = tf.data.Dataset.from_generator(examples, output_signature=(spec, spec)).bucket_by_sequence_length(
        lambda tokens, _: tf.shape(tokens)[0],
        bucket_boundaries=list(range(17, args.T + 1, 16)),
        bucket_batch_sizes=[args.micro] * len(range(17, args.T + 1, 16)) + [args.micro],
    )
    dataset = dataset.cache()  # the batches made once: what is timed is training on them
    count = sum(1 for _ in dataset)
    return dataset, count


def build_model(args):
    import keras

    keras.utils.set_random_seed(args.seed)
    tokens = keras.Input((None,), dtype="int32")  # any length: trim_padding's and (g)'s micro-batches are shorter
    h = keras.layers.Embedding(args.V, args.E, mask_zero=True)(tokens)
    h = keras.layers.LSTM(args.H, return_sequences=True)(h)
    logits = keras.layers.Dense(args.C)(h)
    return keras.Model(tokens, logits, name="masked_lstm")


def loss():
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def micro_steps(optimizer):
    """Keras' own micro-step counter (private: optimizer.iterations is it // k under accumulation)."""
    counter = getattr(optimizer, "_iterations", None)
    return None if counter is None else int(counter.numpy())


# ---------------------------------------------------------------- the children


def serve(name, args):
    """A timing child: build one method, warm it up with one untimed round, then time one round per 'go'."""
    import accum_train  # before TensorFlow: it sets the allocator mode TensorFlow reads at import
    import keras
    import tensorflow as tf

    k, micro = args.k, args.micro
    x, y = make_data(args.updates * k * micro, args, args.time_arrange)
    model = build_model(args)
    micro_batches = args.updates * k  # per round
    if name in OURS:
        jit = True if name in (A_XLA, C_XLA) else "auto"
        model.compile(optimizer=keras.optimizers.Adam(args.lr), loss=loss(), jit_compile=jit)
        trim = name in TRIMMED

        def run():
            accum_train.fit(
                model, x, y, batch_size=k * micro, subdivisions=k, epochs=1, shuffle=False, verbose=0, trim_padding=trim
            )

    elif name == G:
        model.compile(
            optimizer=keras.optimizers.Adam(args.lr, gradient_accumulation_steps=k),
            loss=loss(),
            steps_per_execution=k,
            jit_compile=True,
        )
        dataset, micro_batches = bucketed(*make_data(args.updates * k * micro, args, args.time_arrange, True), args)

        def run():
            model.fit(dataset, epochs=1, verbose=0)

    elif name == D:
        model.compile(optimizer=keras.optimizers.Adam(args.lr), loss=loss(), steps_per_execution=k, jit_compile=True)

        def run():
            model.fit(x, y, batch_size=micro, epochs=1, shuffle=False, verbose=0)

    else:
        model.compile(
            optimizer=keras.optimizers.Adam(args.lr, gradient_accumulation_steps=k),
            loss=loss(),
            steps_per_execution=1 if name == B else k,
            jit_compile=True if name == B_XLA else "auto",
        )

        def run():
            model.fit(x, y, batch_size=micro, epochs=1, shuffle=False, verbose=0)

    def counters():
        return {
            "optimizer_updates": int(model.optimizer.iterations.numpy()),
            "micro_steps": micro_steps(model.optimizer),
            "micro_batches": micro_batches,
        }

    w0 = time.perf_counter()
    run()  # warm-up: tracing, graph building
    print(json.dumps({"ready": True, "warmup_wall_s": time.perf_counter() - w0, **counters()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        c0, w0 = time.process_time(), time.perf_counter()
        run()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        print(json.dumps({"cpu": cpu, "wall": wall, **counters()}), flush=True)
    print(
        json.dumps(
            {
                "done": True,
                "jit_compile": bool(model.jit_compile),
                # 0: TensorFlow's default (as many threads as cores)
                "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
                "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            }
        ),
        flush=True,
    )


def distance(args):
    """The exactness child: (ii) accum-train and (iii) Keras GA against (i) whole-batch Keras, SGD."""
    import accum_train
    import keras
    import tensorflow as tf

    k, micro, updates = args.k, args.micro, args.distance_updates
    x, y = make_data(updates * k * micro, args, args.arrange)
    start = build_model(args).get_weights()

    def train(optimizer, fit):
        model = build_model(args)
        model.set_weights(start)
        model.compile(optimizer=optimizer, loss=loss())
        fit(model)
        if int(model.optimizer.iterations.numpy()) != updates:
            raise RuntimeError(f"{model.optimizer.iterations.numpy()} optimizer updates, not {updates}")
        return model.get_weights()

    SGD = keras.optimizers.SGD
    oracle = train(SGD(args.distance_lr), lambda m: m.fit(x, y, batch_size=k * micro, shuffle=False, verbose=0))
    ours = train(
        SGD(args.distance_lr),
        lambda m: accum_train.fit(m, x, y, batch_size=k * micro, subdivisions=k, shuffle=False, verbose=0),
    )
    trimmed = train(
        SGD(args.distance_lr),
        lambda m: accum_train.fit(
            m, x, y, batch_size=k * micro, subdivisions=k, shuffle=False, verbose=0, trim_padding=True
        ),
    )
    keras_ga = train(
        SGD(args.distance_lr, gradient_accumulation_steps=k),
        lambda m: m.fit(x, y, batch_size=micro, shuffle=False, verbose=0),
    )

    def max_abs(a, b):
        return max(float(np.max(np.abs(p.astype(np.float64) - q.astype(np.float64)))) for p, q in zip(a, b))

    moved = max_abs(oracle, start)
    result = {
        name: {"max_abs": max_abs(w, oracle), "relative": max_abs(w, oracle) / moved}
        for name, w in (("accum-train", ours), ("accum-train, trim_padding", trimmed), ("keras GA", keras_ga))
    }
    result["moved"] = moved
    # valid tokens in each micro-batch of the first batch, first to last
    result["tokens_per_micro_batch"] = [int(np.sum(x[i * micro : (i + 1) * micro] != 0)) for i in range(k)]
    result["versions"] = {"tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__}
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------- the parent

SHARED = ("V", "T", "E", "H", "C", "k", "micro", "updates", "lr", "seed", "time_arrange")
SHARED_DISTANCE = ("V", "T", "E", "H", "C", "k", "micro", "seed", "arrange", "distance_updates", "distance_lr")


def child_argv(name, args, keys):
    return [sys.executable, __file__, "--serve", name] + [
        f"--{key.replace('_', '-')}={getattr(args, key)}" for key in keys
    ]


def pools_text(threads) -> str:
    if threads:
        return f"every method under {threads[0]} intra-op and {threads[1]} inter-op threads (--threads)"
    return "TensorFlow's default thread pools for every method (none set, TF_NUM_*_THREADS cleared)"


def child_env(threads=None):
    """The children's environment: TensorFlow's default pools, or ``threads`` (intra, inter) for every method."""
    env = {key: value for key, value in os.environ.items() if key not in THREAD_ENV}
    if threads:
        env.update(zip(THREAD_ENV, (str(t) for t in threads)))
    return env


def read_json(name, child):
    """The child's next JSON line (other lines, if any, passed on to stderr)."""
    while True:
        line = child.stdout.readline()
        if not line:
            child.wait()
            raise RuntimeError(f"{name}: the process ended early (exit code {child.returncode})")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            reply = None
        if isinstance(reply, dict):
            return reply
        sys.stderr.write(f"[{name}] {line}")


def run_distance(args):
    out = subprocess.run(
        child_argv(DISTANCE, args, SHARED_DISTANCE), capture_output=True, text=True, env=child_env(args.threads)
    )
    if out.returncode != 0:
        raise SystemExit(f"the distance process failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_updates(name, reply, rounds, args):
    """The optimizer's counters after ``rounds`` training calls (the warm-up's included)."""
    if name == G:  # one micro-step per micro-batch the buckets made (a few more than k x --updates), k per update
        steps = rounds * reply["micro_batches"]
        if reply["micro_steps"] != steps or reply["optimizer_updates"] != steps // args.k:
            raise RuntimeError(f"{name}: {reply['micro_steps']} micro-steps and {reply['optimizer_updates']} updates")
        return
    expected = rounds * args.updates * (args.k if name == D else 1)  # (d) steps once per micro-batch
    if reply["optimizer_updates"] != expected:
        raise RuntimeError(f"{name}: optimizer.iterations is {reply['optimizer_updates']}, not {expected}")
    if name in KERAS and reply["micro_steps"] != expected * args.k:
        raise RuntimeError(f"{name}: {reply['micro_steps']} micro-steps in Keras' counter, not {expected * args.k}")


def time_methods(args):
    examples = args.updates * args.k * args.micro  # per round
    children, finals, warmup = {}, {}, {}
    try:
        for name in METHODS:  # one at a time: each warms up while the others wait
            child = subprocess.Popen(
                child_argv(name, args, SHARED),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=child_env(args.threads),
            )
            children[name] = child
            reply = read_json(name, child)
            if not reply.get("ready"):
                raise RuntimeError(f"{name}: the timing process did not start")
            check_updates(name, reply, 1, args)
            warmup[name] = reply["warmup_wall_s"]
        cpu = {name: [] for name in METHODS}
        wall = {name: [] for name in METHODS}
        updates, batches = {}, {}
        for r in range(args.rounds):
            for name, child in children.items():
                child.stdin.write("go\n")
                child.stdin.flush()
                reply = read_json(name, child)
                check_updates(name, reply, r + 2, args)  # the warm-up round's too
                cpu[name].append(reply["cpu"] / examples)
                wall[name].append(reply["wall"] / examples)
                updates[name], batches[name] = reply["optimizer_updates"], reply["micro_batches"]
        for name, child in children.items():
            child.stdin.write("quit\n")
            child.stdin.flush()
            finals[name] = read_json(name, child)
            child.wait()
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
    times = {}
    for name in METHODS:
        cpu_med, wall_med = statistics.median(cpu[name]), statistics.median(wall[name])
        times[name] = {
            "rounds_cpu_s_per_example": cpu[name],
            "rounds_wall_s_per_example": wall[name],
            "cpu_s_per_example": cpu_med,
            "wall_s_per_example": wall_med,
            "examples_per_cpu_s": 1.0 / cpu_med,
            "examples_per_wall_s": 1.0 / wall_med,
            "warmup_wall_s": warmup[name],
            # in all, the warm-up round's included; checked after every round
            "optimizer_updates": updates[name],
            "micro_batches_per_round": batches[name],
            "threads": {"intra": finals[name]["intra_op_threads"], "inter": finals[name]["inter_op_threads"]},
        }
    jit = {name: finals[name]["jit_compile"] for name in METHODS}
    return times, jit


def markdown_table(report, stated_commit=None):
    """The JSON of --output as docs/fit.md's table, its caption naming the machine and commit once.

    ``stated_commit``: the commit a page named for a JSON written before --output recorded none (said so)."""
    env, args, times, dist = report["environment"], report["args"], report["time"], report["distance"]
    spe = {
        B: "`steps_per_execution=1`",
        B_SPE: "`steps_per_execution=k`",
        B_XLA: "`steps_per_execution=k`, `jit_compile=True`",
    }
    best_cpu, best_wall = report["a_b_against"]["cpu"], report["a_b_against"]["wall"]
    ours = report["a_b_ours"]
    mode = {
        A: "",
        A_XLA: " (`jit_compile=True`)",
        C: " (`trim_padding=True`)",
        C_XLA: " (`trim_padding=True`, `jit_compile=True`)",
    }
    commit = (
        report.get("commit")
        or env.get("commit")
        or (stated_commit and f"{stated_commit} (the page's; the JSON does not record it)")
    )
    threads = args.get("threads")  # (intra, inter) for every method, or None: TensorFlow's defaults
    pools = (
        f"{threads[0]} intra-op and {threads[1]} inter-op threads per process"
        if threads
        else "TensorFlow's default thread pools"
    )
    machine = (
        f"{env['cpus']} CPUs ({env.get('cpu', env['platform'])}), Python {env['python']}, "
        f"TensorFlow {env['tensorflow']}, Keras {env['keras']}, {pools}, "
        f"load average {env['load_average_before'][0]:.1f} before the run"
    )
    options = "".join(f" --{key} {args[key]}" for key in ("k", "micro", "rounds", "updates", "output"))
    options += f" --threads {threads[0]},{threads[1]}" if threads else ""

    untrimmed, trimmed = report["untrimmed"], dist["accum-train, trim_padding"]

    def untrimmed_eps(measure):
        name = untrimmed["a_b_ours"][measure]
        return f"{times[name][f'examples_per_{measure}_s']:.0f}{mode[name]}"

    def untrimmed_rounds(measure):  # the parity target's verdict is the paired rounds' (JSON written since)
        rounds = report.get("paired_untrimmed", {}).get(measure)
        return f"; paired rounds {interval(rounds, True)}" if rounds else ""

    def plain(side, ours):  # rounded against accum-train: its ratio down, Keras' up
        values = report["against_plain_micro_batch"][side]
        return f"{against(values['cpu'], ours)} (CPU), {against(values['wall'], ours)} (wall)"

    return "\n".join(
        [
            caption(machine, commit, f"python benchmarks/peers_masked.py{options}"),
            "",
            "| | accum-train | Keras `gradient_accumulation_steps` |",
            "|---|---:|---:|",
            f"| examples per CPU-second | {times[ours['cpu']]['examples_per_cpu_s']:.0f}{mode[ours['cpu']]} | "
            f"{times[best_cpu]['examples_per_cpu_s']:.0f} ({spe[best_cpu]}) |",
            f"| examples per wall-second | {times[ours['wall']]['examples_per_wall_s']:.0f}{mode[ours['wall']]} | "
            f"{times[best_wall]['examples_per_wall_s']:.0f} ({spe[best_wall]}) |",
            f"| accum-train / Keras | {against(report['ratios']['cpu'], True)} (CPU), "
            f"{against(report['ratios']['wall'], True)} (wall) | |",
            "| each / plain `model.fit` at the micro-batch, no accumulation (`steps_per_execution=k`, "
            f"`jit_compile=True`): {times[D]['examples_per_cpu_s']:.0f} examples per CPU-second, "
            f"{times[D]['examples_per_wall_s']:.0f} per wall-second | {plain('ours', True)} | "
            f"{plain('keras', False)} |",
            f"| accum-train without `trim_padding` / Keras: {untrimmed_eps('cpu')} examples per CPU-second, "
            f"{untrimmed_eps('wall')} per wall-second | {against(untrimmed['ratios']['cpu'], True)} (CPU"
            f"{untrimmed_rounds('cpu')}), {against(untrimmed['ratios']['wall'], True)} (wall"
            f"{untrimmed_rounds('wall')}) | |",
            "| accum-train / Keras' accumulation over micro-batches bucketed by length (`bucket_by_sequence_length`, "
            "16 steps wide; other updates: each holds sequences of like length from across the data, not a random "
            f"batch): {times[G]['examples_per_cpu_s']:.0f} examples per CPU-second, "
            f"{times[G]['examples_per_wall_s']:.0f} per wall-second | "
            f"{against(report['against_bucketed']['cpu'], True)} (CPU), "
            f"{against(report['against_bucketed']['wall'], True)} (wall) | |",
            f"| max distance from whole-batch `model.fit` after {args['distance_updates']} updates | "
            f"{two_figures(dist['accum-train']['max_abs'])}; {two_figures(trimmed['max_abs'])} with `trim_padding` | "
            f"{two_figures(dist['keras GA']['max_abs'])} |",
            f"| the same, relative to how far the weights moved ({two_figures(dist['moved'])}) | "
            f"{two_figures(dist['accum-train']['relative'])}; {two_figures(trimmed['relative'])} with "
            f"`trim_padding` | {two_figures(dist['keras GA']['relative'])} |",
        ]
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--V", type=int, default=1000, help="vocabulary size (id 0 is padding)")
    parser.add_argument("--T", type=int, default=64, help="sequence length")
    parser.add_argument("--E", type=int, default=32, help="embedding size")
    parser.add_argument("--H", type=int, default=64, help="LSTM units")
    parser.add_argument("--C", type=int, default=16, help="classes per token")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument(
        "--rounds", type=int, default=paired.ROUNDS, help="interleaved timed rounds (6: the fewest for a 95%% interval)"
    )
    parser.add_argument(
        "--updates", type=int, default=20, help="updates per method per round (one training call per round)"
    )
    parser.add_argument("--lr", type=float, default=0.001, help="Adam's learning rate (timing)")
    parser.add_argument("--seed", type=int, default=0, help="the model's initial weights and the data")
    parser.add_argument("--time-arrange", choices=("random", "uneven"), default="random", help="the timing data")
    parser.add_argument("--arrange", choices=("random", "uneven"), default="uneven", help="the distance data")
    parser.add_argument("--distance-updates", type=int, default=3)
    parser.add_argument("--distance-lr", type=float, default=0.5, help="SGD's learning rate (distance)")
    parser.add_argument(
        "--threads",
        type=lambda text: tuple(int(t) for t in text.split(",")),
        default=None,
        help="INTRA,INTER: every method under these thread pools (default: TensorFlow's own)",
    )
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # a child: a method's name or "distance"
    args = parser.parse_args()

    if args.serve == DISTANCE:
        return distance(args)
    if args.serve:
        return serve(args.serve, args)

    load_before = os.getloadavg()
    started = time.perf_counter()
    dist = run_distance(args)
    versions = dist.pop("versions")
    timing_started = time.perf_counter()
    times, jit = time_methods(args)
    timing_s = time.perf_counter() - timing_started

    print(
        f"time: masked LSTM (V={args.V}, T={args.T}, E={args.E}, H={args.H}, C={args.C}), k={args.k}, micro-batch "
        f"{args.micro}, Adam lr {args.lr}, {args.rounds} rounds x {args.updates} updates per method (one training "
        f"call per round), each method in its own process, {pools_text(args.threads)}, medians; "
        f"keras jit_compile resolved to {jit[B]}"
    )
    print(
        f"{'method':<45} {'CPU ms/example':>15} {'wall ms/example':>16} {'examples/s':>11} "
        f"{'examples/CPU-s':>15} {'updates':>8} {'warm-up s':>10}"
    )
    for name, r in times.items():
        print(
            f"{name:<45} {1000 * r['cpu_s_per_example']:>15.3f} {1000 * r['wall_s_per_example']:>16.3f} "
            f"{r['examples_per_wall_s']:>11.0f} {r['examples_per_cpu_s']:>15.0f} {r['optimizer_updates']:>8} "
            f"{r['warmup_wall_s']:>10.1f}"
        )
    best = {"ours": fastest(times, OURS), "keras": fastest(times, KERAS), "untrimmed": fastest(times, (A, A_XLA))}
    best_cpu, best_wall = best["keras"]["cpu"], best["keras"]["wall"]
    ratios = {
        measure: times[best["ours"][measure]][f"examples_per_{measure}_s"]
        / times[best["keras"][measure]][f"examples_per_{measure}_s"]
        for measure in ("cpu", "wall")
    }
    # without trim_padding: the faster of (a) and (a') against the same Keras
    untrimmed = {
        measure: times[best["untrimmed"][measure]][f"examples_per_{measure}_s"]
        / times[best["keras"][measure]][f"examples_per_{measure}_s"]
        for measure in ("cpu", "wall")
    }
    # against Keras' accumulation over micro-batches bucketed by length, (g): other updates, not a peer's best
    bucketed = {
        measure: times[best["ours"][measure]][f"examples_per_{measure}_s"] / times[G][f"examples_per_{measure}_s"]
        for measure in ("cpu", "wall")
    }
    # against no accumulation at all: each side's best over Keras' plain step at the micro-batch, (d)
    plain = {
        side: {
            measure: times[best[side][measure]][f"examples_per_{measure}_s"] / times[D][f"examples_per_{measure}_s"]
            for measure in ("cpu", "wall")
        }
        for side in ("ours", "keras")
    }
    # the same ratios, each between the same two methods, taken round by round (paired.py)
    paired_ratios = {m: paired.per_round(times, best["ours"][m], best["keras"][m], m) for m in ("cpu", "wall")}
    paired_untrimmed = {m: paired.per_round(times, best["untrimmed"][m], best["keras"][m], m) for m in ("cpu", "wall")}
    paired_bucketed = {m: paired.per_round(times, best["ours"][m], G, m) for m in ("cpu", "wall")}
    paired_plain = {
        side: {m: paired.per_round(times, best[side][m], D, m) for m in ("cpu", "wall")} for side in ("ours", "keras")
    }
    print(
        f"\nratios, 3 decimals rounded against accum-train (full precision in the JSON); "
        f"a/b: the faster accum-train against the faster Keras: CPU {best['ours']['cpu']} against {best_cpu}, "
        f"wall {best['ours']['wall']} against {best_wall}. Each: the ratio of the medians above, the median of the "
        f"{args.rounds} per-round ratios [its interval, {100 * paired_ratios['cpu']['confidence']:.2f}% coverage], "
        "full precision"
    )
    lines = [
        (f"a/b examples per {u}-second", ratios[m], paired_ratios[m], True)
        for m, u in (("cpu", "CPU"), ("wall", "wall"))
    ]
    lines += [
        (f"a/b without trim_padding, examples per {m}-second", untrimmed[m], paired_untrimmed[m], True)
        for m in ("cpu", "wall")
    ]
    lines += [(f"ours/g examples per {m}-second", bucketed[m], paired_bucketed[m], True) for m in ("cpu", "wall")]
    lines += [
        (f"{side}/d examples per {m}-second", plain[side][m], paired_plain[side][m], side == "ours")
        for side in ("ours", "keras")
        for m in ("cpu", "wall")
    ]
    for label, value, rounds, higher in lines:
        print(f"  {label:<50} {against(value, higher):>7}  {interval(rounds, higher):<24} {value!r}")

    print(
        f"\ndistance from whole-batch training: SGD lr {args.distance_lr}, {args.distance_updates} updates of "
        f"k={args.k} x {args.micro}, arrange {args.arrange} (valid tokens per micro-batch of the first batch: "
        f"{dist['tokens_per_micro_batch']})"
    )
    for name in ("accum-train", "accum-train, trim_padding", "keras GA"):
        d = dist[name]
        print(f"  {name:<25} max |w - w_whole-batch| {d['max_abs']:.3e}   relative to the move {d['relative']:.3e}")
    print(f"  whole-batch Keras moved the weights by up to {dist['moved']:.3e}")
    print(f"\n({time.perf_counter() - started:.0f} s in all)")

    if args.output:
        environment = {
            **provenance.machine(),
            "python": platform.python_version(),
            **versions,
            "platform": platform.platform(),
            "thread_pools": pools_text(args.threads),
            "load_average_before": load_before,
            "timing_wall_s": timing_s,
            "jit_compile": jit,
        }
        model = {
            "layers": "Input((None,), int32) -> Embedding(V, E, mask_zero=True) -> LSTM(H, return_sequences=True) "
            "-> Dense(C) per token",
            "loss": "SparseCategoricalCrossentropy(from_logits=True)",
            "metrics": None,
            **{key: getattr(args, key) for key in ("V", "T", "E", "H", "C")},
        }
        args_json = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
        args_json.pop("serve")
        args.output.write_text(
            json.dumps(
                {
                    "args": args_json,
                    "model": model,
                    "environment": environment,
                    "time": times,
                    "ratios": ratios,
                    "a_b_against": {"cpu": best_cpu, "wall": best_wall},
                    "a_b_ours": best["ours"],
                    "untrimmed": {"ratios": untrimmed, "a_b_ours": best["untrimmed"]},
                    "against_bucketed": bucketed,
                    "against_plain_micro_batch": plain,
                    "distance": dist,
                    # each ratio above round by round: median, 95% interval, per-round ratios (paired.py)
                    "paired_ratios": paired_ratios,
                    "paired_untrimmed": paired_untrimmed,
                    "paired_against_bucketed": paired_bucketed,
                    "paired_against_plain_micro_batch": paired_plain,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
