"""Bad configs: each gives one exact line on stderr, exit code 2, and writes nothing.

The CLI is run through click's CliRunner; ``{cfg}`` in a message stands for the
config file's path. None of these reaches TensorFlow or the data.
"""

import dataclasses

import pytest
from accum_train.cli.main import main
from accum_train.config import Config, ConfigError, load_config, parse_size
from click.testing import CliRunner

TOP_KEYS = [field.name for field in dataclasses.fields(Config)]  # in the order an unknown key's line lists them

CASES = [
    # (config text, extra CLI args, expected message)
    ("batch_size: 0\n", [], "{cfg}: batch_size=0 must be >= 1 and <= 1000000"),
    ("batch_size: -5\n", [], "{cfg}: batch_size=-5 must be >= 1 and <= 1000000"),
    ("batch_size: abc\n", [], "{cfg}: batch_size='abc' must be an integer >= 1 and <= 1000000 or all"),
    ("batch_size: 2.5\n", [], "{cfg}: batch_size=2.5 must be an integer >= 1 and <= 1000000"),
    ("batch_size: true\n", [], "{cfg}: batch_size=true must be an integer >= 1 and <= 1000000"),
    ("batch_size: 5000000\n", [], "{cfg}: batch_size=5000000 must be <= 1000000"),
    ("batch_size:\n", [], "{cfg}: batch_size is empty: set it to an integer >= 1 and <= 1000000"),
    ("subdivisions: 0\n", [], "{cfg}: subdivisions=0 must be >= 1 and <= 1000000"),
    (
        "subdivisions: 600\n",
        [],
        "{cfg}: subdivisions=600 must be <= batch_size=500 (a micro-batch holds at least one example)",
    ),
    ("subdivision: 5\n", [], "{cfg}: unknown key 'subdivision' (did you mean 'subdivisions'?)"),
    ("epochs: 0\n", [], "{cfg}: epochs=0 must be >= 1 and <= 100000"),
    ("epochs: .inf\n", [], "{cfg}: epochs=inf must be an integer >= 1 and <= 100000"),
    ("seed: -1\n", [], "{cfg}: seed=-1 must be >= 0 and <= 2147483647"),
    ("log_every: 0\n", [], "{cfg}: log_every=0 must be >= 1"),
    ("baseline: 'yes'\n", [], "{cfg}: baseline='yes' must be true or false"),
    ("model: conv\n", [], "{cfg}: model='conv' must be a mapping of keys (e.g. model: {{name: ...}})"),
    ("model: {name: resnet}\n", [], "{cfg}: model.name='resnet' is not one of seed_convnet, mlp, keras_file"),
    (
        "model: {name: seed_convnt}\n",
        [],
        "{cfg}: model.name='seed_convnt' is not one of seed_convnet, mlp, keras_file; did you mean 'seed_convnet'?",
    ),
    ("model: {width: 0}\n", [], "{cfg}: model.width=0 must be > 0.0 and <= 8.0"),
    ("model: {norm: layernorm}\n", [], "{cfg}: model.norm='layernorm' is not one of batchnorm, groupnorm, none"),
    ("model: {bn_momentum: 1.5}\n", [], "{cfg}: model.bn_momentum=1.5 must be <= 1.0"),
    ("model: {bn_momentum: -0.1}\n", [], "{cfg}: model.bn_momentum=-0.1 must be >= 0.0 and <= 1.0"),
    (
        "model: {norm: groupnorm, bn_momentum: 0.5}\n",
        [],
        "{cfg}: model.bn_momentum is only for model.norm=batchnorm, not groupnorm: remove it or set "
        "model.norm=batchnorm",
    ),
    (
        "model: {name: keras_file, path: m.keras, bn_momentum: 0.5}\n",
        [],
        "{cfg}: model.bn_momentum is only for the built-in models (seed_convnet, mlp), not keras_file, whose "
        "layers come from its file: remove it, or replace the whole model mapping: "
        "--set 'model={{name: keras_file, path: m.keras}}'",
    ),
    (
        "optimizer: {name: adamw}\n",
        [],
        "{cfg}: optimizer.name='adamw' is not one of adam, sgd, momentum, rmsprop, lars, lamb; did you mean 'adam'?",
    ),
    ("optimizer: {learning_rate: -1}\n", [], "{cfg}: optimizer.learning_rate=-1 must be > 0.0 and <= 100.0"),
    ("optimizer: {lr: 0.1}\n", [], "{cfg}: unknown key 'optimizer.lr' (did you mean 'optimizer.learning_rate'?)"),
    ("optimizer: {clip_norm: 0}\n", [], "{cfg}: optimizer.clip_norm=0 must be > 0.0"),
    ("optimizer: {momentum: 1.5}\n", [], "{cfg}: optimizer.momentum=1.5 must be <= 1.0"),
    (
        "optimizer: {schedule: {name: linear}}\n",
        [],
        "{cfg}: optimizer.schedule.name='linear' is not one of constant, cosine, exponential",
    ),
    ("data: {name: mnist}\n", [], "{cfg}: data.name='mnist' is not one of fashion_mnist, npz, image_folder, python"),
    (
        "data: {train_limit: 100}\n",
        [],
        "{cfg}: data.train_limit=100 is smaller than batch_size=500: raise it or lower batch_size",
    ),
    ("data: {tain_limit: 100}\n", [], "{cfg}: unknown key 'data.tain_limit' (did you mean 'data.train_limit'?)"),
    (
        "batch_size: [1, 2\n",
        [],
        "{cfg}: YAML syntax error at line 2, column 1: expected ',' or ']', but got '<stream end>'",
    ),
    (
        "model:\n  name: mlp\n   width: 2\n",
        [],
        "{cfg}: YAML syntax error at line 3, column 9: mapping values are not allowed here",
    ),
    (
        "optimizer: {name: sgd}\nepochs: 1\noptimizer: {learning_rate: 0.5}\n",
        [],
        "{cfg}: YAML syntax error at line 3, column 1: 'optimizer' is given twice in one mapping (the second would "
        "replace the first): keep one",
    ),
    (
        "optimizer:\n  name: sgd\n  name: adam\n",
        [],
        "{cfg}: YAML syntax error at line 3, column 3: 'name' is given twice in one mapping (the second would "
        "replace the first): keep one",
    ),
    ("- 1\n- 2\n", [], "{cfg}: the config must be a mapping of keys (e.g. 'batch_size: 500'), got a list"),
    (
        "!!python/object/apply:os.system ['echo hi']\n",
        [],
        "{cfg}: YAML syntax error at line 1, column 1: could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object/apply:os.system'",
    ),
    ("", ["--set", "subdivisions=0"], "--set: subdivisions=0 must be >= 1 and <= 1000000"),
    (
        "",
        ["--set", "optimizer.lrate=0.1"],
        "--set: unknown key 'optimizer.lrate' (did you mean 'optimizer.learning_rate'?)",
    ),
    ("", ["--set", "nokey"], "--set 'nokey' must look like KEY=VALUE, e.g. --set subdivisions=10"),
    (
        "batch_size: 500\n",
        ["--set", "batch_size.x=1"],
        "--set batch_size.x: batch_size is 500 in {cfg}, not a mapping, so it has no key 'x'",
    ),
    (
        "batch_size: 64\n",
        ["--set", "subdivisions=65"],
        "--set: subdivisions=65 must be <= batch_size=64 (a micro-batch holds at least one example)",
    ),
    ("parallel_micro_steps: 0\n", [], "{cfg}: parallel_micro_steps=0 must be >= 1 and <= 64"),
    (
        "parallel_micro_steps: fast\n",
        [],
        "{cfg}: parallel_micro_steps='fast' must be an integer >= 1 and <= 64 or auto",
    ),
    (
        "baseline: true\nparallel_micro_steps: 2\n",
        [],
        "{cfg}: parallel_micro_steps=2 needs baseline=false (the baseline has no micro-steps): remove it or set "
        "baseline=false",
    ),
    (
        "data: {validation: 600, train_limit: 600}\n",
        [],
        "{cfg}: data.validation=600 leaves no training examples of data.train_limit=600: lower it or raise the limit",
    ),
    ("data: {validation: -1}\n", [], "{cfg}: data.validation=-1 must be >= 0"),
    ("data: {augment: {crop: -1}}\n", [], "{cfg}: data.augment.crop=-1 must be >= 0 and <= 4096"),
    ("data: {augment: {flip: 'yes'}}\n", [], "{cfg}: data.augment.flip='yes' must be true or false"),
    (
        "data: {augment: {flips: true}}\n",
        [],
        "{cfg}: unknown key 'data.augment.flips' (did you mean 'data.augment.flip'?)",
    ),
    ("strategy: {cpu_devices: 2}\n", [], "{cfg}: strategy.cpu_devices is only for strategy.name=mirrored"),
    # keys renamed in this release: a config of yours is told the new name (a run directory's is read under it)
    ("max_bad_updates: 3\n", [], "{cfg}: unknown key 'max_bad_updates' (renamed 'max_bad_steps')"),
    (
        "",
        ["--set", "loss_scale.growth_updates=5"],
        "--set: unknown key 'loss_scale.growth_updates' (renamed 'loss_scale.growth_steps')",
    ),
    # a key that --set made by giving one under it, and a mapping that --set left incomplete, are --set's
    ("", ["--set", "foo.bar=1"], "--set: unknown key 'foo' (valid keys: " + ", ".join(TOP_KEYS) + ")"),
    (
        "batch_size: 64\nmicro_batch_size: 8\n",
        ["--set", "batch_schedule.rule=noise_scale"],
        "--set: batch_schedule rule noise_scale needs max_batch_size, the largest batch it may grow to (e.g. "
        "{{rule: noise_scale, max_batch_size: 16000}})",
    ),
    (
        "batch_schedule: {rule: noise_scale}\n",
        [],
        "{cfg}: batch_schedule rule noise_scale needs max_batch_size, the largest batch it may grow to (e.g. "
        "{{rule: noise_scale, max_batch_size: 16000}})",
    ),
]


