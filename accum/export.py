"""A trained run as a standard Keras 3 model file (``accum-train export``).

``export_run(run_dir)`` loads the run's model at its newest intact checkpoint through the one loader
(accum/loader.py) and writes it to RUN_DIR/model.keras, or for a run directory of accum_train.fit to
RUN_DIR/export.keras (model.keras there is fit's own): the loader's ``export_name``. The file holds a plain Keras
model that ``keras.models.load_model`` opens with nothing of accum-train installed, uncompiled as every export is
(the optimizer's state stays in the checkpoint): a run of 'accum-train run' has its network rebuilt in built-in
Keras layers (models/to_keras.py), and fit's model, a Keras model already, is written as it is.
"""

from __future__ import annotations

from pathlib import Path

from .files import atomic_write, check_output_file, keras_bytes
from .loader import read_run


def export_run(run_dir: Path, output: Path | None = None, overwrite: bool = False) -> Path:
    """Write the run's trained model to ``output`` (default RUN_DIR/model.keras; for a fit output_dir,
    RUN_DIR/export.keras); the path written.

    An existing file is replaced only with ``overwrite`` (atomically: a reader
    sees the old file or the new one)."""
    run = read_run(run_dir)  # a directory that is not a run fails here, before anything is built
    output = Path(output) if output is not None else run.run_dir / run.export_name
    check_output_file(output, overwrite, ".keras", "Keras 3's model file format")
    atomic_write(output, keras_bytes(run.keras_model()))
    return output
