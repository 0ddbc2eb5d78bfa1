"""What a config will do, worked out before anything is trained (``accum-train plan``).

``plan(cfg)`` loads and checks the data exactly as a run does (so it fails
with the same one-line errors), builds the model (so a model file is checked
too) and returns a plain dict: the dataset, the global batch and how each
batch is cut into micro-batches, updates per epoch and in all, the short last
batch of each epoch and its own split, the learning rate where the schedule
turns, and warnings about settings that train badly. Nothing is trained and
nothing is written. The numbers come from the code training uses
(``engine.micro_bounds``, ``Config.resolved``, ``optim.make_schedule``), so
the plan cannot drift from what a run does.
"""

from __future__ import annotations

import math
from collections import Counter

from .backends import active, tensorflow_only
from .config import Config
from .from_config.advice import split_warnings
from .from_config.build import build_with_loss, load_data, parallel_micro_steps
from .from_config.optim import run_schedule
from .from_config.source import with_model_source
from .trainer.data.batching import largest_micro_batch, micro_bounds
from .trainer.data.timeline import Timeline
from .trainer.optim import learning_rate_at


def micro_split(n: int, subdivisions: int) -> list[list[int]]:
    """[[count, size], ...] of the micro-batches a batch of ``n`` examples is cut into, smallest first.

    The engine cuts a batch into ``min(subdivisions, n)`` pieces with
    ``micro_bounds`` (sizes differ by at most one); this counts them."""
    k = min(subdivisions, n)
    sizes = Counter(end - start for start, end in (micro_bounds(i, n, k) for i in range(k)))
    return [[sizes[size], size] for size in sorted(sizes)]


# What the built-in loss is, as plan shows a Keras loss's (KerasLoss.describe)
BUILT_IN_OBJECTIVE = {
    "loss": [{"output": None, "loss": "sparse_categorical_crossentropy (on logits)", "weight": None}],
    "metrics": ["accuracy"],
}


def plan(cfg: Config, data=None) -> dict:
    """The plan of a run of ``cfg``; ``data`` is loaded unless given."""
    tensorflow_only("accum-train plan")
    if data is None:
        data = load_data(cfg)  # the same checks, and the same errors, as a run's start
    n_train = len(data.train)
    whole_set, cfg = cfg.whole_set, cfg.for_data(n_train)
    timeline = Timeline(n_train, cfg.epochs, cfg.batch_size, cfg.batch_changes)
    first, end = timeline.epoch_range(0)
    per_epoch = end - first  # the first epoch's (a batch_schedule's phases list each of theirs)
    total_updates = timeline.total_steps
    cfg = cfg.resolved(total_updates)  # decay_steps as the run would fix it at its start
    schedule = run_schedule(cfg.optimizer, cfg.batch_size, bool(cfg.batch_changes), timeline)  # the run's rates
    from .models.keras_loss import describe_loss  # imports TensorLayer, which starts the runtime

    data = with_model_source(data, cfg)  # data given without its model: cfg's
    model, loss = build_with_loss(cfg, data)  # a Keras loss traced on the data: bad targets fail here
    groups = len(loss.groups)  # the loss's normalisers: one gradient cache each
    objective = describe_loss(loss) if isinstance(loss, active().KerasObjective) else BUILT_IN_OBJECTIVE

    # The baseline runs the whole batch in one pass: one "micro-batch".
    subdivisions = 1 if cfg.baseline else cfg.subdivisions_for(cfg.batch_size)
    rest = n_train % cfg.batch_size
    fixed_k = None if subdivisions == "auto" else subdivisions
    full_batch = {
        "size": cfg.batch_size,
        "count": n_train // cfg.batch_size,
        "micro_batches": micro_split(cfg.batch_size, fixed_k) if fixed_k else None,
    }
    last_batch = {"size": rest, "micro_batches": micro_split(rest, fixed_k) if fixed_k else None} if rest else None

    parameters = sum(int(v.shape.num_elements()) for v in model.trainable_variables)
    result = {
        "data": {
            "name": cfg.data.name,
            "source": data.source,
            "train_examples": n_train,
            "validation_examples": len(data.validation) if data.validation is not None else 0,
            "augment": {"flip": cfg.data.augment.flip, "crop": cfg.data.augment.crop},
            "trim_padding": cfg.data.trim_padding,
            "test_examples": len(data.test),
            "input_shape": list(data.input_shape),
            "num_classes": data.num_classes,
            "class_names": list(data.class_names),
        },
        "model": {
            "name": cfg.model.name,
            "path": cfg.model.path,
            "trainable_parameters": parameters,
            "batchnorm_layers": len(model.norm_layers),
            # float32 whatever the precision (gradient_cache.py); the baseline keeps none
            "gradient_cache_bytes": None if cfg.baseline else 4 * parameters * groups,
        },
        **objective,
        "batch_size": cfg.batch_size,
        "whole_training_set": whole_set,  # batch_size: all
        "subdivisions": subdivisions,
        "micro_batch_size": cfg.micro_batch_size,
        "parallel_micro_steps": parallel_micro_steps(cfg),
        "baseline": cfg.baseline,
        "memory_limit": cfg.memory_limit,
        "strategy": cfg.strategy.name,
        "full_batch": full_batch,
        "last_batch": last_batch,
        "updates_per_epoch": per_epoch,
        "epochs": cfg.epochs,
        "total_updates": total_updates,
        "learning_rate": _learning_rates(cfg, timeline, schedule),
        "phases": _phases(cfg, timeline, schedule) if len(timeline.phases) > 1 else None,
        "noise_scale": _noise_scale(cfg, subdivisions),
    }
    result["warnings"] = _warnings(result, cfg)
    return result


