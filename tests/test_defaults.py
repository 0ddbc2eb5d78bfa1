"""Every default of both doors is accum/defaults.py's: the config's fields take its ``CLI`` column, accum_train.fit's
signature its ``FIT`` column (model.fit's own for model.fit's arguments), the trainer, the commands and the loaders
its constants; nothing else defines them; and docs/doors.md's Defaults table is what scripts/defaults_table.py
writes from it."""

import ast
import dataclasses
import inspect
from pathlib import Path
from types import MappingProxyType

import accum_train
import keras
import pytest
from accum_train import defaults
from accum_train.config import BatchChange, BatchRule, Config, as_config
from helpers import load_file

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def table():
    return load_file(ROOT / "scripts" / "defaults_table.py", "defaults_table")


def _flat(section, prefix: str = "") -> dict:
    """A config section's keys, dotted as --set takes them, with their values; nested sections opened."""
    found = {}
    for field in dataclasses.fields(section):
        value = getattr(section, field.name)
        if dataclasses.is_dataclass(value):
            found.update(_flat(value, f"{prefix}{field.name}."))
        else:
            found[f"{prefix}{field.name}"] = value
    return found


def _signature_defaults(function) -> dict:
    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


def test_a_default_config_is_the_cli_column():
    made = {
        **_flat(Config()),
        **_flat(BatchChange(), "batch_schedule[i]."),
        **_flat(BatchRule(), "batch_schedule."),
    }
    assert made == dict(defaults.CLI)
    # the same types too: 60.0 is not 60 to a YAML file written back
    assert {key: type(value) for key, value in made.items()} == {k: type(v) for k, v in defaults.CLI.items()}


def test_fit_s_signature_is_the_fit_column_in_its_order():
    found = _signature_defaults(accum_train.fit)
    assert list(found.items()) == list(defaults.FIT.items())


def test_model_fit_s_arguments_keep_model_fit_s_defaults():
    assert _signature_defaults(keras.Model.fit) == dict(defaults.MODEL_FIT)
    assert list(defaults.FIT)[: len(defaults.MODEL_FIT)] == list(defaults.MODEL_FIT)


def _auto_parallel():
    from accum_train.trainer.runtime import auto_parallel, cpu_cores

    return auto_parallel(64), min(defaults.AUTO_PARALLEL, cpu_cores())


def _fit_schedule_before_its_first_entry():
    from accum_train.keras_fit.arguments import schedule_of

    schedule, _ = schedule_of([{"epoch": 2, "batch_size": 64}], None, 3, None, None)
    return schedule, ((0, defaults.ARRAY_BATCH_SIZE), (1, 64))


def _trim_padding_true():
    from accum_train.trainer.data.lengths import trim_multiple

    return trim_multiple(True, "accum_train.fit"), defaults.TRIM_MULTIPLE


def _warned_batchnorm():
    from accum_train.trainer.data.order import noisy_batchnorm

    least = defaults.MIN_BATCHNORM_MICRO_BATCH
    return (noisy_batchnorm(4 * (least - 1), 4), noisy_batchnorm(4 * least, 4)), (least - 1, 0)


def _update_growth_steps():
    from accum_train.backends.tensorflow.update import Update

    return _signature_defaults(Update)["growth_steps"], defaults.LOSS_SCALE_GROWTH_STEPS


def _predict_batch():
    from accum_train import loader, predict

    # the readers' model takes PREDICT_BATCH_SIZE examples at a time, as loader.py hands it on
    batches = {_signature_defaults(predict.probabilities)["batch_size"], loader.PREDICT_BATCH_SIZE}
    return batches, {defaults.PREDICT_BATCH_SIZE}


def _precision_choices():
    (field,) = [f for f in dataclasses.fields(Config) if f.name == "precision"]
    return field.metadata["choices"], defaults.PRECISIONS


