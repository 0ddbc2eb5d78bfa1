"""A trained run as a standard Keras 3 model file.

``export_run(run_dir)`` loads the run's latest checkpoint (accum/reload.py)
and writes RUN_DIR/model.keras, which ``keras.models.load_model`` opens with
nothing of accum-train installed: only built-in Keras layers and plain
weights (models/to_keras.py rebuilds the run's network in them).

A run directory of accum_train.fit holds a Keras model already (the file fit
saved as the run began): it is written as it is, with the checkpoint's
weights, uncompiled as every export is (the optimizer's state stays in the
checkpoint), to RUN_DIR/export.keras by default: model.keras there is fit's.
"""

from __future__ import annotations

from pathlib import Path

from .files import atomic_write, check_output_file, keras_bytes

# The default export of a fit output_dir: fit writes model.keras itself each time a call returns, so that name would
# be taken on every finished directory and replaced by the next call on an unfinished one.
FIT_EXPORT = "export.keras"


def export_run(run_dir: Path, output: Path | None = None, overwrite: bool = False) -> Path:
    """Write the run's trained model to ``output`` (default RUN_DIR/model.keras; for a fit output_dir,
    RUN_DIR/export.keras); the path written.

    An existing file is replaced only with ``overwrite`` (atomically: a reader
    sees the old file or the new one)."""
    from .reload import describe_run, load_fit_run, load_run
    from .trainer.rundir import is_fit_run_dir

    run_dir = Path(run_dir)
    fit = is_fit_run_dir(run_dir)
    if not fit:
        describe_run(run_dir)  # a directory that is not a run fails here, before anything is built
    output = Path(output) if output is not None else run_dir / (FIT_EXPORT if fit else "model.keras")
    check_output_file(output, overwrite, ".keras", "Keras 3's model file format")
    if fit:
        model = load_fit_run(run_dir, compile=False)
    else:
        from .models.to_keras import to_keras

        run = load_run(run_dir, float32=True)  # a plain Keras file, float32 as the weights are
        model = to_keras(run.model, run.data.input_shape)
    atomic_write(output, keras_bytes(model))
    return output
