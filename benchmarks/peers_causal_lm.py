"""accum_train.fit beside Keras 3's own accumulation on a small GPT-2 causal LM (KerasHub).

The model, built offline the same way from the same seed for every method (no
preset, no tokenizer, nothing downloaded):
keras_hub.models.GPT2Backbone(vocabulary_size=V, num_layers=L, num_heads=heads,
hidden_dim=D, intermediate_dim=4 D, max_sequence_length=T, dropout=0.0) in
keras_hub.models.GPT2CausalLM(backbone, preprocessor=None), compiled with
SparseCategoricalCrossentropy(from_logits=True) (KerasHub's causal LM default
loss, reduction sum_over_batch_size) and no metric.

The data is what GPT2CausalLMPreprocessor makes, synthetic (numpy, fixed seed):
each raw sequence of T + 1 steps holds length + 1 token ids in 1..V-1 and 0
after them; x = {"token_ids": its first T steps, "padding_mask": where those are
not 0}, y = its last T steps (the next token at each position), sample_weight =
the padding mask of y (float32), i.e. `length` weighted targets. The lengths
are skewed as real text is: log-normal around a median of T/5 (sigma 0.9),
rounded and clipped to [4, T]; a few percent sit at the cap T (the run prints
and records the mean and the fraction at the cap). Every method gets the same
micro-batch (--micro), k (--k, batch = k x micro), Adam learning rate (--lr)
and updates per round (--updates):

  (a)  accum-train: the model compiled with Adam(lr), then ONE
       accum_train.fit(model, x, y, sample_weight=w, batch_size=k*micro,
       subdivisions=k, epochs=1, shuffle=False, verbose=0) per round over the
       round's updates x k x micro examples
  (a') the same compiled with jit_compile=True (XLA)
  (c), (c') (a) and (a') with trim_padding=True: each batch's sequences
       ordered by length, each micro-batch cut after its longest sequence
       (rounded up to a multiple of 16 steps); the same updates
  (b') Keras 3: compiled with Adam(lr, gradient_accumulation_steps=k) and
       steps_per_execution=k (one graph call per update), ONE
       model.fit(x, y, sample_weight=w, batch_size=micro, epochs=1,
       shuffle=False, verbose=0) per round over the same examples, compile's
       defaults otherwise (jit_compile="auto", which is off on a CPU)
  (b'') (b') compiled with jit_compile=True (XLA)
  (e)  for memory only: plain model.fit(batch_size=k*micro), no accumulation

Time: every method lives in its own process (started by this script with
--serve NAME), built and warmed up with one untimed round (tracing, and under
XLA compiling, every micro-batch length the round holds); the parent then sends
each process "go" in turn, --rounds times (interleaved), and each answers with
the CPU (time.process_time) and wall (time.perf_counter) seconds of its
training call. Medians over the rounds, per example. After every round the
number of optimizer updates is checked (Keras 3 keeps optimizer.iterations at
micro-steps // k under gradient_accumulation_steps; its private _iterations
counts micro-steps, checked too). TensorFlow's default thread pools for every
method (TF_NUM_*_THREADS cleared in the children).

Ratios (examples per CPU-second, examples per wall-second, by each measure
separately, each side in its best use of its options): "with trim_padding",
the faster of (c) and (c') against Keras' best, the faster of (b') and (b'');
"without", the faster of (a) and (a') against the same. Printed with 3 decimals
rounded against accum-train (down: higher is better for it), full precision in
the JSON (--output). Each ratio is also taken round by round, between the same
two methods (round r of one against round r of the other: they ran in the same
round, one after the other), and reported as the median of those per-round
ratios with a distribution-free 95% interval for it (benchmarks/paired.py;
--rounds defaults to 6, the fewest whose interval reaches 95%). A target is met
when that median meets it; a parity target (>= 1.0) also when the interval
contains 1. The peaks are single measurements, met by their value.

Memory: (a), (c) and (e), each in a fresh process: the model compiled as for
timing (Adam, no XLA), one batch of k x micro examples (the timing data's
first), one untimed call of one update (tracing, the optimizer's slots), then
TensorFlow's allocator peak (BFC, which `import accum_train` turns on before
TensorFlow loads) over a second call of one update, reset just before it: what
the weights, the optimizer's state, the gradient cache and the update's
activations hold at their highest.

Distance from whole-batch training (not timed, in its own process before the
timing ones start): the loss compiled with reduction "mean_with_sample_weight"
(the mean over valid tokens), from the same initial weights and data order,
--distance-updates updates with SGD(--distance-lr) of
  (i)   plain Keras model.fit(batch_size=k*micro): the oracle
  (ii)  accum_train.fit(batch_size=k*micro, subdivisions=k), and the same
        with trim_padding=True
  (iii) Keras SGD(gradient_accumulation_steps=k), model.fit(batch_size=micro)
and the largest absolute weight difference of (ii) and (iii) from (i), also
relative to how far (i) moved the weights (max abs). --arrange uneven (the
default) orders each batch longest first, so that its micro-batches hold
falling numbers of valid tokens: Keras' accumulation averages the k
micro-batch means, which is then not the whole batch's mean over tokens.

    python benchmarks/peers_causal_lm.py --output docs/peers-causal-lm.json
    python benchmarks/peers_causal_lm.py --markdown docs/peers-causal-lm.json   # the results page's table
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
from tables import MIB, against, caption, fastest, interval, two_figures

A, A_XLA = "(a) accum-train", "(a') accum-train, XLA"
C, C_XLA = "(c) accum-train, trim_padding", "(c') accum-train, trim_padding, XLA"
B_SPE, B_XLA = "(b') keras GA, fit, spe=k", "(b'') keras GA, fit, spe=k, XLA"
E = "(e) keras plain, whole batch"
METHODS = (A, A_XLA, C, C_XLA, B_SPE, B_XLA)
OURS = (A, A_XLA, C, C_XLA)
UNTRIMMED = (A, A_XLA)
TRIMMED = (C, C_XLA)
KERAS = (B_SPE, B_XLA)
XLA = (A_XLA, C_XLA, B_XLA)
PEAKED = (A, C, E)  # the allocator peak of one update
DISTANCE = "distance"  # --serve distance: the exactness child
PEAK = "peak:"  # --serve "peak:NAME": a memory child
THREAD_ENV = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")  # cleared in the children: TF's defaults
SIGMA = 0.9  # the log-normal lengths' spread; their median is T/5

# name: (target, the JSON key in "ratios" or "peak_ratios"); every ratio here is higher-is-better for accum-train
# except the peaks'
TARGETS = {
    "with trim_padding, examples per CPU-second": (">= 1.5", True),
    "with trim_padding, examples per wall-second": (">= 1.5", True),
    "without trim_padding, examples per CPU-second": (">= 1.0", True),
    "without trim_padding, examples per wall-second": (">= 1.0", True),
    "(a)/(e) TF allocator peak": ("<= 0.3", False),
    "(c)/(e) TF allocator peak": ("<= 0.3", False),
}


# ---------------------------------------------------------------- data and model (numpy / Keras)


def draw_lengths(n, args, rng):
    """``n`` target counts per sequence: log-normal around T/5, rounded and clipped to [4, T]."""
    drawn = rng.lognormal(np.log(args.T / 5), SIGMA, n)
    return np.clip(np.round(drawn), 4, args.T).astype(np.int64)


def make_data(n, args, arrange):
    """(x, y, sample_weight, lengths) of ``n`` sequences, as GPT2CausalLMPreprocessor makes them, from args.seed.
    arrange="uneven": each batch of k x micro ordered longest first (its micro-batches' token counts fall)."""
    rng = np.random.default_rng(args.seed)
    lengths = draw_lengths(n, args, rng)
    raw = rng.integers(1, args.V, (n, args.T + 1)).astype(np.int32)
    if arrange == "uneven":
        batch = args.k * args.micro
        order = np.concatenate(
            [start + np.argsort(-lengths[start : start + batch], kind="stable") for start in range(0, n, batch)]
        )
        lengths = lengths[order]
    raw[np.arange(args.T + 1)[None, :] > lengths[:, None]] = 0  # length + 1 tokens: inputs and their next ones
    mask = raw != 0
    x = {"token_ids": raw[:, :-1], "padding_mask": mask[:, :-1]}
    return x, raw[:, 1:], mask[:, 1:].astype(np.float32), lengths


def length_stats(lengths, args) -> dict:
    return {
        "distribution": f"log-normal, median T/5 = {args.T / 5:g}, sigma {SIGMA}, rounded and clipped to [4, T]",
        "sequences": len(lengths),
        "mean": float(np.mean(lengths)),
        "median": float(np.median(lengths)),
        "at_cap": float(np.mean(lengths == args.T)),
        "valid_fraction": float(np.mean(lengths) / args.T),  # of the padded target positions
    }


def build_model(args):
    import keras
    import keras_hub

    keras.utils.set_random_seed(args.seed)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=args.V,
        num_layers=args.L,
        num_heads=args.heads,
        hidden_dim=args.D,
        intermediate_dim=4 * args.D,
        max_sequence_length=args.T,
        dropout=0.0,
    )
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def loss(reduction="sum_over_batch_size"):
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)