@pytest.mark.parametrize("text, extra, expected", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_bad_config_is_one_line_exit_2_nothing_written(tmp_path, text, extra, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(cfg), "--output-dir", str(out), *extra])
    assert result.exit_code == 2
    assert result.stderr == "error: " + expected.format(cfg=cfg) + "\n"
    assert result.stdout == ""
    assert not out.exists()


@pytest.mark.parametrize(
    "sets, expected",
    [
        (["model={name: keras_file, path: mine.keras}", "strategy.name=mirrored"], ("keras_file", False, "mirrored")),
        (
            ["model={name: keras_file, path: m.keras}", "strategy.name=multi_worker"],
            ("keras_file", False, "multi_worker"),
        ),
        (["baseline=true", "strategy.name=mirrored", "strategy.cpu_devices=2"], ("seed_convnet", True, "mirrored")),
        (["baseline=true", "strategy.name=multi_worker"], ("seed_convnet", True, "multi_worker")),
    ],
)
def test_a_keras_file_and_the_baseline_are_accepted_on_every_strategy(sets, expected):
    """Refused as single-device only before; tests/test_distribute.py and test_distribute_keras.py train them."""
    cfg = load_config(None, sets)
    assert (cfg.model.name, cfg.baseline, cfg.strategy.name) == expected