def _noise_scale(cfg: Config, subdivisions) -> dict:
    """Whether each update measures the gradient noise scale (noise.py: it needs two micro-batches or more), how
    it is averaged, and batch_schedule's rule that follows it."""
    from .defaults import NOISE_DECAY

    # not under data.trim_padding: its micro-batches are grouped by length, not drawn at random (run says so too)
    split = subdivisions == "auto" or subdivisions >= 2
    measured = not cfg.baseline and split and cfg.data.trim_padding is None
    rule = cfg.batch_rule
    return {
        "measured": measured,
        "decay": NOISE_DECAY if measured else None,
        "rule": None
        if rule is None
        else {
            "rule": rule.rule,
            "max_batch_size": rule.max_batch_size,
            "every_epochs": rule.every_epochs,
            "micro_batch_size": cfg.micro_batch_size,
        },
    }


def _phases(cfg: Config, timeline: Timeline, schedule) -> list[dict]:
    """Each batch size of a batch_schedule: where it starts, its k, updates per epoch and learning rate there
    (``schedule``: the run's, optim.run_schedule)."""
    phases = []
    for phase in timeline.phases:
        k = 1 if cfg.baseline else cfg.subdivisions_for(phase.batch_size)
        phases.append(
            {
                "update": phase.step + 1,
                "epoch": phase.epoch + 1,
                "batch_size": phase.batch_size,
                "subdivisions": k,
                "micro_batch": largest_micro_batch(phase.batch_size, 1, k),
                "updates_per_epoch": math.ceil(timeline.n_train / phase.batch_size),
                "last_batch": timeline.n_train % phase.batch_size,  # each epoch's short last batch (0: none)
                "learning_rate": learning_rate_at(schedule, phase.step),
            }
        )
    return phases


def _learning_rates(cfg: Config, timeline: Timeline, schedule) -> dict:
    """The rate the optimizer applies (``schedule``) at the first update, at the end of warm-up and at the last
    update, and how scale_learning_rate scales it."""
    schedule_cfg, total_updates = cfg.optimizer.schedule, timeline.total_steps
    warmup = schedule_cfg.warmup_steps
    scale = cfg.optimizer.scale_learning_rate

    def at(update: int) -> dict:  # 1-based update numbers, as metrics.jsonl counts them
        return {"update": update, "value": learning_rate_at(schedule, update - 1)}

    return {
        "optimizer": cfg.optimizer.name,
        "peak": cfg.optimizer.learning_rate,
        "schedule": schedule_cfg.name,
        "warmup_steps": warmup,
        "decay_steps": schedule_cfg.decay_steps,
        "first": at(1),
        "warmup_end": at(warmup) if 0 < warmup <= total_updates else None,
        "last": at(total_updates),
        # the configured peak is for base_batch_size; the run's peak at batch_size (the first batch)
        "scaled": None
        if scale.rule == "none"
        else {
            "rule": scale.rule,
            "base_batch_size": scale.base_batch_size,
            "peak": cfg.optimizer.learning_rate * scale.factor(cfg.batch_size),
        },
    }


def _warnings(result: dict, cfg: Config) -> list[str]:
    k = result["subdivisions"]
    warnings = []
    if k == "auto" and not cfg.baseline:
        warnings.append(
            f"subdivisions=auto: the split is chosen when the run starts, the fewest micro-batches "
            f"whose update fits in memory_limit={cfg.memory_limit}; the micro-batch checks are "
            f"skipped"
        )
    fixed = None if k == "auto" or cfg.baseline else k
    n_train = result["data"]["train_examples"]
    warnings += split_warnings(cfg, fixed, n_train, result["model"]["batchnorm_layers"], result["total_updates"])
    if cfg.strategy.name != "default":
        warnings.append(
            f"strategy.name={cfg.strategy.name}: batch_size is global; each replica takes its share "
            f"and cuts it into subdivisions={k} micro-batches, so micro-batches are smaller than "
            f"shown here (which is for one device)"
        )
    return warnings