def micro_steps(optimizer):
    """Keras' own micro-step counter (private: optimizer.iterations is it // k under accumulation)."""
    counter = getattr(optimizer, "_iterations", None)
    return None if counter is None else int(counter.numpy())


def training(name, model, x, y, w, args):
    """Compile ``model`` for method ``name`` (Adam(lr)) and return run(): one training call over x, y, w."""
    import accum_train
    import keras

    k, micro = args.k, args.micro
    jit = True if name in XLA else "auto"
    if name in OURS:
        model.compile(optimizer=keras.optimizers.Adam(args.lr), loss=loss(), jit_compile=jit)
        trim = name in TRIMMED

        def run():
            accum_train.fit(
                model,
                x,
                y,
                sample_weight=w,
                batch_size=k * micro,
                subdivisions=k,
                epochs=1,
                shuffle=False,
                verbose=0,
                trim_padding=trim,
            )

    elif name in KERAS:
        model.compile(
            optimizer=keras.optimizers.Adam(args.lr, gradient_accumulation_steps=k),
            loss=loss(),
            steps_per_execution=k,
            jit_compile=jit,
        )

        def run():
            model.fit(x, y, sample_weight=w, batch_size=micro, epochs=1, shuffle=False, verbose=0)

    elif name == E:
        model.compile(optimizer=keras.optimizers.Adam(args.lr), loss=loss())

        def run():
            model.fit(x, y, sample_weight=w, batch_size=k * micro, epochs=1, shuffle=False, verbose=0)

    else:
        raise SystemExit(f"no method {name!r}")
    return run


