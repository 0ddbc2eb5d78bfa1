"""The optimizers by name, LARS and LAMB among them, in keras.ops; the config's choice is from_config/optim.py's.

Keras 3 optimizers apply cleanly to TensorLayer variables. The schedule is fed ``optimizer.iterations``, which the
engine advances once per update (one ``apply_gradients`` per batch), so schedules and Adam's bias correction count
updates, never micro-batches.
"""

from __future__ import annotations

import re

import keras
from keras import ops

from ..defaults import CLI


class _LayerWise(keras.optimizers.Optimizer):
    """The layer-wise adaptive optimizers' common part: which variables get the trust ratio and weight decay.

    ``exclude`` None leaves out every variable with one axis (biases, normalisation scales and offsets), as
    both papers do; otherwise the variables whose path (``variable.path``, TensorLayer's ``name``) one of the
    regular expressions is found in. Excluded variables take the plain step (momentum SGD, Adam). The weight
    decay here is the papers' (inside the trust ratio), not Keras' decoupled ``weight_decay``, left None."""

    def __init__(self, learning_rate, weight_decay: float, exclude, name: str):
        super().__init__(learning_rate=learning_rate, name=name)
        self.decay = float(weight_decay)
        self.exclude = None if exclude is None else tuple(exclude)

    def adapts(self, variable) -> bool:
        if self.exclude is None:
            return len(variable.shape) > 1
        path = getattr(variable, "path", None) or variable.name
        return not any(re.search(pattern, path) for pattern in self.exclude)

    @staticmethod
    def trust_ratio(weights_norm, step_norm):
        """||w|| / ||step||, or 1 when either is zero (a variable at zero, or nothing to do)."""
        return ops.where(
            ops.greater(weights_norm, 0.0),
            ops.where(ops.greater(step_norm, 0.0), weights_norm / ops.maximum(step_norm, 1e-38), 1.0),
            1.0,
        )

    def get_config(self):
        """The constructor's arguments (from_config rebuilds it); the rate as Keras serialises it."""
        rate = super().get_config()["learning_rate"]
        return {"learning_rate": rate, "weight_decay": self.decay, "exclude": self.exclude}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        if isinstance(config["learning_rate"], dict):
            config["learning_rate"] = keras.optimizers.schedules.deserialize(config["learning_rate"])
        return cls(**config)


def _norm(tensor):
    return ops.sqrt(ops.sum(ops.square(tensor)))


class LARS(_LayerWise):
    """Layer-wise Adaptive Rate Scaling (You, Gitman, Ginsburg 2017, Algorithm 1), per adapted variable w:
    local = eta ||w|| / (||g|| + beta ||w||);  v = m v + lr local (g + beta w);  w -= v.
    Excluded variables: v = m v + lr g (momentum SGD, no decay)."""

    def __init__(self, learning_rate, momentum=0.9, weight_decay=0.0, trust_coefficient=0.001, exclude=None):
        super().__init__(learning_rate, weight_decay, exclude, name="lars")
        self.momentum, self.trust_coefficient = float(momentum), float(trust_coefficient)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._velocities = [self.add_variable_from_reference(v, "velocity") for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        velocity = self._velocities[self._get_variable_index(variable)]
        if self.adapts(variable):
            w_norm, g_norm = _norm(variable), _norm(gradient)
            local = self.trust_coefficient * self.trust_ratio(w_norm, g_norm + self.decay * w_norm)
            step = lr * local * (gradient + self.decay * variable)
        else:
            step = lr * gradient
        self.assign(velocity, self.momentum * velocity + step)
        self.assign_sub(variable, velocity)

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "trust_coefficient": self.trust_coefficient}


class LAMB(_LayerWise):
    """Layer-wise Adaptive Moments for Batch training (You et al. 2019, Algorithm 2), per adapted variable w:
    Adam's moments with bias correction, r = m^ / (sqrt(v^) + eps) + beta w, w -= lr ||w|| / ||r|| r.
    Excluded variables: w -= lr m^ / (sqrt(v^) + eps) (Adam, no decay). With weight_decay 0 and nothing
    excluded it is keras.optimizers.Lamb."""

    def __init__(self, learning_rate, weight_decay=0.0, exclude=None, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
        super().__init__(learning_rate, weight_decay, exclude, name="lamb")
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._momentums = [self.add_variable_from_reference(v, "momentum") for v in variables]
        self._velocities = [self.add_variable_from_reference(v, "velocity") for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        t = ops.cast(self.iterations + 1, variable.dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        self.assign(m, self.beta_1 * m + (1.0 - self.beta_1) * gradient)
        self.assign(v, self.beta_2 * v + (1.0 - self.beta_2) * ops.square(gradient))
        m_hat = m / (1.0 - ops.power(ops.cast(self.beta_1, variable.dtype), t))
        v_hat = v / (1.0 - ops.power(ops.cast(self.beta_2, variable.dtype), t))
        step = m_hat / (ops.sqrt(v_hat) + self.epsilon)
        if self.adapts(variable):
            step = step + self.decay * variable
            step = self.trust_ratio(_norm(variable), _norm(step)) * step
        self.assign_sub(variable, lr * step)

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon}


# The optimizers by name (config.OPTIMIZER_NAMES: from_config/optim.py checks the two agree) at a rate or a schedule,
# with ``s(key)``, the optimizer section's setting ``key``.
OPTIMIZERS = {
    "adam": lambda lr, s: keras.optimizers.Adam(learning_rate=lr),
    "sgd": lambda lr, s: keras.optimizers.SGD(learning_rate=lr),
    "momentum": lambda lr, s: keras.optimizers.SGD(learning_rate=lr, momentum=s("momentum")),
    "rmsprop": lambda lr, s: keras.optimizers.RMSprop(learning_rate=lr, rho=s("momentum")),
    "lars": lambda lr, s: LARS(
        lr, s("momentum"), s("weight_decay"), s("trust_coefficient"), s("exclude_from_adaptation")
    ),
    "lamb": lambda lr, s: LAMB(lr, s("weight_decay"), s("exclude_from_adaptation")),
}


def new_optimizer(name: str, schedule, **settings) -> keras.optimizers.Optimizer:
    """The optimizer ``name`` at ``schedule`` (a rate or a LearningRateSchedule), not built yet; ``settings`` by the
    optimizer section's names (momentum, weight_decay, ...), the config's default where one is left out."""
    return OPTIMIZERS[name](schedule, lambda key: settings.get(key, CLI[f"optimizer.{key}"]))


def learning_rate_at(schedule, step: int) -> float:
    """The learning rate the update with 0-based index ``step`` used."""
    return float(schedule(step)) if callable(schedule) else float(schedule)
