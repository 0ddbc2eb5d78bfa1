"""The optimizer section as the trainer takes it: the learning rate of each update (the schedule's warm-up and decay,
scale_learning_rate's factor for the batch in force), in keras.ops, and trainer/optim.py's optimizer."""

from __future__ import annotations

import keras
from keras import ops

from ..config import OPTIMIZER_NAMES, SCHEDULE_NAMES, OptimizerConfig, ScheduleConfig
from ..trainer.data.timeline import Phase
from ..trainer.optim import OPTIMIZERS, new_optimizer


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to the peak over ``warmup_steps`` updates, then ``after``."""

    def __init__(self, peak, warmup_steps, after):
        self.peak, self.warmup_steps, self.after = float(peak), int(warmup_steps), after

    def __call__(self, step):
        step = ops.cast(step, "float32")
        decayed = ops.cast(self.after(step - self.warmup_steps) if callable(self.after) else self.after, "float32")
        if self.warmup_steps == 0:
            return decayed
        ramp = self.peak * (step + 1.0) / self.warmup_steps
        return ops.where(step < self.warmup_steps, ramp, decayed)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps}


class BatchScaled(keras.optimizers.schedules.LearningRateSchedule):
    """``base`` (a schedule or a constant) times the factor of the batch in force: ``factors[i]`` from update
    ``starts[i]`` (0-based) on. What optimizer.scale_learning_rate gives under a batch_schedule."""

    def __init__(self, base, starts, factors):
        self.base, self.starts, self.factors = base, [int(s) for s in starts], [float(f) for f in factors]

    def __call__(self, step):
        step = ops.cast(step, "int64")
        starts = ops.convert_to_tensor(self.starts, "int64")
        index = ops.searchsorted(starts, ops.reshape(step, [1]), side="right")[0] - 1
        factor = ops.take(ops.convert_to_tensor(self.factors, "float32"), index)
        rate = self.base(step) if callable(self.base) else self.base
        return ops.cast(rate, "float32") * factor

    def get_config(self):
        return {"starts": self.starts, "factors": self.factors}


class Followed(keras.optimizers.schedules.LearningRateSchedule):
    """``base`` times ``factor``, a variable (the backend's ``state_variable``) the run sets to scale_learning_rate's
    factor for the batch in force: what batch_schedule's rule gives, whose batches are not known before the run
    makes them."""

    def __init__(self, base, factor):
        self.base, self.factor = base, factor

    def __call__(self, step):
        rate = self.base(step) if callable(self.base) else self.base
        return ops.cast(rate, "float32") * ops.cast(self.factor, "float32")

    def get_config(self):
        return {"factor": float(ops.convert_to_numpy(self.factor))}


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
    folded = factor is None and (scale.rule == "none" or not scheduled)
    rate = optimizer.learning_rate * scale.factor(batch_size) if folded else optimizer.learning_rate
    base = make_schedule(rate, optimizer.schedule, timeline.total_steps)
    if folded:
        return base
    if factor is not None:
        return Followed(base, factor)
    phases = timeline.phases or [Phase(0, 0, batch_size)]
    return BatchScaled(base, [p.step for p in phases], [scale.factor(p.batch_size) for p in phases])


def make_optimizer(cfg: OptimizerConfig, schedule, variables) -> keras.optimizers.Optimizer:
    """The optimizer ``cfg`` names at ``schedule``, built (slots created now, outside any tf.function)."""
    keys = ("momentum", "weight_decay", "trust_coefficient", "exclude_from_adaptation")
    optimizer = new_optimizer(cfg.name, schedule, **{key: getattr(cfg, key) for key in keys})
    optimizer.build(variables)
    return optimizer