# ---------------------------------------------------------------- the children


def serve(name, args):
    """A timing child: build one method, warm it up with one untimed round, then time one round per 'go'."""
    import accum_train  # noqa: F401  (before TensorFlow: it sets the allocator mode TensorFlow reads at import)
    import tensorflow as tf

    x, y, w, _ = make_data(args.updates * args.k * args.micro, args, args.time_arrange)
    model = build_model(args)
    run = training(name, model, x, y, w, args)

    def counters():
        return {
            "optimizer_updates": int(model.optimizer.iterations.numpy()),
            "micro_steps": micro_steps(model.optimizer),
            "micro_batches": args.updates * args.k,
        }

    w0 = time.perf_counter()
    run()  # warm-up: tracing, graph building, XLA compiling
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


def peak(name, args):
    """A memory child: TensorFlow's allocator peak over one update of method ``name``, after one untimed one."""
    import accum_train  # noqa: F401  (before TensorFlow: the BFC allocator, which keeps a peak, on)
    import tensorflow as tf

    batch = args.k * args.micro
    x, y, w, lengths = make_data(batch, args, args.time_arrange)
    model = build_model(args)
    run = training(name, model, x, y, w, args)
    run()  # tracing, the optimizer's slots
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = int(tf.config.experimental.get_memory_info("CPU:0")["current"])
    run()
    info = tf.config.experimental.get_memory_info("CPU:0")
    updates = int(model.optimizer.iterations.numpy())
    if updates != 2:
        raise RuntimeError(f"{name}: {updates} optimizer updates, not 2")
    print(
        json.dumps(
            {
                "peak_memory_bytes": int(info["peak"]),
                "in_use_before_bytes": before,  # weights, optimizer state, what the first call left
                "batch_size": batch,
                "subdivisions": 1 if name == E else args.k,
                "longest": int(lengths.max()),
            }
        ),
        flush=True,
    )


