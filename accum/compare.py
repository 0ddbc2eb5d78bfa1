"""Baseline vs subdivided: the evidence that accumulation buys memory with time.

``gradient_check`` compares, at the initial weights and on the first batch,
the accumulated gradient with the whole-batch gradient (and, for a model with
BatchNorm, the same with BatchNorm in inference mode, to show that the only
difference is micro-batch statistics). ``compare`` then trains the baseline
and the subdivided run from the same seed (same initial weights, same data
order), each in its own process so that each peak memory is its own, and
writes compare.json and compare.png. A baseline that runs out of memory is
reported, not fatal: that is the case subdivisions exist for.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .backends import active, tensorflow_only
from .config import Config
from .errors import OutOfMemory, UserError, WorkerFailed
from .files import atomic_write
from .from_config.source import with_model_source
from .processes import error_message, run_child, training_process
from .progress import Progress
from .trainer.data.batching import as_data
from .trainer.data.order import first_batch
from .trainer.store.metrics_log import is_epoch_record, read_metrics
from .trainer.store.rundir import check_output_dir, pyplot, save_figure, write_result

COST_KEYS = ("wall_time_s", "cpu_time_s", "examples_per_s", "peak_memory_bytes", "peak_rss_bytes")


def gradient_check(cfg: Config, data) -> dict:
    """Accumulated vs whole-batch gradient on the first batch at the initial weights.

    The accumulated side is the accumulator's own: it fills its caches with the
    k micro-batches of the batch, which are then read and cleared, never
    applied."""
    from .from_config.build import build_with_loss

    backend = active()
    data = with_model_source(data, cfg)
    model, objective = build_with_loss(cfg, data)
    x, y, weights = as_data(first_batch(data, cfg.seed, cfg.batch_size, cfg.data.shuffle))
    variables = model.trainable_variables
    names = [v.name.split(":")[0] for v in variables]
    k = min(cfg.subdivisions_for(cfg.batch_size), cfg.batch_size)
    groups = objective.groups

    def check(training: bool) -> dict:
        inference = objective if training else InferenceMode(objective)

        def full_loss():  # the whole batch's loss as the objective normalises it (without the weight regularizers)
            parts, _ = inference.evaluate(x, y, weights, training, groups)
            counts = [parts.counts[g] for g in groups if g in parts.counts]  # every normaliser but a sum's
            return backend.combine({"sums": [parts.sums[g] for g in groups], "counts": counts}, groups, 1)[1]

        full = backend.gradients(full_loss, variables)
        engine = backend.accumulator_for(model, inference, None, subdivisions=k, norm_layers=model.norm_layers)
        engine.accumulate_batch(x, y, sample_weight=weights)
        accumulated = engine.accumulated()
        engine.reset()  # nothing is applied, no statistic moves
        per_variable = {}
        for name, acc, ref in zip(names, accumulated, full):
            # an Embedding's gradient comes as tf.IndexedSlices; a variable the loss does not reach has none
            reference = np.zeros(acc.shape) if ref is None else backend.dense(ref).numpy().astype(np.float64)
            diff = acc.numpy().astype(np.float64) - reference
            per_variable[name] = {
                "max_abs_diff": float(np.max(np.abs(diff))),
                # relative to the gradient's own size: elementwise ratios blow up on zeros
                "max_rel_diff": float(np.linalg.norm(diff) / max(np.linalg.norm(reference), 1e-30)),
            }
        return {
            "max_abs_diff": max(v["max_abs_diff"] for v in per_variable.values()),
            "max_rel_diff": max(v["max_rel_diff"] for v in per_variable.values()),
            "per_variable": per_variable,
        }

    result = check(training=True)
    result["subdivisions"] = k
    result["bn_inference_mode"] = check(training=False) if model.norm_layers else None
    return result


class InferenceMode:
    """An objective evaluated in inference mode however it is asked (BatchNorm on its moving statistics): with
    it, what is left between the accumulated and the whole-batch gradient is not BatchNorm's."""

    def __init__(self, objective):
        self.objective, self.groups, self.kinds = objective, objective.groups, objective.kinds

    def evaluate(self, x, y, sample_weight, training, groups=None):
        return self.objective.evaluate(x, y, sample_weight, False, groups)

    def regularization(self):
        return self.objective.regularization()


def _curves(run_dir: Path) -> dict:
    epochs = [r for r in read_metrics(run_dir / "metrics.jsonl") if is_epoch_record(r)]
    keys = ["epoch", "train_loss", "test_loss", "examples_per_s"]
    score = score_key(epochs[0]) if epochs else None
    # null is how metrics.jsonl holds a NaN (a loss that diverged, no applied update): the table and plot show NaN
    return {key: [math.nan if r[key] is None else r[key] for r in epochs] for key in keys + ([score] if score else [])}


def score_key(record: dict) -> str | None:
    """The score a compare shows beside the losses: test_accuracy, or a Keras loss's run's first metric."""
    if "test_accuracy" in record:
        return "test_accuracy"
    return next((key for key in record if key.startswith("test_") and key != "test_loss"), None)


