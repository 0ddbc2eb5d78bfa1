"""Markdown tables made from the JSON of peers.py, peers_keras.py and `accum-train compare`.

Those scripts import TensorFlow at the top, so their tables are made here, where importing costs nothing:
scripts/results_tables.py calls these functions on the JSON alone. Ratios of accum-train to another method are
shown rounded against accum-train, as peers.py prints them (the display never flatters it); absolute figures are
rounded to the nearest.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

MIB = 2**20

# peers.py's method keys (the JSON's) -> the name the pages give each method; {micro} and {batch} from the args
METHODS = {
    "(a) accum-train": "(a) accum-train",
    "(a1) accum-train, 1 at a time": "(a1) accum-train, one micro-step at a time",
    "(a1') accum-train, 1 at a time, threads": "(a1') (a1) under (a)'s thread pools",
    "(b) keras GA, fit": "(b) Keras 3 `gradient_accumulation_steps`, `fit`, compile defaults",
    "(b') keras GA, fit, spe=k": "(b') the same with `steps_per_execution=k`",
    "(b'') keras GA, spe=k, threads": "(b'') (b') under (a)'s thread pools",
    "(b''') keras GA, spe=k, XLA": "(b''') (b') with `jit_compile=True` (XLA)",
    "(c) tf1 session": "(c) TF1 Session, feed_dict per micro-batch",
    "(d) plain, micro-batch": "(d) plain, micro-batch {micro}",
    "(e) plain, whole batch": "(e) plain, whole batch {batch}",
}
A, A1, E = "(a) accum-train", "(a1) accum-train, 1 at a time", "(e) plain, whole batch"
# the per-variant keys of ratios_a_b_per_keras_variant, for the Keras variants under TensorFlow's default threads
KERAS_DEFAULT_THREADS = {"(b)": "(b) compile defaults", "(b')": "(b') spe=k"}
RATIO_HEADER = "ratio (3 decimals, rounded against accum-train)"


def against(value: float, higher_is_better: bool, places: str = "0.001") -> str:
    """``value`` rounded against accum-train: down where higher is better for it, up where lower is."""
    rounding = ROUND_FLOOR if higher_is_better else ROUND_CEILING
    return str(Decimal(repr(value)).quantize(Decimal(places), rounding=rounding))


def interval(paired: dict, higher_is_better: bool) -> str:
    """A paired ratio (benchmarks/paired.py) as "median [low, high]", each rounded against accum-train."""
    low, median, high = (against(paired[key], higher_is_better) for key in ("low", "median", "high"))
    return f"{median} [{low}, {high}]"


def caption(machine: str, commit: str | None, command: str, note: str = "") -> str:
    """The one line above a table that names where and from what it was measured."""
    return f"Measured on {machine}, {f'commit {commit}' if commit else 'commit not recorded'}: `{command}`{note}"


def two_figures(value: float) -> str:
    """2 significant figures, small ones as 2.2e-8 (what a distance's size says; the JSON has them in full)."""
    if value >= 0.01:
        return f"{value:.2g}"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def short_g(value: float) -> str:
    """3 significant figures, the exponent without padding (1.93e-5, not 1.93e-05)."""
    mantissa, _, exponent = f"{value:.3g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def _command(script: str, args: dict, keys: tuple[str, ...]) -> str:
    # the settings spelled out, not left to defaults, so the line reproduces the run even if a default changes
    options = "".join(f" --{key.replace('_', '-')} {args[key]}" for key in (*keys, "output"))
    return f"python benchmarks/{script}{options}"


def _machine(env: dict) -> str:
    cpu = f" ({env['cpu']})" if env.get("cpu") else ""  # recorded since benchmarks/provenance.py
    return (
        f"{env['cpus']} CPUs{cpu}, TensorFlow {env['tensorflow']}, Keras {env['keras']}, "
        f"load average {env['load_average_before'][0]:.1f} before the run"
    )


def _short(method: str) -> str:
    return method.split(" ", 1)[0]  # "(b'')"


def _times(report: dict) -> list[str]:
    """peers.py's and peers_keras.py's medians, one row per method."""
    args = report["args"]
    lines = [
        "| method | CPU ms/example | wall ms/example | examples/s | threads |",
        "|---|---:|---:|---:|---|",
    ]
    for name, r in report["time"].items():
        label = METHODS.get(name, name).format(micro=args["micro"], batch=int(args["k"]) * int(args["micro"]))
        threads = r["threads"]
        threads = "defaults" if isinstance(threads, str) else f"intra {threads['intra']}, inter {threads['inter']}"
        lines.append(
            f"| {label} | {1000 * r['cpu_s_per_example']:.3f} | {1000 * r['wall_s_per_example']:.3f} | "
            f"{r['examples_per_s']:.0f} | {threads} |"
        )
    return lines


def _headline(report: dict) -> list[tuple[str, str]]:
    """(label, value, target key) of the two a/b ratios, named after the Keras variant each was taken against."""
    cpu, wall = _short(report["a_b_against"]["cpu"]), _short(report["a_b_against"]["wall"])
    return [
        (f"(a)/{cpu} examples per CPU-second (the fastest Keras by CPU)", "a/b examples per CPU-second"),
        (f"(a)/{wall} examples per wall-second (the fastest Keras by wall time)", "a/b examples per wall-second"),
    ]


def fastest(times: dict, names) -> dict:
    """Of ``names``, the method that spent the least CPU time per example in ``times`` ("cpu") and the least wall
    time ("wall"): each side's best by each measure, as the a/b ratios take them."""
    return {
        measure: min(names, key=lambda name: times[name][f"{measure}_s_per_example"]) for measure in ("cpu", "wall")
    }


def _one_at_a_time(report: dict) -> list[tuple[str, float]]:
    """One micro-step at a time against the same fastest Keras variants: the gain that is not micro-steps in
    flight; ours the faster of (a1) and (a1') by each measure."""
    cpu, wall = _short(report["a_b_against"]["cpu"]), _short(report["a_b_against"]["wall"])
    one = {key: _short(name) for key, name in report["a1_best"].items()}
    details = report["ratios_a_b_per_keras_variant"]
    return [
        (
            f"{one['cpu']}/{cpu} examples per CPU-second",
            details["a1/b examples per CPU-second (one micro-step at a time)"],
        ),
        (
            f"{one['wall']}/{wall} examples per wall-second",
            details["a1/b examples per wall-second (one micro-step at a time)"],
        ),
    ]


def _one_pass(report: dict) -> list[tuple[str, float]]:
    """One plain pass over the whole batch, (e), against (a) and the same fastest Keras variants: the update with
    no micro-batches at all, for reference. Shown rounded up: (a)/(e) against accum-train, and (e)/Keras, which
    says how far a plain pass gets against Keras, never understated."""
    times, against_ = report["time"], report["a_b_against"]
    one_pass = times[E]
    cpu, wall = _short(against_["cpu"]), _short(against_["wall"])
    return [
        ("(a)/(e) CPU time per example", times[A]["cpu_s_per_example"] / one_pass["cpu_s_per_example"]),
        (
            f"(e)/{cpu} examples per CPU-second (one pass over the whole batch, no accumulation)",
            times[against_["cpu"]]["cpu_s_per_example"] / one_pass["cpu_s_per_example"],
        ),
        (
            f"(e)/{wall} examples per wall-second (the same)",
            times[against_["wall"]]["wall_s_per_example"] / one_pass["wall_s_per_example"],
        ),
    ]


def peers(report: dict) -> str:
    """benchmarks/peers.py's JSON: the medians per method, then the ratios with their targets."""
    ratios, targets, memory = report["ratios"], report["targets"], report["memory"]
    one_pass = memory[E]
    rows = [(label, key, True) for label, key in _headline(report)]  # bold: the two the targets are about
    rows += [("(a)/(c) examples per second", "a/c examples per second", False)]
    rows += [("(a)/(d) CPU time per example", "a/d CPU time per example", False)]
    lines = [f"| {RATIO_HEADER} | target | measured |", "|---|---|---:|"]
    for label, key, bold in rows:
        shown = against(ratios[key], targets[key]["higher_is_better"])
        lines.append(f"| {label} | {targets[key]['target'] or '-'} | {f'**{shown}**' if bold else shown} |")
    for method, key in ((A1, "a1/e TF allocator peak"), (A, "a/e TF allocator peak")):
        ours = memory[method]
        label = f"{_short(method)} k={ours['subdivisions']} / (e) TF allocator peak, batch {ours['batch_size']}"
        mib = f"({ours['peak_memory_bytes'] / MIB:.0f} vs {one_pass['peak_memory_bytes'] / MIB:.0f} MiB)"
        lines.append(f"| {label} | {targets[key]['target'] or '-'} | {against(ratios[key], False)} {mib} |")
    lines += [f"| {label} | - | {against(value, True)} |" for label, value in _one_at_a_time(report)]
    lines += [f"| {label} | - | {against(value, False)} |" for label, value in _one_pass(report)]
    env, args = report["environment"], report["args"]
    command = _command("peers.py", args, ("width", "k", "micro", "rounds", "updates", "mem_batch", "mem_k"))
    commit = report.get("commit") or env.get("commit")
    return "\n".join([caption(_machine(env), commit, command), "", *_times(report), "", *lines])


def peers_keras(report: dict) -> str:
    """benchmarks/peers_keras.py's JSON (the README's keras_file model): the medians, then the ratios."""
    details = report["ratios_a_b_per_keras_variant"]
    rows = [(label, f"**{against(report['ratios'][key], True)}**") for label, key in _headline(report)]
    # under TensorFlow's default threads, the Keras variant that spent less CPU: the smaller a/b ratio
    per_cpu = {name: details[f"a/b examples per CPU-second, {key}"] for name, key in KERAS_DEFAULT_THREADS.items()}
    best = min(per_cpu, key=per_cpu.get)
    shown = against(per_cpu[best], True)
    rows.append((f"(a)/{best} examples per CPU-second (best of compile defaults and `steps_per_execution=k`)", shown))
    defaults = [details[f"a/b examples per {per}-second, (b) compile defaults"] for per in ("CPU", "wall")]
    shown = ", ".join(against(value, True) for value in defaults)
    rows.append(("(a)/(b) examples per CPU-second, per wall-second (compile defaults)", shown))
    rows += [(label, against(value, True)) for label, value in _one_at_a_time(report)]
    rows += [(label, against(value, False)) for label, value in _one_pass(report)]
    lines = [f"| {RATIO_HEADER} | measured |", "|---|---:|", *(f"| {label} | {shown} |" for label, shown in rows)]
    command = _command("peers_keras.py", report["args"], ("k", "micro", "rounds", "updates"))
    env = report["environment"]
    commit = report.get("commit") or env.get("commit")
    return "\n".join([caption(_machine(env), commit, command), "", *_times(report), "", *lines])


def compare(report: dict) -> str:
    """`accum-train compare`'s compare.json: both runs' figures and their ratio, then the gradient check."""
    sub, base = report["subdivided"]["summary"], report["baseline"]["summary"]
    ratios, config = report["ratios"], report["config"]
    k = sub["subdivisions"]
    lines = [
        f"| | subdivided (k={k}) | baseline (one pass) | subdivided / baseline (rounded up) |",
        "|---|---:|---:|---:|",
        f"| test accuracy | {sub['test_accuracy']:.4f} | {base['test_accuracy']:.4f} | |",
    ]
    # costs: a ratio over 1 is subdivision's price, so it is rounded up, never in its favour
    for label, key, unit, scale in (
        ("wall time", "wall_time_s", "s", 1),
        ("CPU time", "cpu_time_s", "s", 1),
        ("TF allocator peak", "peak_memory_bytes", "MiB", MIB),
        ("peak RSS", "peak_rss_bytes", "MiB", MIB),
    ):
        lines.append(
            f"| {label} | {sub[key] / scale:.0f} {unit} | {base[key] / scale:.0f} {unit} | "
            f"{against(ratios[key], False, '0.01')}x |"
        )
    check = report["gradient_check"]
    lines += [
        "",
        f"| gradient check at the initial weights, first batch, k={check['subdivisions']} "
        "| max relative difference | max absolute difference |",
        "|---|---:|---:|",
        f"| BatchNorm in training mode | {short_g(check['max_rel_diff'])} | {short_g(check['max_abs_diff'])} |",
    ]
    if "bn_inference_mode" in check:
        inference = check["bn_inference_mode"]
        relative, absolute = short_g(inference["max_rel_diff"]), short_g(inference["max_abs_diff"])
        lines.append(f"| BatchNorm in inference mode | {relative} | {absolute} |")
    model = config["model"]
    setting = (
        f"{model['name']} width {model['width']}, batch {config['batch_size']}, subdivisions {config['subdivisions']},"
        f" {config['epochs']} epochs, {config['optimizer']['name']} {config['optimizer']['learning_rate']}"
    )
    where = report["subdivided"]["run_dir"].rsplit("/", 1)[0]
    line = caption(
        "a machine the JSON does not record",
        report.get("commit"),
        f"accum-train compare CONFIG --output-dir {where}",
        f", CONFIG as the JSON records it ({setting})",
    )
    return "\n".join([line, "", *lines])


def distributed(report: dict) -> str:
    """benchmarks/distributed.py's JSON as docs/distributed.md's table: per update, what each method runs and
    what it costs; the ratio of (n) to (a) rounded against accum-train."""
    import statistics

    machine, args = report["machine"], report["args"]
    command = _command("distributed.py", args, ("devices", "k", "micro", "width", "rounds", "updates"))
    lines = [
        caption(f"{args['devices']} logical CPUs of {machine['cpus']} ({machine['cpu']})", machine["commit"], command),
        "",
        "| per update | graph calls | gradient all-reduces | other collectives | wall s (median) | CPU s (median) |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for name, method in report["methods"].items():
        # a gradient all-reduce moves at least every gradient float; what it carries besides is named
        sizes = [size for kind, _, size in method["collectives"] if kind != "broadcast"]
        carried = max(sizes) if sizes else 0
        extra = f" ({carried:,} floats: the gradients and {carried - report['gradient_elements']} more)"
        gradient = f"{method['gradient_all_reduces']}" + (extra if carried > report["gradient_elements"] else "")
        others = [kind for kind, _, size in method["collectives"] if kind == "broadcast"]
        other = (
            f"{len(others)} broadcast"
            if len(others) == method["other_collectives"]
            else f"{method['other_collectives']}"
        )
        lines.append(
            f"| {name} | {method['graph_calls']} | {gradient} | {other} | "
            f"{statistics.median(method['wall_s']):.4f} | {statistics.median(method['cpu_s']):.4f} |"
        )
    ratios = report["ratios"]
    lines += ["", f"(n)/(a): {against(ratios['wall'], True)} wall, {against(ratios['cpu'], True)} CPU."]
    return "\n".join(lines)


# benchmarks/profile.py's kinds of kernel, as docs/performance.md names them
PROFILE_KINDS = {
    "convolutions": "convolutions (forward, both backward)",
    "batch norm": "batch norm (fused, with its gradient)",
    "activations": "activations, loss, pooling",
    "accumulation": "accumulation (cache and BatchNorm sums)",
    "loop, slicing": "loop control, micro-batch slices",
    "other in loop": "other ops in the micro-step",
    "after the loop": "after the loop (reduce, checks, Adam, fold)",
}


def profile(report: dict) -> str:
    """benchmarks/profile.py's JSON: ms per update of each variant, wall, CPU and kernel time by kind."""
    machine, variants = report["machine"], report["variants"]
    labels = list(variants)
    shown = [label + (" (default)" if label == "k=8, 2 at once" else "") for label in labels]
    command = f"python benchmarks/profile.py --updates {report['updates']} --output docs/profile.json"
    lines = [
        caption(f"{machine['cpus']} CPUs ({machine['cpu']})", machine["commit"], command),
        "",
        "| ms per update | " + " | ".join(shown) + " |",
        "|---|" + "---:|" * len(labels),
        "| wall | " + " | ".join(f"{variants[label]['wall_ms']:.1f}" for label in labels) + " |",
        "| CPU | " + " | ".join(f"{variants[label]['cpu_ms']:.1f}" for label in labels) + " |",
    ]
    for kind in report["kinds"]:
        cells = " | ".join(f"{variants[label]['op_ms'].get(kind, 0.0):.1f}" for label in labels)
        lines.append(f"| kernels: {PROFILE_KINDS.get(kind, kind)} | {cells} |")
    # CPU time no kernel accounts for: thread pools spinning and waking, Python, the executor itself
    outside = [variants[label]["cpu_ms"] - sum(variants[label]["op_ms"].values()) for label in labels]
    lines.append("| CPU not in a kernel | " + " | ".join(f"{value:.1f}" for value in outside) + " |")
    return "\n".join(lines)


def _main_job_caption(report: dict) -> str:
    machine = report["machine"]
    return caption(f"{machine['cpus']} CPUs ({machine['cpu']})", machine["commit"], report["command"])


def main_job(report: dict) -> str:
    """benchmarks/main_job.py's JSON as docs/development.md's table: what the main job reached and cost."""
    summary, epochs = report["summary"], report["epochs"]
    times = [epoch["elapsed_s"] for epoch in epochs]
    rows = [
        ("test accuracy", f"{summary['test_accuracy']:.4f}"),
        (
            "updates",
            f"{summary['steps']} of batch {summary['batch_size']}, {summary['subdivisions']} micro-batches each",
        ),
        ("micro-steps in flight", f"{summary['parallel_micro_steps']}"),
        ("training", f"{summary['wall_time_s']:.0f} s, epochs of {min(times):.0f}-{max(times):.0f} s"),
        ("CPU time", f"{summary['cpu_time_s']:.0f} s"),
        ("TF allocator peak", f"{summary['peak_memory_bytes'] / MIB:.0f} MiB"),
        ("peak RSS", f"{summary['peak_rss_bytes'] / MIB:.0f} MiB"),
    ]
    return "\n".join([_main_job_caption(report), "", "| | |", "|---|---:|", *(f"| {a} | {b} |" for a, b in rows)])


def noise_scale(report: dict, group: int = 6) -> str:
    """The main job's noise scale at each epoch's end, as its range over each ``group`` epochs (null where the
    estimate was not positive)."""

    def shown(value):
        return "null" if value is None else f"{value:.0f}"

    epochs = report["epochs"]
    spans, cells = [], []
    for start in range(0, len(epochs), group):
        part = epochs[start : start + group]
        values = [epoch["noise_scale"] for epoch in part]
        known = [value for value in values if value is not None]
        low = "null" if None in values else shown(min(known))
        high = shown(max(known)) if known else "null"
        spans.append(f"{part[0]['epoch']}-{part[-1]['epoch']}")
        cells.append(f"{low}-{high}")
    return "\n".join(
        [
            _main_job_caption(report),
            "",
            "| epochs | " + " | ".join(spans) + " |",
            "|---|" + "---|" * len(spans),
            "| noise scale | " + " | ".join(cells) + " |",
        ]
    )


def headline(reports: dict) -> str:
    """The README's results table: one figure per claim, each from its benchmark's JSON (``reports``: file name
    -> JSON), with the command that measured it and the results page that holds the whole table."""
    masked, peers, memory = reports["peers-masked.json"], reports["peers.json"], reports["memory-batch.json"]
    distance, ratios = masked["distance"], peers["ratios"]
    base, whole = peers["memory"][A1], peers["memory"][E]
    peaks = [row["peak_memory_bytes"] for row in memory["rows"]]
    batches = [row["batch_size"] for row in memory["rows"]]

    def mib(value):
        return f"{value / MIB:.0f} MiB"

    rows = [
        (
            f"weights after {masked['args']['distance_updates']} updates of a masked tagger, distance from "
            "whole-batch `model.fit`",
            f"accum-train {two_figures(distance['accum-train']['max_abs'])}; Keras `gradient_accumulation_steps` "
            f"{two_figures(distance['keras GA']['max_abs'])} ({two_figures(distance['keras GA']['relative'])} "
            "of the step)",
            f"`python benchmarks/peers_masked.py --rounds {masked['args']['rounds']}`",
            "[fit](docs/results/fit.md)",
        ),
        (
            "examples per CPU-second against Keras' own accumulation (its best variant), the masked tagger with "
            f"`trim_padding=True`, k={masked['args']['k']}",
            f"{against(masked['ratios']['cpu'], True)}x; without `trim_padding` "
            f"{against(masked['untrimmed']['ratios']['cpu'], True)}x; against Keras over micro-batches bucketed by "
            f"length (other updates) {against(masked['against_bucketed']['cpu'], True)}x",
            f"`python benchmarks/peers_masked.py --rounds {masked['args']['rounds']}`",
            "[fit](docs/results/fit.md)",
        ),
        (
            "examples per CPU-second against Keras' own accumulation (its best variant), seed convnet, "
            f"k={peers['args']['k']}",
            f"{against(ratios['a/b examples per CPU-second'], True)}x",
            "`python benchmarks/peers.py`",
            "[performance](docs/results/performance.md)",
        ),
        (
            f"TF allocator peak, k={base['subdivisions']} one micro-step at a time against one pass, "
            f"batch {base['batch_size']} (the stored training set is host memory outside it)",
            f"{against(ratios['a1/e TF allocator peak'], False)}x ({mib(base['peak_memory_bytes'])} against "
            f"{mib(whole['peak_memory_bytes'])})",
            "`python benchmarks/peers.py`",
            "[performance](docs/results/performance.md)",
        ),
        (
            f"TF allocator peak from batch {batches[0]} to the whole training set ({batches[-1]}), micro-batch "
            f"{memory['rows'][-1]['batch_size'] // memory['rows'][-1]['subdivisions']}",
            (
                f"{mib(min(peaks))} at every batch"
                if mib(min(peaks)) == mib(max(peaks))
                else f"{mib(min(peaks))} to {mib(max(peaks))}"
            )
            + f" (the largest {against(max(peaks) / min(peaks), False)}x the smallest)",
            "`python benchmarks/memory_batch.py`",
            "[memory](docs/results/memory.md)",
        ),
    ]
    if "main-job.json" in reports:
        job, epochs = reports["main-job.json"]["summary"], len(reports["main-job.json"]["epochs"])
        rows.append(
            (
                f"the main job's test accuracy (configs/fmnist.yaml: width 1/4, {epochs} epochs, "
                f"{job['subdivisions']} micro-batches per update)",
                f"{job['test_accuracy']:.4f}",
                "`make main`",
                "[development](docs/results/development.md)",
            )
        )
    lines = ["| what | measured | command | page |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {' | '.join(row)} |" for row in rows])