# What each door, or the trainer behind both, does where a setting is left out: (what it does, the module's value)
@pytest.mark.parametrize(
    "effective",
    [
        pytest.param(lambda: (as_config({}).subdivisions, defaults.CLI_SUBDIVISIONS), id="cli-subdivisions"),
        pytest.param(
            lambda: (as_config({"micro_batch_size": 50}).subdivisions, defaults.CLI["subdivisions"]),
            id="cli-micro-batch-size",
        ),
        pytest.param(lambda: (Config().checkpoint.keep, defaults.CHECKPOINT_KEEP), id="checkpoint-keep"),
        pytest.param(lambda: (Config().loss_scale.initial, defaults.LOSS_SCALE_INITIAL), id="loss-scale"),
        pytest.param(_precision_choices, id="precisions"),
        pytest.param(_auto_parallel, id="auto-parallel"),
        pytest.param(_fit_schedule_before_its_first_entry, id="fit-array-batch"),
        pytest.param(_trim_padding_true, id="trim-multiple"),
        pytest.param(_warned_batchnorm, id="batchnorm-warning"),
        pytest.param(_update_growth_steps, id="loss-scale-growth"),
        pytest.param(_predict_batch, id="predict-batch"),
    ],
)
def test_what_a_door_does_is_the_module_s(effective):
    found, expected = effective()
    assert found == expected


def test_every_setting_of_the_table_names_a_key_and_an_argument_there_are():
    keys = [s.key for s in defaults.SETTINGS if s.key is not None]
    arguments = [s.argument for s in defaults.SETTINGS if s.argument is not None]
    assert set(keys) - set(defaults.CLI) == set()
    assert set(arguments) - set(defaults.FIT) == set()
    assert len({s.setting for s in defaults.SETTINGS}) == len(defaults.SETTINGS)


def test_the_module_is_a_leaf():
    """Nothing of the package, no TensorFlow or Keras: the config layer, the CLI and the scripts read it for free."""
    imported = set()
    for node in ast.walk(ast.parse((ROOT / "accum" / "defaults.py").read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add("." if node.level else node.module.split(".")[0])
    assert imported == {"__future__", "dataclasses", "types"}


# The names the defaults had in the modules that defined them before, and have in accum/defaults.py now.
FORMER = ("DEFAULT_SUBDIVISIONS", "DEFAULT_MULTIPLE", "DECAY", "BATCH_SIZE", "KEEP", "KEEP_SHARE", "LOSS_SCALE")
FORMER += ("DEFAULT_CHANNELS", "DEFAULT_SHUFFLE_BUFFER")


def test_no_other_module_defines_a_default():
    names = {name for name in vars(defaults) if name.isupper()} | set(FORMER)
    defined = sorted(
        f"{path.relative_to(ROOT)}: {target.id}"
        for folder in ("accum", "cli", "datasets")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ROOT / "accum" / "defaults.py"
        for node in ast.parse(path.read_text()).body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and target.id in names
    )
    assert defined == []


def test_the_doors_page_is_current(table, capsys):
    assert table.main(["--check"]) == 0, capsys.readouterr().out


def _epochs(monkeypatch):
    monkeypatch.setattr(defaults, "CLI", MappingProxyType({**defaults.CLI, "epochs": 20}))


def _fit_seed(monkeypatch):
    monkeypatch.setattr(defaults, "FIT", MappingProxyType({**defaults.FIT, "seed": 0}))


def _wording(monkeypatch):
    first = dataclasses.replace(defaults.SETTINGS[0], fit="32 for arrays")
    monkeypatch.setattr(defaults, "SETTINGS", (first, *defaults.SETTINGS[1:]))


def _row_dropped(monkeypatch):
    monkeypatch.setattr(defaults, "SETTINGS", defaults.SETTINGS[:-1])


@pytest.mark.parametrize("change", [_epochs, _fit_seed, _wording, _row_dropped])
def test_a_changed_default_leaves_the_page_stale(table, monkeypatch, capsys, change):
    change(monkeypatch)
    assert table.main(["--check"]) == 1
    assert capsys.readouterr().out == (
        "docs/doors.md's Defaults are stale: python scripts/defaults_table.py rewrites them\n"
    )