def run_side(config_path: Path, run_dir: Path, baseline: bool, progress: Progress) -> dict:
    """Train one side in a fresh process; its summary and curves, or why it could not run."""
    label = "baseline" if baseline else "subdivided"
    command = training_process(
        str(config_path), "--output-dir", str(run_dir), f"--set=baseline={str(baseline).lower()}"
    )
    progress.message(f"== {label} ==")
    child = run_child(command, say=lambda line: progress.message(f"  {line.rstrip()}"))
    if child.code == OutOfMemory.exit_code:
        message = error_message(child.error)  # "out of memory: ...": the reason, as the side printed it
        progress.message(f"  {label} could not run: {message}")
        return {"status": "out_of_memory", "message": message, "run_dir": str(run_dir)}
    if child.code != 0:
        raise WorkerFailed(f"the {label} run failed with exit code {child.code}: {child.error}")
    summary = json.loads((run_dir / "summary.json").read_text())
    curves = _curves(run_dir)
    summary["examples_per_s"] = float(np.mean(curves["examples_per_s"])) if curves["examples_per_s"] else None
    return {"status": "ok", "run_dir": str(run_dir), "curves": curves, "summary": summary}


def ratios(baseline: dict, subdivided: dict) -> dict | None:
    if baseline["status"] != "ok" or subdivided["status"] != "ok":
        return None
    pairs = {key: (subdivided["summary"].get(key), baseline["summary"].get(key)) for key in COST_KEYS}
    return {key: a / b if a is not None and b else None for key, (a, b) in pairs.items()}


def check_lines(check: dict) -> list[str]:
    """The gradient check as the run starts and the table ends with it: under BatchNorm, what is left in inference
    mode beside it, so that a large difference reads as what it is (micro-batch statistics)."""
    lines = [
        f"gradient check, first batch, initial weights, k={check['subdivisions']}: "
        f"max abs diff {check['max_abs_diff']:.3g}, max rel diff {check['max_rel_diff']:.3g}"
    ]
    if check["bn_inference_mode"]:
        bn = check["bn_inference_mode"]
        lines.append(
            f"  with BatchNorm in inference mode: max abs diff {bn['max_abs_diff']:.3g}, "
            f"max rel diff {bn['max_rel_diff']:.3g} (the rest is micro-batch statistics)"
        )
    return lines


def compare(cfg: Config, out_dir: Path, progress: Progress | None = None) -> dict:
    """Write out_dir/{config.yaml, baseline/, subdivided/, compare.json, compare.png}.

    The config, the output directory and the data are checked before anything is written."""
    progress = progress or Progress()
    tensorflow_only("accum-train compare")
    if cfg.auto_subdivisions:
        raise UserError("compare needs a fixed subdivisions (auto is decided inside the run): use --set subdivisions=K")
    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    from .from_config.build import load_data

    data = load_data(cfg)
    cfg = cfg.for_data(len(data.train))
    check = gradient_check(cfg, data)  # first: a model it cannot check leaves nothing written
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = out_dir / "config.yaml"
    atomic_write(config_path, cfg.to_yaml().encode())
    for line in check_lines(check):
        progress.message(line)
    baseline = run_side(config_path, out_dir / "baseline", True, progress)
    subdivided = run_side(config_path, out_dir / "subdivided", False, progress)
    if subdivided["status"] != "ok":
        raise OutOfMemory(f"the subdivided run ran out of memory too: {subdivided['message']}")
    result = {
        "config": cfg.to_dict(),
        "gradient_check": check,
        "baseline": baseline,
        "subdivided": subdivided,
        "ratios": ratios(baseline, subdivided),
    }
    write_result(out_dir, "compare", result, plot)
    return result


def plot(result: dict, path: Path) -> None:
    plt = pyplot()

    cfg = result["config"]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    sides = [
        ("baseline", f"baseline (batch {cfg['batch_size']} in one pass)", "tab:blue", "-"),
        ("subdivided", f"subdivided ({cfg['subdivisions']} micro-batches)", "tab:orange", "--"),
    ]
    score = score_key(result["subdivided"]["curves"])
    loss = "cross-entropy" if score == "test_accuracy" else "the model's loss"
    panels = [
        ("train_loss", f"train loss ({loss})"),
        ("test_loss", f"test loss ({loss})"),
        (score, "test accuracy (fraction correct)" if score == "test_accuracy" else score.replace("_", " ")),
    ]
    for ax, (key, title) in zip(axes, panels):
        for side, label, color, style in sides:
            if result[side]["status"] == "ok" and key in result[side]["curves"]:
                curves = result[side]["curves"]
                ax.plot(curves["epoch"], curves[key], style, color=color, marker="o", markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[3]
    labels = [side for side, *_ in sides]
    summaries = [result[side].get("summary") or {} for side in labels]
    allocator, rss = ([(s.get(key) or 0) / 2**20 for s in summaries] for key in ("peak_memory_bytes", "peak_rss_bytes"))
    pos = np.arange(len(labels))
    ax.bar(pos - 0.2, allocator, 0.4, label="TensorFlow allocator peak", color="tab:green")
    ax.bar(pos + 0.2, rss, 0.4, label="process peak RSS", color="tab:gray")
    for i, side in enumerate(labels):
        if result[side]["status"] != "ok":
            ax.text(i, 0, "out of\nmemory", ha="center", va="bottom", color="red")
    ax.set_xticks(pos, labels)
    ax.set_ylabel("MiB")
    ax.set_title("peak memory")
    ax.legend(fontsize=8)
    fig.suptitle(
        f"{cfg['model']['name']} x{cfg['model']['width']}, batch {cfg['batch_size']}, "
        f"{cfg['optimizer']['name']} lr {cfg['optimizer']['learning_rate']}"
    )
    fig.tight_layout()
    save_figure(fig, path)