@pytest.mark.parametrize(
    "setup, message",
    [
        ("missing", "config file {p} does not exist: pass the path of a YAML file, e.g. configs/fmnist.yaml"),
        ("directory", "config file {p} is a directory: pass the path of a YAML file"),
        ("binary", "config file {p} is not UTF-8 text: pass a YAML file"),
    ],
)
def test_unreadable_config_file(tmp_path, setup, message):
    path = tmp_path / "c.yaml"
    if setup == "directory":
        path.mkdir()
    elif setup == "binary":
        path.write_bytes(b"\xff\xfe\x00\x81")
    result = CliRunner().invoke(main, ["run", str(path), "--output-dir", str(tmp_path / "o")])
    assert (result.exit_code, result.stderr) == (2, "error: " + message.format(p=path) + "\n")
    assert not (tmp_path / "o").exists()


def test_defaults_and_overrides_are_typed(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("batch_size: 100\nsubdivisions: 3\n")
    cfg = load_config(cfg_file, ["optimizer.learning_rate=2e-3", "model.name=mlp"])
    assert isinstance(cfg, Config)
    assert (cfg.batch_size, cfg.subdivisions, cfg.largest_micro_batch, cfg.micro_batch_size) == (100, 3, 34, None)
    assert cfg.optimizer.learning_rate == 0.002 and cfg.model.name == "mlp"
    assert cfg.model.width == Config().model.width  # untouched keys keep the default
    with pytest.raises(AttributeError):
        cfg.batch_size = 5  # frozen: nothing mutates a config after validation
    # The resolved config round-trips through its YAML.
    again = tmp_path / "again.yaml"
    again.write_text(cfg.to_yaml())
    assert load_config(again) == cfg


def test_a_run_directory_s_config_with_renamed_keys_is_read_under_the_new_names(tmp_path):
    """config.yaml of a run an earlier release wrote: evaluate, export, predict and --resume read it as it was."""
    from accum_train.config import load_run_config

    mixed = dataclasses.replace(Config(), precision="mixed_float16")  # where loss_scale keys may differ
    written = mixed.to_yaml().replace("max_bad_steps:", "max_bad_updates:").replace("growth_steps:", "growth_updates:")
    written = written.replace("max_bad_updates: 10", "max_bad_updates: 4").replace(
        "growth_updates: 2000", "growth_updates: 7"
    )
    assert "max_bad_updates: 4" in written and "growth_updates: 7" in written  # the premise: both old keys written
    (tmp_path / "config.yaml").write_text(written)
    cfg = load_run_config(tmp_path, ["data.test_limit=10"])
    assert (cfg.max_bad_steps, cfg.loss_scale.growth_steps, cfg.data.test_limit) == (4, 7, 10)
    with pytest.raises(ConfigError, match="unknown key 'max_bad_updates' \\(renamed 'max_bad_steps'\\)"):
        load_config(tmp_path / "config.yaml")  # only a run directory's own file is migrated


@pytest.mark.parametrize(
    "text, size",
    [
        ("2GiB", 2 * 1024**3),
        ("512MB", 512 * 1000**2),
        ("1.5G", int(1.5 * 1024**3)),
        ("64k", 64 * 1024),
        ("100", 100),
        (4096, 4096),
        ("3 MiB", 3 * 1024**2),
    ],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text, message",
    [
        ("lots", "memory_limit='lots' must be a size such as 2GiB, 512MB or 1073741824"),
        (0, "memory_limit=0 must be > 0 bytes"),
        ("0MB", "memory_limit='0MB' must be > 0 bytes"),
    ],
)
def test_parse_size_errors(text, message):
    with pytest.raises(ConfigError) as err:
        parse_size(text, "memory_limit")
    assert str(err.value) == message