def distance(args):
    """The exactness child: (ii) accum-train and (iii) Keras GA against (i) whole-batch Keras, SGD,
    the loss's mean over valid tokens (mean_with_sample_weight)."""
    import accum_train
    import keras
    import keras_hub
    import tensorflow as tf

    k, micro, updates = args.k, args.micro, args.distance_updates
    x, y, w, lengths = make_data(updates * k * micro, args, args.arrange)
    initial = build_model(args)
    start = initial.get_weights()

    def train(optimizer, fit):
        model = build_model(args)
        model.set_weights(start)
        model.compile(optimizer=optimizer, loss=loss("mean_with_sample_weight"))
        fit(model)
        if int(model.optimizer.iterations.numpy()) != updates:
            raise RuntimeError(f"{model.optimizer.iterations.numpy()} optimizer updates, not {updates}")
        return model.get_weights()

    SGD = keras.optimizers.SGD
    oracle = train(
        SGD(args.distance_lr), lambda m: m.fit(x, y, sample_weight=w, batch_size=k * micro, shuffle=False, verbose=0)
    )

    def ours(trim):
        return lambda m: accum_train.fit(
            m,
            x,
            y,
            sample_weight=w,
            batch_size=k * micro,
            subdivisions=k,
            shuffle=False,
            verbose=0,
            trim_padding=trim,
        )

    untrimmed = train(SGD(args.distance_lr), ours(False))
    trimmed = train(SGD(args.distance_lr), ours(True))
    keras_ga = train(
        SGD(args.distance_lr, gradient_accumulation_steps=k),
        lambda m: m.fit(x, y, sample_weight=w, batch_size=micro, shuffle=False, verbose=0),
    )

    def max_abs(a, b):
        return max(float(np.max(np.abs(p.astype(np.float64) - q.astype(np.float64)))) for p, q in zip(a, b))

    moved = max_abs(oracle, start)
    result = {
        name: {"max_abs": max_abs(weights, oracle), "relative": max_abs(weights, oracle) / moved}
        for name, weights in (
            ("accum-train", untrimmed),
            ("accum-train, trim_padding", trimmed),
            ("keras GA", keras_ga),
        )
    }
    result["moved"] = moved
    # weighted targets in each micro-batch of the first batch, first to last
    result["tokens_per_micro_batch"] = [int(np.sum(w[i * micro : (i + 1) * micro])) for i in range(k)]
    result["lengths"] = length_stats(lengths, args)
    result["parameters"] = int(initial.count_params())
    result["versions"] = {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "keras_hub": keras_hub.__version__,
        "numpy": np.__version__,
    }
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------- the parent

MODEL = ("V", "L", "heads", "D", "T")
SHARED = (*MODEL, "k", "micro", "updates", "lr", "seed", "time_arrange")
SHARED_DISTANCE = (*MODEL, "k", "micro", "seed", "arrange", "distance_updates", "distance_lr")


def child_argv(name, args, keys):
    return [sys.executable, __file__, "--serve", name] + [
        f"--{key.replace('_', '-')}={getattr(args, key)}" for key in keys
    ]


def child_env():
    """The children's environment: TensorFlow's default pools (TF_NUM_*_THREADS cleared)."""
    return {key: value for key, value in os.environ.items() if key not in THREAD_ENV}


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


