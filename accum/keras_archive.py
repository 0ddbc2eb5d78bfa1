"""What a .keras file says of itself, read without Keras or TensorFlow: its config.json.

The ``--workers`` supervisor, which never loads TensorFlow, decides from it whether a run's .npz holds
class labels or targets for the model's own loss (from_config.py)."""

from __future__ import annotations

import json
import zipfile


def compile_config(path: str) -> dict:
    """What ``compile()`` gave the model in a .keras file (its config.json's compile_config; {}: none).
    A file that cannot be read says so when it is loaded."""
    try:
        with zipfile.ZipFile(path) as archive:
            return json.loads(archive.read("config.json")).get("compile_config") or {}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return {}


def uses_keras_loss(model_cfg, loss) -> bool:
    """Whether a model config trains with a Keras loss (``loss``, the YAML's, or its keras_file's compile())
    rather than the built-in classification loss."""
    if model_cfg.name != "keras_file":
        return False
    return loss is not None or bool(compile_config(model_cfg.path).get("loss"))
