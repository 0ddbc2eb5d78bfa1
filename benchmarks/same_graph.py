"""Does an update run the same graph in an earlier commit's tree and in this one? A timing difference between two
trees comes from the code only where what the update runs differs; this settles that without a clock.

    python benchmarks/same_graph.py REV [--method NAME ...] [--output FILE.json]

For each accum-train method of peers_causal_lm.py (its small GPT-2 causal LM and synthetic data, its defaults), one
child process per tree (REV's a temporary git worktree, imported through versus.py's package folder, as
same_bits.py does: no second venv) makes one untimed accum_train.fit call of --updates updates (tracing, warm-up)
and then a second one, and records:

- every graph the accumulator traced (each concrete function of its tf.functions, its function library included),
  as GraphDef text: node order, names, inputs and attributes, TensorFlow's numeric uids normalised;
- the graph of the tf.data pipeline the second call iterated (its arrays included), normalised the same way;
- each tf.function's tracing count after the second call (a retrace in it is a difference too);
- the trained weights;
- the second call's CPU seconds, inside the update's graph calls and outside them (the host: Python, the feed's
  set-up).

Graphs, pipeline, tracing counts and weights must be equal (the exit code says so); the CPU split is printed, not
judged: timing varies from process to process of the same tree by
a few percent on a loaded 2-core machine, which this script does not try to measure away.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import versus  # benchmarks/ is on sys.path: this script runs from there

# the uids TensorFlow puts in names (a suffix) and in a tf.data function's argument names (a bare number): new in
# every process, and shifted by any graph built before
UID = re.compile(r'_\d{3,}\b|(?<=s: ")\d{3,}(?=")')
# a name scope's counter inside a node's name ("cond_adam_3_cast" and "cond_adam_1_cast"), blanked only to say
# whether two graphs that differ differ in names alone
COUNTER = re.compile(r"_\d+(?=[_\"/:])")


def child(method: str, updates: int, out: Path) -> None:
    """In one tree's environment: the records above of ``method``, written under ``out``."""
    import accum_train  # noqa: F401  (before TensorFlow: the allocator it sets)
    import peers_causal_lm as peers
    import tensorflow as tf
    from tensorflow.python.data.ops import dataset_ops

    try:  # the engine fit built for a model: in train.py since fit's door and its Trainer path came apart
        from accum_train.keras_fit.train import _ENGINES
    except ImportError:  # an earlier tree: in fit.py
        from accum_train.keras_fit.fit import _ENGINES

    datasets, iterated = [], dataset_ops.DatasetV2.__iter__

    def recording_iter(self):
        datasets.append(self)
        return iterated(self)

    dataset_ops.DatasetV2.__iter__ = recording_iter
    args = argparse.Namespace(V=1000, L=2, heads=4, D=64, T=128, k=8, micro=8, lr=0.001, seed=0)
    x, y, w, _ = peers.make_data(updates * args.k * args.micro, args, "random")
    model = peers.build_model(args)
    run = peers.training(method, model, x, y, w, args)
    run()
    (engine, _evaluation), *_ = _ENGINES[model].values()
    functions = {name: f for name, f in sorted(vars(engine).items()) if hasattr(f, "experimental_get_tracing_count")}
    inner, inside = engine._update_pulled, [0.0]

    def timed(*args, **kwargs):
        started = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            inside[0] += time.process_time() - started

    engine._update_pulled = timed
    started = time.process_time()
    run()
    total = time.process_time() - started
    engine._update_pulled = inner
    lines = []
    for name, function in functions.items():
        lines.append(f"##### {name}: traced {function.experimental_get_tracing_count()} times")
        for concrete in sorted(
            function._list_all_concrete_functions(), key=lambda c: str(c.structured_input_signature)
        ):
            lines += [f"### {concrete.structured_input_signature}", str(concrete.graph.as_graph_def())]
    (out / "graphs.txt").write_text(UID.sub("_N", "\n".join(lines)))
    pipeline = tf.compat.v1.GraphDef.FromString(datasets[-1]._as_serialized_graph().numpy())
    (out / "pipeline.txt").write_text(UID.sub("_N", str(pipeline)))
    np.savez(out / "weights.npz", *model.get_weights())
    record = {"cpu_s": total, "graph_cpu_s": inside[0], "host_cpu_s": total - inside[0]}
    (out / "record.json").write_text(json.dumps(record))


