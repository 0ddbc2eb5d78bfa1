"""The optimizer and learning-rate schedule a config's optimizer section names, built from trainer/optim.py's pieces:
the schedule registry (schedule.name), the rate a run applies at each update (scale_learning_rate, batch_schedule)
and the optimizer with the section's settings."""

from __future__ import annotations

import keras

from ..config import OPTIMIZER_NAMES, SCHEDULE_NAMES, OptimizerConfig, ScheduleConfig
from ..trainer.data.timeline import Phase
from ..trainer.optim import OPTIMIZERS, BatchScaled, Followed, WarmupSchedule, new_optimizer

# schedule.name -> what follows the warm-up: the decay from the peak ``lr`` over ``length`` updates
# (decay_steps, or the run after warm-up), or None for the constant peak.
_DECAYS = {
    "constant": None,
    "cosine": lambda lr, cfg, length: keras.optimizers.schedules.CosineDecay(
        lr, decay_steps=length, alpha=cfg.min_ratio
    ),
    "exponential": lambda lr, cfg, length: keras.optimizers.schedules.ExponentialDecay(
        lr, decay_steps=length, decay_rate=cfg.decay_rate
    ),
}
if tuple(_DECAYS) != SCHEDULE_NAMES:  # a registry out of step with the config is a bug
    raise ImportError(f"schedule registry {tuple(_DECAYS)} != config.SCHEDULE_NAMES {SCHEDULE_NAMES}")
if tuple(OPTIMIZERS) != OPTIMIZER_NAMES:
    raise ImportError(f"optimizer registry {tuple(OPTIMIZERS)} != config.OPTIMIZER_NAMES {OPTIMIZER_NAMES}")


def make_schedule(lr: float, cfg: ScheduleConfig, total_steps: int):
    """The learning rate as a function of the update count (or a constant)."""
    decay = _DECAYS[cfg.name]
    if decay is None and cfg.warmup_steps == 0:
        return lr
    after = lr if decay is None else decay(lr, cfg, cfg.decay_steps or max(1, total_steps - cfg.warmup_steps))
    return WarmupSchedule(lr, cfg.warmup_steps, after)


def run_schedule(optimizer: OptimizerConfig, batch_size: int, scheduled: bool, timeline, factor=None):
    """The learning rate a run applies at each update: the schedule of optimizer.schedule, times
    scale_learning_rate's factor for the batch in force (``timeline``: accum.timeline.Timeline).
    One batch size folds the factor into the rate; a batch_schedule's changes (``scheduled``) multiply phase by
    phase; a batch_schedule rule multiplies by ``factor``, the variable the run keeps at the batch in force. Which
    depends on the config alone, not on the timeline: a constant rate is an optimizer variable and a schedule is
    not, so a run rebuilt without its training set (evaluate, export) must choose as training did."""
    scale = optimizer.scale_learning_rate
    if factor is not None:
        return Followed(make_schedule(optimizer.learning_rate, optimizer.schedule, timeline.total_steps), factor)
    if scale.rule == "none" or not scheduled:
        rate = optimizer.learning_rate * scale.factor(batch_size)
        return make_schedule(rate, optimizer.schedule, timeline.total_steps)
    base = make_schedule(optimizer.learning_rate, optimizer.schedule, timeline.total_steps)
    phases = timeline.phases or [Phase(0, 0, batch_size)]
    return BatchScaled(base, [p.step for p in phases], [scale.factor(p.batch_size) for p in phases])


def make_optimizer(cfg: OptimizerConfig, schedule, variables) -> keras.optimizers.Optimizer:
    """The optimizer ``cfg`` names at ``schedule``, built (slots created now, outside any tf.function)."""
    optimizer = new_optimizer(
        cfg.name, schedule, cfg.momentum, cfg.weight_decay, cfg.trust_coefficient, cfg.exclude_from_adaptation
    )
    optimizer.build(variables)
    return optimizer
