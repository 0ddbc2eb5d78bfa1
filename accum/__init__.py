"""accum-train: exact gradient accumulation ("subdivisions") for TensorFlow.

The core package. ``config`` turns YAML into typed, validated objects;
``engine`` holds the gradient cache and the one-graph-call update; ``models``
and ``optim`` are the registries; ``config_run`` runs a config into a
run directory (``run_parts`` builds it, ``trainer`` is its loop); ``keras_fit`` is
``accum_train.fit``, model.fit with exact accumulation for any compiled Keras model. The
CLI (``accum_train.cli``) sits on top and is never imported from here.
"""

import os

# TensorFlow's CPU allocator keeps peak-memory statistics only in its BFC
# mode, read at TensorFlow's import; summary.json's peak_memory_bytes needs it.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

__version__ = "0.2.0"

from .api import run
from .errors import UserError
from .progress import Progress

__all__ = ["Progress", "UserError", "__version__", "fit", "run"]


def __getattr__(name):
    # accum_train.fit imports TensorFlow and Keras: only when it is first used (the CLI starts without them)
    if name == "fit":
        from .keras_fit import fit

        return fit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
