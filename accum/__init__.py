"""accum-train: exact gradient accumulation ("subdivisions") for TensorFlow.

The core package. ``config`` turns YAML into typed, validated objects; ``trainer`` is what both doors train
with (the loop, the memory guard, the feed, the run directory); ``backends`` runs its updates behind one seam (the
accumulator in ``backends.tensorflow.engine``); ``from_config`` is the CLI's front end, which resolves a config
into data, a model with its objective and settings for the trainer (``run`` is its Python entry); ``keras_fit``
is ``accum_train.fit``, model.fit with exact accumulation for any compiled Keras model. The CLI
(``accum_train.cli``) sits on top and is never imported from here.
"""

import os

# TensorFlow's CPU allocator keeps peak-memory statistics only in its BFC
# mode, read at TensorFlow's import; summary.json's peak_memory_bytes needs it.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

__version__ = "0.2.0"

from .errors import UserError
from .from_config.api import run
from .progress import Progress

__all__ = ["Progress", "UserError", "__version__", "fit", "run"]


def __getattr__(name):
    # accum_train.fit imports Keras (and, past its door, TensorFlow): only when first used (the CLI starts without them)
    if name == "fit":
        from .keras_fit.fit import fit

        return fit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