def run_child(name, args, keys):
    """A child that answers once (distance, peaks): its last line's JSON."""
    out = subprocess.run(child_argv(name, args, keys), capture_output=True, text=True, env=child_env())
    if out.returncode != 0:
        raise SystemExit(f"the {name} process failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_updates(name, reply, rounds, args):
    """The optimizer's counters after ``rounds`` training calls (the warm-up's included)."""
    expected = rounds * args.updates
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
                env=child_env(),
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


def ratios_of(times):
    """Each side's best by each measure, the ratios the targets are about (of the medians), and the same ratios
    between the same methods taken round by round (paired.py: median, 95% interval, per-round ratios)."""
    best = {"trimmed": fastest(times, TRIMMED), "untrimmed": fastest(times, UNTRIMMED), "keras": fastest(times, KERAS)}
    ratios, paired_ratios = {}, {}
    for side, words in (("trimmed", "with"), ("untrimmed", "without")):
        for measure, unit in (("cpu", "CPU"), ("wall", "wall")):
            key = f"examples_per_{measure}_s"
            ours, theirs = best[side][measure], best["keras"][measure]
            name = f"{words} trim_padding, examples per {unit}-second"
            ratios[name] = times[ours][key] / times[theirs][key]
            paired_ratios[name] = paired.per_round(times, ours, theirs, measure)
    return best, ratios, paired_ratios


def verdict(target, figure) -> str:
    """ "met" or "NOT met": a paired ratio (a dict) by paired.reaches' rule, a single measurement by its value."""
    if not isinstance(figure, dict):
        figure = {"median": figure, "low": figure, "high": figure}
    return "met" if paired.reaches(target, figure) else "NOT met"


def command_line(args) -> str:
    keys = (*MODEL, "k", "micro", "rounds", "updates", "lr", "seed", "distance_updates", "distance_lr", "output")
    return "python benchmarks/peers_causal_lm.py" + "".join(f" --{key.replace('_', '-')} {args[key]}" for key in keys)


def markdown_table(report) -> str:
    """The JSON of --output as the results page's tables, the caption naming the machine and commit once."""
    env, args, times, dist = report["environment"], report["args"], report["time"], report["distance"]
    peaks, data = report["peaks"], report["data"]
    machine = (
        f"{env['cpus']} CPUs ({env.get('cpu', env['platform'])}), Python {env['python']}, "
        f"TensorFlow {env['tensorflow']}, Keras {env['keras']}, KerasHub {env['keras_hub']}, "
        f"TensorFlow's default thread pools, load average {env['load_average_before'][0]:.1f} before the run"
    )
    model = report["model"]
    lines = [
        caption(machine, env.get("commit"), command_line(args)),
        "",
        f"GPT-2 causal LM: {model['layers_text']}, {model['parameters']} parameters; batch k x micro = "
        f"{args['k']} x {args['micro']}; sequences of T = {args['T']} steps, lengths {data['distribution']}: mean "
        f"{data['mean']:.1f}, median {data['median']:.0f}, {100 * data['at_cap']:.1f}% at the cap "
        f"({100 * data['valid_fraction']:.0f}% of the target positions valid); {args['rounds']} interleaved rounds "
        f"x {args['updates']} updates per method, medians.",
        "",
        "| method | examples per CPU-second | examples per wall-second | warm-up s |",
        "|---|---:|---:|---:|",
    ]
    for name, r in times.items():
        lines.append(
            f"| {name} | {r['examples_per_cpu_s']:.1f} | {r['examples_per_wall_s']:.1f} | {r['warmup_wall_s']:.0f} |"
        )
    lines += [
        "",
        "| ratio (3 decimals, rounded against accum-train) | accum-train | against | target | measured |",
        "|---|---|---|---|---:|",
    ]
    best = report["best"]
    for words, side in (("with", "trimmed"), ("without", "untrimmed")):
        for measure, unit in (("cpu", "CPU"), ("wall", "wall")):
            key = f"{words} trim_padding, examples per {unit}-second"
            target = report["targets"][key]["target"]
            measured = f"{against(report['ratios'][key], True)} ({verdict(target, report['ratios'][key])})"
            if "paired_ratios" in report:  # written since the rounds were paired: the verdict is theirs
                rounds = report["paired_ratios"][key]
                measured = (
                    f"{against(report['ratios'][key], True)} (paired rounds {interval(rounds, True)}: "
                    f"{verdict(target, rounds)})"
                )
            lines.append(
                f"| {key} | {best[side][measure].split(' ', 1)[0]} | {best['keras'][measure].split(' ', 1)[0]} | "
                f"{target} | {measured} |"
            )
    whole = peaks[E]["peak_memory_bytes"]
    for name in (A, C):
        key = f"{name.split(' ', 1)[0]}/(e) TF allocator peak"
        target = report["targets"][key]["target"]
        value = report["peak_ratios"][key]
        lines.append(
            f"| {key}, k={args['k']}, batch {args['k'] * args['micro']} "
            f"({peaks[name]['peak_memory_bytes'] / MIB:.1f} vs {whole / MIB:.1f} MiB) | {name.split(' ', 1)[0]} | "
            f"(e) | {target} | {against(value, False)} ({verdict(target, value)}) |"
        )
    lines += [
        "",
        f'Distance from whole-batch `model.fit` (loss `reduction="mean_with_sample_weight"`, SGD '
        f"{args['distance_lr']}, {args['distance_updates']} updates, each batch longest first: weighted targets per "
        f"micro-batch of the first batch {dist['tokens_per_micro_batch']}); whole-batch `model.fit` moved the "
        f"weights by up to {two_figures(dist['moved'])}:",
        "",
        "| | max abs weight difference | relative to the move |",
        "|---|---:|---:|",
    ]
    for name, label in (
        ("accum-train", "`accum_train.fit`"),
        ("accum-train, trim_padding", "`accum_train.fit(trim_padding=True)`"),
        ("keras GA", "Keras `gradient_accumulation_steps`"),
    ):
        lines.append(f"| {label} | {two_figures(dist[name]['max_abs'])} | {two_figures(dist[name]['relative'])} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--V", type=int, default=1000, help="vocabulary size (id 0 is padding)")
    parser.add_argument("--L", type=int, default=2, help="transformer layers")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--D", type=int, default=64, help="hidden size (the feed-forward's is 4 D)")
    parser.add_argument("--T", type=int, default=128, help="sequence length")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument(
        "--rounds", type=int, default=paired.ROUNDS, help="interleaved timed rounds (6: the fewest for a 95%% interval)"
    )
    parser.add_argument(
        "--updates", type=int, default=50, help="updates per method per round (one training call per round)"
    )
    parser.add_argument("--lr", type=float, default=0.001, help="Adam's learning rate (timing)")
    parser.add_argument("--seed", type=int, default=0, help="the model's initial weights and the data")
    parser.add_argument("--time-arrange", choices=("random", "uneven"), default="random", help="the timing data")
    parser.add_argument("--arrange", choices=("random", "uneven"), default="uneven", help="the distance data")
    parser.add_argument("--distance-updates", type=int, default=3)
    parser.add_argument("--distance-lr", type=float, default=0.5, help="SGD's learning rate (distance)")
    parser.add_argument("--output", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--markdown", type=Path, default=None, help="print the tables of a JSON --output wrote")
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # a child: a method's name, peak:, distance
    args = parser.parse_args()

    if args.markdown:
        return print(markdown_table(json.loads(args.markdown.read_text())))
    if args.serve == DISTANCE:
        return distance(args)
    if args.serve and args.serve.startswith(PEAK):
        return peak(args.serve[len(PEAK) :], args)
    if args.serve:
        return serve(args.serve, args)

    load_before = os.getloadavg()
    started = time.perf_counter()
    dist = run_child(DISTANCE, args, SHARED_DISTANCE)
    versions, distance_lengths, count = dist.pop("versions"), dist.pop("lengths"), dist.pop("parameters")
    peaks = {name: run_child(PEAK + name, args, SHARED) for name in PEAKED}
    timing_started = time.perf_counter()
    times, jit = time_methods(args)
    timing_s = time.perf_counter() - timing_started
    rng = np.random.default_rng(args.seed)
    data = length_stats(draw_lengths(args.updates * args.k * args.micro, args, rng), args)  # the timing data's

    model_text = f"V={args.V}, L={args.L}, heads={args.heads}, D={args.D}, T={args.T}"
    print(
        f"time: GPT-2 causal LM ({model_text}), k={args.k}, micro-batch {args.micro}, Adam lr {args.lr}, "
        f"{args.rounds} rounds x {args.updates} updates per method (one training call per round), each method in "
        f"its own process, TensorFlow's default thread pools, medians"
    )
    print(
        f"data: {data['sequences']} sequences per round, lengths {data['distribution']}: mean {data['mean']:.1f}, "
        f"median {data['median']:.0f}, {100 * data['at_cap']:.1f}% at the cap T={args.T}, "
        f"{100 * data['valid_fraction']:.0f}% of the target positions valid"
    )
    print(
        f"{'method':<40} {'CPU ms/example':>15} {'wall ms/example':>16} {'examples/s':>11} "
        f"{'examples/CPU-s':>15} {'updates':>8} {'warm-up s':>10} {'XLA':>6}"
    )
    for name, r in times.items():
        print(
            f"{name:<40} {1000 * r['cpu_s_per_example']:>15.3f} {1000 * r['wall_s_per_example']:>16.3f} "
            f"{r['examples_per_wall_s']:>11.1f} {r['examples_per_cpu_s']:>15.1f} {r['optimizer_updates']:>8} "
            f"{r['warmup_wall_s']:>10.1f} {jit[name]!s:>6}"
        )
    best, ratios, paired_ratios = ratios_of(times)
    peak_ratios = {
        f"{name.split(' ', 1)[0]}/(e) TF allocator peak": peaks[name]["peak_memory_bytes"]
        / peaks[E]["peak_memory_bytes"]
        for name in (A, C)
    }
    print(
        "\nratios, 3 decimals rounded against accum-train (full precision in the JSON); each side's fastest by each "
        f"measure: with trim_padding CPU {best['trimmed']['cpu']}, wall {best['trimmed']['wall']}; without "
        f"CPU {best['untrimmed']['cpu']}, wall {best['untrimmed']['wall']}; Keras CPU {best['keras']['cpu']}, wall "
        f"{best['keras']['wall']}. Each: the ratio of the medians above, the median of the {args.rounds} per-round "
        f"ratios [its interval, {100 * next(iter(paired_ratios.values()))['confidence']:.2f}% coverage], full "
        "precision, the verdict"
    )
    # the verdict: the paired rounds' for a timed ratio, the value's for a peak (one measurement)
    figures = {**paired_ratios, **peak_ratios}
    met = {key: verdict(TARGETS[key][0], figure) == "met" for key, figure in figures.items()}
    for key, value in {**ratios, **peak_ratios}.items():
        target, higher = TARGETS[key]
        rounds = interval(paired_ratios[key], higher) if key in paired_ratios else "- (one measurement)"
        said = "met" if met[key] else "NOT met"
        print(f"  {key:<50} {against(value, higher)}  {rounds:<24} {value!r}  target {target}: {said}")
    print(f"  (verdict: {paired.RULE})")
    print(f"\nTF allocator peak of one update, batch {args.k * args.micro}:")
    for name, r in peaks.items():
        print(
            f"  {name:<40} k={r['subdivisions']:<3} peak {r['peak_memory_bytes'] / MIB:8.2f} MiB "
            f"({r['peak_memory_bytes']} bytes), in use before {r['in_use_before_bytes'] / MIB:.2f} MiB"
        )

    print(
        f"\ndistance from whole-batch training: loss reduction mean_with_sample_weight, SGD lr {args.distance_lr}, "
        f"{args.distance_updates} updates of k={args.k} x {args.micro}, arrange {args.arrange} (weighted targets "
        f"per micro-batch of the first batch: {dist['tokens_per_micro_batch']})"
    )
    for name in ("accum-train", "accum-train, trim_padding", "keras GA"):
        d = dist[name]
        print(f"  {name:<25} max |w - w_whole-batch| {d['max_abs']:.3e}   relative to the move {d['relative']:.3e}")
    print(f"  whole-batch Keras moved the weights by up to {dist['moved']:.3e}")
    print(f"\n({time.perf_counter() - started:.0f} s in all, {timing_s:.0f} s timing)")

    if args.output:
        environment = {
            **provenance.machine(),
            "python": platform.python_version(),
            **versions,
            "platform": platform.platform(),
            "thread_pools": "TensorFlow's default thread pools for every method (none set, TF_NUM_*_THREADS cleared)",
            "load_average_before": load_before,
            "timing_wall_s": timing_s,
            "jit_compile": jit,
        }
        model = {
            "layers": "GPT2Backbone(vocabulary_size=V, num_layers=L, num_heads=heads, hidden_dim=D, "
            "intermediate_dim=4 D, max_sequence_length=T, dropout=0.0) in GPT2CausalLM(preprocessor=None)",
            "layers_text": f"{args.L} layers, {args.heads} heads, width {args.D}, vocabulary {args.V}",
            "parameters": count,
            "loss": "SparseCategoricalCrossentropy(from_logits=True) (sum_over_batch_size; distance: "
            "mean_with_sample_weight)",
            "metrics": None,
            **{key: getattr(args, key) for key in MODEL},
        }
        args_json = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
        for key in ("serve", "markdown"):
            args_json.pop(key)
        targets = {key: {"target": target, "higher_is_better": higher} for key, (target, higher) in TARGETS.items()}
        args.output.write_text(
            json.dumps(
                {
                    "args": args_json,
                    "model": model,
                    "environment": environment,
                    "data": data,
                    "distance_data": distance_lengths,
                    "time": times,
                    "best": best,
                    "ratios": ratios,
                    # each timed ratio round by round: median, 95% interval, per-round ratios (paired.py)
                    "paired_ratios": paired_ratios,
                    "peaks": peaks,
                    "peak_ratios": peak_ratios,
                    "targets": targets,
                    "met": met,
                    "met_rule": paired.RULE,
                    "distance": dist,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
