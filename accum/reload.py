"""A run directory's model loaded back with its newest intact checkpoint's weights, for either door.

The model of a run of 'accum-train run' is rebuilt from config.yaml for the
input shape and classes of run.json's data, so a trained run can be used without
its training data (``load_run``). One of accum_train.fit(output_dir=...) has neither:
its model is the Keras file that fit saved as the run began
(initial_model.keras), given the checkpoint's weights (``load_fit_run``).
The readers (describe, evaluate, predict, export) call neither directly: accum/loader.py picks the one the
directory's door needs.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np

from .backends import active
from .config import LossScaleConfig, load_run_config
from .datasets.base import ArraySplit, Dataset, TaskSplit
from .errors import RunDirError
from .from_config.source import model_source
from .text import first_line
from .trainer.data.batching import eval_batch_size
from .trainer.store.checkpoints import checkpoint_numbers, latest_intact
from .trainer.store.rundir import MODEL_COPY, read_record, require_run_dir


class Trained:
    """A trained run read back: its config, data (empty splits unless given), model with the checkpoint's
    weights, objective (``keras_loss``: whether it is a Keras loss rather than the built-in one) and the scores
    over its splits (``scoring.Scorer``'s methods). No optimizer, accumulator or checkpoint manager: nothing that
    trains."""

    def __init__(self, cfg, data, model, objective, subdivisions: int):
        self.cfg, self.data, self.model, self.objective = cfg, data, model, objective
        self.keras_loss = isinstance(objective, active().KerasObjective)
        size = eval_batch_size(cfg.batch_size, subdivisions, cfg.micro_batch_size)
        self.scorer = active().Scorer(model, objective, data, lambda: size)

    def outputs(self, x, batch_size: int):
        """The model's outputs for the inputs ``x`` in inference mode, ``batch_size`` examples at a time, as float32
        numpy (a Keras loss's run: the values the loss took)."""
        return active().outputs_in_batches(self.model.forward, x, batch_size)


def load_run(run_dir: Path, data=None, float32: bool = False, say=None) -> Trained:
    """The model of ``run_dir`` with its latest checkpoint's weights, and what scores it.

    ``data`` (a loaded Dataset) is needed only to evaluate; without it the
    run's splits are empty and only its model is of use. The model computes
    in the run's precision (so evaluate reproduces its summary), or in float32
    with ``float32`` (export: the weights are float32 in every precision).
    A damaged latest checkpoint is passed over for the newest intact one, in
    one line to ``say`` (default: stderr), and left where it is: a reader
    changes nothing in the run directory. Only the weights are read."""
    from .from_config.build import build_with_loss

    run_dir = Path(run_dir)
    info = describe_run(run_dir)
    cfg = load_run_config(run_dir)
    if float32:
        cfg = dataclasses.replace(cfg, precision="float32", loss_scale=LossScaleConfig())
    if data is None:  # no examples: a Keras loss's arrays of the stored dtypes and shapes, or images and labels
        shape = tuple(info["input_shape"])
        if info.get("task") == "keras_loss":
            empty = TaskSplit.empty(info["stored"])
        else:
            empty = ArraySplit(np.zeros((0, *shape), np.float32), np.zeros((0,), np.int32))
        data = Dataset(
            train=empty, test=empty, input_shape=shape, class_names=tuple(info["class_names"]), source=info["source"]
        )
    intact, _ = latest_intact(run_dir, say or _to_stderr, flag="")
    if data.for_model is None:  # made here, or loaded without the run directory: its copy of the model file
        data = dataclasses.replace(data, for_model=model_source(cfg, run_dir))
    model, objective = build_with_loss(cfg, data, cfg.precision)
    # the run's checkpoint holds the weights under "weights" (run_parts.Run): read those, nothing else
    active().restore_weights(intact, model.variables)
    subdivisions = active().saved_value(intact, "subdivisions")
    subdivisions = 1 if subdivisions is None else int(subdivisions)  # the baseline keeps none
    return Trained(cfg, data, model, objective, subdivisions)


def load_fit_run(run_dir: Path, compile: bool = True, say=None, model=None):
    """The Keras model accum_train.fit trained in ``run_dir`` (also a call that never returned), with its newest
    intact checkpoint's weights: compiled as it was with ``compile`` (its loss and metrics: evaluate), else its
    layers only (export, predict). A damaged newest checkpoint is passed over as ``load_run`` does. Only the
    weights are read: the optimizer's state, the metrics' and the update count stay in the checkpoint.

    LoRA that the model file does not rebuild (a KerasHub backbone's ``enable_lora(rank)``: its config has no
    layer configs, so the LoRA kernels are gone) is enabled again where run.json records it, at its rank and alpha
    (``_enable_recorded_lora``). ``model``: the model object to give the weights in place of the one the file
    rebuilds (built as fit's was: for a model the file cannot rebuild)."""
    import keras

    from .keras_private import storage

    run_dir = Path(run_dir)
    path = fit_model_file(run_dir) if model is None else None
    if not checkpoint_numbers(run_dir / "checkpoints"):  # a call killed before its first: the way on is fit's
        raise RunDirError(
            f"{run_dir}: no checkpoint in {run_dir / 'checkpoints'} yet (fit writes one when an epoch ends and when "
            f"a signal stops it): call accum_train.fit(model, ..., output_dir={str(run_dir)!r}) again, then read it"
        )
    intact, _ = latest_intact(run_dir, say or _to_stderr, flag="")
    if model is None:
        try:
            with warnings.catch_warnings():  # Keras' warning of a custom compile(): _compiled_as_saved calls it
                warnings.filterwarnings("ignore", "`compile\\(\\)` was not called", UserWarning)
                # A KerasHub task compiles itself as it is built, with an optimizer of its own that Keras then fills
                # from the file's and, where LoRA or a fit's Adam made the two differ, warns that it skipped them:
                # the readers never train, so that state is not theirs to load (it stays in the checkpoint)
                warnings.filterwarnings("ignore", "Skipping variable loading for optimizer", UserWarning)
                model = keras.models.load_model(path, compile=compile)
            if compile:
                _compiled_as_saved(model, path)
        except (TypeError, ValueError) as err:  # what Keras raises for a class or function it cannot rebuild
            raise RunDirError(
                f"cannot rebuild the model of {run_dir} from {path.name} ({first_line(err)}): the command line "
                f"knows Keras' own layers, losses and metrics; for your own, call accum_train.reload.load_fit_run"
                f"({str(run_dir)!r}) in Python where Keras finds them (keras.saving.register_keras_serializable; a "
                f"Lambda layer's code after keras.config.enable_unsafe_deserialization())"
            ) from None
    source = f"the model rebuilt from {path.name}" if path else "the model passed"
    _enable_recorded_lora(model, run_dir)
    _check_shapes(model, active().saved_weight_shapes(intact), run_dir, source)
    # fit's checkpoint holds the model's variables under "weights" (keras_fit/rundir.py), by position: read those,
    # nothing else. The shapes were matched above, so what fails here is a damaged or foreign file.
    try:
        active().restore_weights(intact, [storage(v) for v in model.variables])
    except (AssertionError, ValueError, active().OP_ERROR) as err:
        raise RunDirError(
            f"cannot restore the checkpoint {intact} into the model of {run_dir} ({first_line(err)[:200]}): "
            f"{_PASS_THE_MODEL.format(run_dir=str(run_dir))}"
        ) from None
    return model


# How to read a run directory whose model the file does not rebuild as fit trained it.
_PASS_THE_MODEL = (
    "build the model in Python as fit trained it and pass it: accum_train.reload.load_fit_run({run_dir!r}, model=model)"
)


def _compiled_as_saved(model, path: Path) -> None:
    """A model whose class overrides compile() (a KerasHub task) is left by load_model with its constructor's
    default loss and metrics, not the ones fit trained with: compile it with the file's own compile config."""
    import keras

    if type(model).compile is keras.Model.compile:
        return  # load_model compiled it from the file
    with zipfile.ZipFile(path) as archive:
        saved = json.loads(archive.read("config.json")).get("compile_config")
    if saved:
        model.compile(**keras.saving.deserialize_keras_object(saved))


def _enable_recorded_lora(model, run_dir: Path) -> None:
    """LoRA on the layers run.json records it on (rank and alpha), where the model file did not rebuild it: a
    KerasHub backbone's config has no layer configs, so its ``enable_lora(rank)`` is lost in the file."""
    from .keras_private import all_layers

    record = (read_record(run_dir) or {}).get("fit") or {}
    layers = {layer.path: layer for layer in all_layers(model)}
    for path, rank, alpha in record.get("lora", []):
        layer = layers.get(path)
        if layer is not None and not getattr(layer, "lora_enabled", False):
            layer.enable_lora(rank, lora_alpha=alpha)


def _check_shapes(model, saved: list, run_dir: Path, source: str) -> None:
    """Refuse in one line a model whose variables (``saved``: the checkpoint's shapes, in order) differ."""
    now = [tuple(v.shape) for v in model.variables]
    if now == saved:
        return
    first = next((i for i, (a, b) in enumerate(zip(saved, now)) if a != b), None)
    differs = "" if first is None else f", variable {first} of shape {saved[first]} there, {now[first]} here"
    raise RunDirError(
        f"the checkpoint of {run_dir} does not fit {source}: {len(saved)} variables there, {len(now)} here{differs}: "
        f"{_PASS_THE_MODEL.format(run_dir=str(run_dir))}"
    )


def fit_model_file(run_dir: Path) -> Path:
    """The Keras file of a fit run directory: initial_model.keras, which fit saves before its first update; in a
    directory of an earlier release, the model.keras a call that returned saved (the layers are the same)."""
    for name in (MODEL_COPY, "model.keras"):
        if (Path(run_dir) / name).is_file():
            return Path(run_dir) / name
    raise RunDirError(
        f"{run_dir} has neither {MODEL_COPY} (saved as a fit run begins; earlier releases did not) nor model.keras "
        f"(saved when the call returns): call accum_train.fit(model, ..., output_dir={str(run_dir)!r}) again, which "
        f"saves it and goes on from the checkpoint"
    )


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def describe_run(run_dir: Path) -> dict:
    """The data a run of 'accum-train run' recorded (run.json's, an earlier release's dataset.json): input_shape,
    class_names, source, split sizes."""
    data = (read_record(require_run_dir(run_dir)) or {}).get("data")
    if data is None:
        raise RunDirError(
            f"{run_dir} has no run.json, which every run writes before its first update: it is not a complete run "
            f"directory (pass the folder a run wrote)"
        )
    return data
