"""Optimizer and learning-rate schedule registries.

Keras 3 optimizers apply cleanly to TensorLayer variables. The schedule is fed
``optimizer.iterations``, which the engine advances once per update (one
``apply_gradients`` per batch), so schedules and Adam's bias correction count
updates, never micro-batches.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from .config import OPTIMIZER_NAMES, SCHEDULE_NAMES, OptimizerConfig, ScheduleConfig


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to the peak over ``warmup_steps`` updates, then ``after``."""

    def __init__(self, peak, warmup_steps, after):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.after = after

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        decayed = (
            tf.cast(self.after(step - self.warmup_steps), tf.float32)
            if callable(self.after)
            else tf.constant(self.after, tf.float32)
        )
        if self.warmup_steps == 0:
            return decayed
        ramp = self.peak * (step + 1.0) / self.warmup_steps
        return tf.where(step < self.warmup_steps, ramp, decayed)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps}


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


def make_schedule(lr: float, cfg: ScheduleConfig, total_steps: int):
    """The learning rate as a function of the update count (or a constant)."""
    decay = _DECAYS[cfg.name]
    if decay is None and cfg.warmup_steps == 0:
        return lr
    after = lr if decay is None else decay(lr, cfg, cfg.decay_steps or max(1, total_steps - cfg.warmup_steps))
    return WarmupSchedule(lr, cfg.warmup_steps, after)


_OPTIMIZERS = {
    "adam": lambda lr, c: keras.optimizers.Adam(learning_rate=lr),
    "sgd": lambda lr, c: keras.optimizers.SGD(learning_rate=lr),
    "momentum": lambda lr, c: keras.optimizers.SGD(learning_rate=lr, momentum=c.momentum),
    "rmsprop": lambda lr, c: keras.optimizers.RMSprop(learning_rate=lr, rho=c.momentum),
}
if tuple(_OPTIMIZERS) != OPTIMIZER_NAMES:  # a registry out of step with the config is a bug
    raise ImportError(f"optimizer registry {tuple(_OPTIMIZERS)} != config.OPTIMIZER_NAMES {OPTIMIZER_NAMES}")


def make_optimizer(cfg: OptimizerConfig, schedule, variables) -> keras.optimizers.Optimizer:
    """A built optimizer (slots created now, outside any tf.function)."""
    optimizer = _OPTIMIZERS[cfg.name](schedule, cfg)
    optimizer.build(variables)
    return optimizer


def learning_rate_at(schedule, step: int) -> float:
    """The learning rate the update with 0-based index ``step`` used."""
    return float(schedule(step)) if callable(schedule) else float(schedule)
