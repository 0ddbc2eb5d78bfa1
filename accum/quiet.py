"""TensorFlow's own log lines off unless asked for: a first run should not look like a failure. It is the
backend and the data layer (tf.data) alike, so what quiets it is said before it loads, in its environment
variable, and it loads with Keras, which loads the backend it runs on: no import of TensorFlow here."""

from __future__ import annotations

import os
import sys


def quiet_tensorflow(verbose: bool, load: bool = True) -> None:
    """TF_CPP_MIN_LOG_LEVEL=3 silences TensorFlow's logging once it runs
    (grappler's 'remapper failed' among it); child processes (workers,
    compare's runs, bench) inherit it. The oneDNN and absl lines printed while
    TensorFlow loads ignore it, so Keras' import, which loads it, runs with
    stderr closed. A Python error in the import still shows, after stderr is
    back. ``load``: import them now (a ``--workers`` supervisor never does)."""
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if not load or "keras" in sys.modules:
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import keras  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
