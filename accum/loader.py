"""The one loader of the readers (describe, evaluate, predict, export): a run directory of either door read back.

``read_run(run_dir)`` reads the record the directory keeps once (run.json, or an earlier release's:
rundir.read_record) and returns for the door it names one object with the same interface for both doors: what the
run is (``door``, ``settings()``, ``go_on()``: what describe prints), its model with the newest intact checkpoint's
weights (``model``, loaded when first used; ``keras_model()``, the plain Keras model export writes), what predict
reads and gives (``class_names`` and ``input_shape`` of a classifier, else ``input_spec()``, ``convert``,
``outputs()`` and ``output_names()``; a KerasHub task's ``preprocessor`` and ``raw_inputs()`` of raw text), and
what evaluate measures (``test_source()`` checks --set and --data as the door takes them: its config's test data,
or the .npz, .txt or .jsonl of --data where the directory keeps no data;
``test()`` loads it and the model that scores it, as an ``Evaluated``). What differs between the doors is here,
as the two classes' data and methods, and nowhere in the readers. Reading the records needs no TensorFlow:
describe answers at once, also while a run trains.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .backends import active
from .config import load_run_config, override_key
from .datasets.npz import DATA_HOW, read_targets, read_values
from .defaults import PREDICT_BATCH_SIZE
from .errors import ConfigError, DataError, RunDirError
from .raw_text import SUFFIXES as RAW_SUFFIXES
from .raw_text import is_raw, read_data, read_inputs
from .reload import describe_run, load_fit_run, load_run
from .text import shape_text, traced_error_line
from .trainer.store.metrics_log import read_metrics
from .trainer.store.rundir import FIT_RECORD, HISTORY, check_backend, other_output, read_record


def read_run(run_dir: Path, for_model: bool = True) -> ConfigRun | FitRun:
    """The run directory ``run_dir`` of either door. ``for_model``: the reader rebuilds its model (evaluate,
    predict, export), so a run of 'accum-train run' must hold the data description the model is built for, and a
    directory that is no run is refused in ``require_run_dir``'s words; describe reads the records alone and
    refuses in words that name both doors."""
    run_dir = Path(run_dir)
    record = read_record(run_dir)
    if for_model and (record or {}).get("door") != "fit":  # refuses a directory that is not a complete run
        record = {**(record or {}), "door": "config", "data": describe_run(run_dir)}
    if record is None:
        raise RunDirError(
            other_output(run_dir)
            or f"{run_dir} is not a run directory (no config.yaml with checkpoints/, nor {FIT_RECORD}): pass a "
            f"directory written by 'accum-train run' or by accum_train.fit(output_dir=...)"
        )
    if for_model:  # its checkpoint is read: by the backend that wrote it (describe reads the records alone)
        check_backend(record, run_dir, "run this command with KERAS_BACKEND={backend}")
    return DOORS[record["door"]](run_dir, record)


@dataclasses.dataclass(frozen=True)
class Evaluated:
    """What evaluate measures, as either door gives it: ``examples`` test examples, ``scores()`` the run's loss and
    metrics on them by name, ``classes()`` a classifier's (true labels, predicted classes) batch by batch (None for
    a model of values), ``settings`` what else the result names, ``data`` the record of the data."""

    examples: int
    scores: Callable[[], dict]
    classes: Callable | None
    settings: dict
    data: dict


class ConfigRun:
    """A run directory of 'accum-train run': config.yaml rebuilds its model for the inputs and classes of its
    run.json's data (``record``; None where describe reads the records alone), and names the data evaluate
    measures."""

    door = "accum-train run"
    export_name = "model.keras"
    preprocessor = None  # its models read arrays and images, no raw text
    convert = None  # read_values' own: the arrays converted as training converted them

    def __init__(self, run_dir: Path, record: dict):
        self.run_dir, self.record = run_dir, record["data"]

    def settings(self) -> dict:
        cfg = load_run_config(self.run_dir)
        subdivisions = cfg.subdivisions_for(cfg.batch_size)  # "auto": the updates' records say what it chose
        return {"model": cfg.model.name, "batch_size": cfg.batch_size, "subdivisions": subdivisions, "seed": cfg.seed}

    def go_on(self) -> str:
        started = (records(self.run_dir, HISTORY) or [{}])[-1]  # the newest start or resume
        workers = f" --workers {started['workers']}" if started.get("launcher") else ""
        return f"accum-train run --resume {self.run_dir}{workers}"

    @property
    def class_names(self) -> tuple | None:
        """The classes its probabilities are over; None for a run trained with a Keras loss (its model's values)."""
        return None if self.record.get("task") == "keras_loss" else tuple(self.record["class_names"])

    @property
    def input_shape(self) -> tuple:
        return tuple(self.record["input_shape"])

    @functools.cached_property
    def model(self):
        return load_run(self.run_dir)  # reload.Trained, in the run's precision: predict's outputs are the run's own

    def keras_model(self):
        from .models.to_keras import to_keras

        trained = load_run(self.run_dir, float32=True)  # a plain Keras file, float32 as the weights are
        return to_keras(trained.model, trained.data.input_shape)

    def input_spec(self) -> dict:
        return self.record["stored"]  # what the run stored: the inputs are checked before the model loads

    def raw_inputs(self, files: Sequence[Path]):
        return read_inputs(files, None, self.run_dir)  # refused in one line: its models take arrays and images

    def outputs(self, x, files: Sequence[Path]):
        # ``files`` name the inputs where a model refuses them: fit's; these fit the shapes the run stored
        return self.model.outputs(x, PREDICT_BATCH_SIZE)

    def output_names(self) -> list:
        from .models.keras_file import output_names

        return output_names(self.model.model.network)

    def test_source(self, overrides: Sequence[str], data_file: Path | None):
        """The config whose test split evaluate measures: the run's, changed in ``data.*`` keys by ``overrides``."""
        if data_file is not None:
            raise DataError(
                f"--data {data_file}: {self.run_dir} was written by 'accum-train run' and is evaluated on its config's "
                f"test data (change it with --set data.KEY=VALUE); --data is for a run directory of accum_train.fit"
            )
        return evaluation_config(self.run_dir, overrides)

    def test(self, cfg) -> Evaluated:
        from .from_config.build import load_data

        data = load_data(cfg, self.run_dir)  # the run's manifest of checked image files spares their decoding
        check_compatible(data, self.record, self.run_dir)
        if len(data.test) == 0:
            raise DataError("the test split is empty: nothing to evaluate")
        trained = load_run(self.run_dir, data)
        evaluated_on = {**dataclasses.asdict(cfg.data), "source": data.source}
        if self.class_names is None:  # a Keras loss's run: its loss and metrics, no classes to confuse
            return Evaluated(len(data.test), lambda: trained.scorer.task_scores(data.test), None, {}, evaluated_on)
        loss_and_accuracy = lambda: dict(zip(("loss", "accuracy"), trained.scorer.evaluate()))  # noqa: E731
        return Evaluated(len(data.test), loss_and_accuracy, trained.scorer.classes, {}, evaluated_on)


class FitRun:
    """A run directory of accum_train.fit: its arguments in run.json (``record``) and the Keras file fit saved as the
    run began. It keeps no data: evaluate takes the arrays of an .npz, and its model gives values, as model.predict
    does."""

    door = "accum_train.fit"
    # fit writes model.keras itself each time a call returns: that name is taken on every finished directory, and
    # replaced by the next call on an unfinished one
    export_name = "export.keras"
    class_names = None
    input_shape = None
    preprocessor = None  # a KerasHub task's, kept aside as ``model`` loads: it reads raw text (raw_text)
    convert = staticmethod(np.asarray)  # the arrays as they are, as they went to fit

    def __init__(self, run_dir: Path, record: dict):
        self.run_dir, self.record, self._backend = run_dir, record["fit"], record.get("backend", "tensorflow")

    def settings(self) -> dict:
        get = self.record.get
        return {"model": "keras", "batch_size": get("batch_size"), "subdivisions": get("k"), "seed": get("seed")}

    def go_on(self) -> str:
        return f"call accum_train.fit(model, ..., output_dir={str(self.run_dir)!r}) again"

    @functools.cached_property
    def model(self):
        model = load_fit_run(self.run_dir, compile=False)
        self.preprocessor = getattr(model, "preprocessor", None)
        return bare(model)

    def raw_inputs(self, files: Sequence[Path]) -> tuple:
        """(row names, inputs) of raw .txt or .jsonl files, made by the task's own preprocessor."""
        self.model  # noqa: B018 - loaded, its preprocessor kept
        return read_inputs(files, self.preprocessor, self.run_dir)

    def keras_model(self):
        # written as it is, uncompiled as every export is (the optimizer's state stays in the checkpoint)
        return load_fit_run(self.run_dir, compile=False)

    def input_spec(self) -> dict:
        return model_inputs(self.model, self.run_dir)

    def outputs(self, x, files: Sequence[Path]):
        try:
            return self.model.predict(x, batch_size=PREDICT_BATCH_SIZE, verbose=0)
        except (ValueError, active().BAD_INPUT) as err:  # what the stored shapes allow and the model not
            names = ", ".join(str(p) for p in files)  # (a sequence longer than its position embedding)
            raise DataError(
                f"{names}: the model of {self.run_dir} cannot take these inputs ({traced_error_line(err)}): save them "
                "as it took its training inputs"
            ) from None

    def output_names(self) -> list:
        from .models.keras_file import output_names

        return output_names(self.model)

    def test_source(self, overrides: Sequence[str], data_file: Path | None) -> Path:
        """The .npz evaluate measures (arrays ``x``, ``y``, optionally ``sample_weight``): fit's directory keeps no
        data, nor a config to change."""
        if overrides:
            raise ConfigError(
                f"--set {overrides[0]}: {self.run_dir} was written by accum_train.fit and keeps no config to change: "
                f"pass the data to evaluate on with --data FILE.npz"
            )
        if data_file is None:
            raise DataError(
                f"{self.run_dir} was written by accum_train.fit, which keeps no data: pass the data to evaluate on "
                f"with --data FILE.npz, saved by {DATA_HOW}"
            )
        data_file = Path(data_file)
        if data_file.suffix.lower() not in (".npz", *RAW_SUFFIXES) or not data_file.is_file():
            raise DataError(f"--data {data_file} is not an .npz, .txt or .jsonl file: save the data with {DATA_HOW}")
        return data_file

    def test(self, data_file: Path) -> Evaluated:
        """``model.evaluate`` of the model compiled as fit trained it (its loss and metrics are what is measured), at
        the batch size the run trained with (Keras' default where it had none)."""
        from . import keras_private
        from .keras_fit.checks import check_labels

        model = load_fit_run(self.run_dir, compile=True)
        preprocessor = getattr(model, "preprocessor", None)
        model = bare(model)
        if is_raw(data_file):  # through the task's own preprocessor, as task.evaluate reads raw data
            examples, x, y, weights = read_data(data_file, preprocessor, self.run_dir)
        else:
            rows, x = read_values([data_file], model_inputs(model, self.run_dir), convert=self.convert)
            examples = len(rows)
            y, weights = read_targets(data_file, examples)
        batch_size = self.record.get("batch_size")
        spec = active().batch_spec((x, y))
        try:
            # built first: the compiled loss's entries, which the check reads; labels out of range in one line, as
            # fit says it, where TensorFlow's graph error has fifty
            built = keras_private.built(model, spec[0], spec)
            check_labels(model.name, built, None, [("y", y)], where=f"--data {data_file}")
            scores = model.evaluate(x, y, sample_weight=weights, batch_size=batch_size, verbose=0, return_dict=True)
        except (ValueError, active().BAD_INPUT) as err:  # targets that do not fit the outputs or the loss
            raise DataError(
                f"--data {data_file}: the model of {self.run_dir} cannot evaluate it ({traced_error_line(err)}): save "
                f"x as the model takes it and y as its loss takes it"
            ) from None
        scores = {name: float(value) for name, value in scores.items()}
        evaluated_on = {"source": str(data_file.resolve())}
        return Evaluated(examples, lambda: scores, None, {"batch_size": batch_size}, evaluated_on)


class KerasConfigRun(FitRun):
    """A run directory of 'accum-train run' on a backend other than TensorFlow: fit's (accum/on_keras.py),
    with the config it ran beside it, whose test split evaluate measures unless --data names an .npz. Its model
    gives values, as model.predict does."""

    door = "accum-train run"

    def settings(self) -> dict:
        return ConfigRun.settings(self)

    def go_on(self) -> str:
        return f"KERAS_BACKEND={self._backend} accum-train run --resume {self.run_dir}"

    def test_source(self, overrides: Sequence[str], data_file: Path | None):
        if data_file is not None and overrides:
            raise ConfigError(f"--set {overrides[0]} changes the config's test data, which --data replaces: drop one")
        if data_file is not None:
            return super().test_source((), data_file)
        return evaluation_config(self.run_dir, overrides)

    def test(self, source) -> Evaluated:
        """The config's test split (``source``: the config) scored by model.evaluate of the model compiled as it
        trained, or an .npz's (a path) as fit's directory is."""
        if isinstance(source, Path):
            return super().test(source)
        from .on_keras import test_split

        examples, scores = test_split(source, self.run_dir, load_fit_run(self.run_dir, compile=True))
        evaluated_on = {**dataclasses.asdict(source.data)}
        return Evaluated(examples, scores, None, {"batch_size": self.record.get("batch_size")}, evaluated_on)


def _fit_door(run_dir: Path, record: dict) -> FitRun:
    """fit's reader, or for the CLI's run on JAX (config.yaml beside fit's files) its own."""
    return (KerasConfigRun if (run_dir / "config.yaml").is_file() else FitRun)(run_dir, record)


# The reader of each door, by the door run.json names.
DOORS = {"config": ConfigRun, "fit": _fit_door}


def bare(model):
    """``model`` without a KerasHub task's preprocessor: the .npz arrays the commands read are the model's inputs
    (model_inputs: token_ids, padding_mask, ...), which the task's predict and evaluate would send through its
    tokenizer again. A task whose preprocessor is None takes them as they are (keras_hub's Task)."""
    if getattr(model, "preprocessor", None) is not None:
        model.preprocessor = None
    return model


def model_inputs(model, run_dir: Path) -> dict:
    """What ``read_values`` checks inputs against (run.json's data "stored" for a run of 'accum-train run'), from
    the inputs of a Keras model: their shapes and dtypes, by name where there are several."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise RunDirError(
            f"the model of {run_dir} ({type(model).__name__}) declares no inputs to read .npz files for: call "
            f"model.predict on accum_train.reload.load_fit_run({str(run_dir)!r}) in Python"
        )
    specs = {t.name: {"shape": list(t.shape[1:]), "dtype": str(t.dtype)} for t in inputs}
    return {"x": next(iter(specs.values())) if len(specs) == 1 else {"arrays": specs}}


# Keys `evaluate --set` may change: which test data is read. The rest (model,
# optimizer, batch, ...) describes the trained run and is not the caller's to change.
CHANGEABLE_PREFIX = "data."
# data keys that only change how the training split is read: evaluate reads the test split alone
TRAINING_ONLY = ("train_limit", "validation", "shuffle", "shuffle_buffer", "augment", "trim_padding")


def evaluation_config(run_dir: Path, overrides: Sequence[str] = ()):
    """The run's config with ``--set data.KEY=VALUE`` overrides; any other key is refused."""
    for item in overrides:
        key = override_key(item)
        if key == "data":
            raise ConfigError(
                f"--set {item}: evaluate takes data's keys one at a time (e.g. --set data.test_limit=1000), not the "
                "whole section"
            )
        if key.startswith(CHANGEABLE_PREFIX) and key.split(".")[1] in TRAINING_ONLY:
            raise ConfigError(
                f"--set {item}: evaluate reads only the test split, and {key} changes only the training split: "
                "leave it out (e.g. --set data.test_limit=1000)"
            )
        if not key.startswith(CHANGEABLE_PREFIX):
            raise ConfigError(
                f"--set {item}: evaluate changes only data.* keys (e.g. --set data.test_limit=1000); "
                f"{key or 'the key'} is part of the trained run"
            )
    return load_run_config(run_dir, overrides)


def check_compatible(data, info: dict, run_dir: Path) -> None:
    """The data must be what the model was built for: the same input shape and classes."""
    shape, run_shape = tuple(data.input_shape), tuple(info["input_shape"])
    if shape != run_shape:
        raise DataError(
            f"the data has inputs of {shape_text(shape)}, but the model of {run_dir} takes "
            f"{shape_text(run_shape)}: evaluate it on data like its training data"
        )
    names, run_names = list(data.class_names), list(info["class_names"])
    if names != run_names:
        raise DataError(
            f"the data has classes {_names_text(names)}, but the model of {run_dir} was trained on "
            f"{_names_text(run_names)}: labels would mean different classes"
        )


def _names_text(names, shown: int = 4) -> str:
    text = ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")
    return f"[{text}] ({len(names)})"


def records(run_dir: Path, name: str) -> list:
    """The records of the JSON Lines file ``name`` of ``run_dir`` (none where it is missing)."""
    path = run_dir / name
    return read_metrics(path) if path.is_file() else []


def json_or_none(path: Path):
    """The JSON file ``path``, or None where it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
