"""The one place an Accumulator is set up, for both doors and for compare's gradient check.

What the model decides is read from it here: the variables the engine writes (Keras' own storage, as the
optimizer and checkpoints see it), and whether micro-steps are traced for their size (a model that loops over
time runs leaner so, engine.py). What a door decides is passed in: k, the micro-steps in flight
(trainer/runtime.py's policy), the loss scale, the optimizer, and how a pulled element becomes a batch (``prepare``).
"""

from __future__ import annotations

import keras

from ...keras_private import loops_over_time, storage
from .engine import Accumulator


def accumulator_for(model, objective, optimizer, *, subdivisions: int, **options) -> Accumulator:
    """The Accumulator training ``model`` (a Keras model, or the CLI's models/containers.py wrapper of one or of a
    TensorLayer net) on ``objective``; ``options`` are the Accumulator's other keyword arguments."""
    network = model if isinstance(model, keras.Model) else getattr(model, "network", None)
    variables = model.trainable_variables
    if isinstance(model, keras.Model):
        variables = [storage(v) for v in variables]
    sized = isinstance(network, keras.Model) and loops_over_time(network)
    if isinstance(network, keras.Model):  # a weight's constraint, which Keras' optimizer reads off its own variable
        options["constraints"] = [v.constraint for v in network.trainable_variables]
    return Accumulator(objective, variables, optimizer, subdivisions=subdivisions, sized=sized, **options)