def compare(old: Path, new: Path) -> dict:
    """What must be equal, and each side's CPU split; where graphs.txt differs, the differing lines' count and
    first pair, and whether the graphs match op for op once every name scope's counter is blanked (``name_counters``:
    a scope Keras entered more often before the trace, as ``adam_3`` for ``adam_1``, renames nodes and nothing else)."""
    texts = {name: ((old / name).read_text(), (new / name).read_text()) for name in ("graphs.txt", "pipeline.txt")}
    same = {name: a == b for name, (a, b) in texts.items()}
    with np.load(old / "weights.npz") as a, np.load(new / "weights.npz") as b:
        same["weights"] = a.files == b.files and all(a[n].tobytes() == b[n].tobytes() for n in a.files)
    cpu = {name: json.loads((side / "record.json").read_text()) for name, side in (("old", old), ("new", new))}
    report = {"same": same, "cpu": cpu}
    if not same["graphs.txt"]:
        a, b = (text.splitlines() for text in texts["graphs.txt"])
        pairs = [(x, y) for x, y in zip(a, b) if x != y]
        blank = [COUNTER.sub("_N", text) for text in texts["graphs.txt"]]
        report["graphs"] = {
            "lines": [len(a), len(b)],
            "differing_lines": len(pairs) + abs(len(a) - len(b)),
            "first": [line.strip() for line in pairs[0]] if pairs else None,
            "equal_but_name_counters": blank[0] == blank[1],
        }
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev", nargs="?", help="the earlier commit (anything git rev-parse takes)")
    parser.add_argument("--method", action="append", help="a peers_causal_lm.py method (default: (a))")
    parser.add_argument("--updates", type=int, default=10, help="updates per fit call")
    parser.add_argument("--output", type=Path, default=None, help="also write the comparison as JSON here")
    parser.add_argument("--serve", nargs=2, default=None, help=argparse.SUPPRESS)  # a child: METHOD OUT
    args = parser.parse_args()
    if args.serve:
        return child(args.serve[0], args.updates, Path(args.serve[1]))
    if args.rev is None:
        parser.error("give REV, the earlier commit")
    old_commit = versus.git("rev-parse", "--short", f"{args.rev}^{{commit}}")
    report = {"old": old_commit, "new": versus.provenance.commit(), "methods": {}}
    with versus.two_trees(old_commit, "same-graph-") as (scratch, trees, _imports):
        for method in args.method or ["(a) accum-train"]:
            outs = {}
            for side, (_, env) in trees.items():
                outs[side] = scratch / f"{len(report['methods'])}-{side}"
                outs[side].mkdir()
                command = [sys.executable, __file__, "--serve", method, str(outs[side])]
                done = subprocess.run(
                    [*command, "--updates", str(args.updates)],
                    cwd=Path(__file__).parent,  # this tree's peers_causal_lm.py: the same model and data for both
                    env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    raise SystemExit(f"{method} failed in the {side} tree ({done.returncode}):\n{done.stderr[-3000:]}")
            result = report["methods"][method] = compare(outs["old"], outs["new"])
            said = ", ".join(f"{name} {'equal' if same else 'DIFFERENT'}" for name, same in result["same"].items())
            if "graphs" in result:
                found = result["graphs"]
                alone = "in name-scope counters alone" if found["equal_but_name_counters"] else "in ops"
                said += f" ({found['differing_lines']} lines, {alone}; first: {found['first']})"
            cpu = {side: f"{r['graph_cpu_s']:.3f} + {r['host_cpu_s']:.3f}" for side, r in result["cpu"].items()}
            print(
                f"{method}: {said}; CPU s of a call of {args.updates} updates, graph + host: old {cpu['old']}, "
                f"new {cpu['new']}",
                flush=True,
            )
    if args.output is not None:
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(0 if all(all(r["same"].values()) for r in report["methods"].values()) else 1)


if __name__ == "__main__":
    main()
