"""The rules between keys: subdivisions or micro_batch_size, batch_schedule's order, keys that only one
model, optimizer, dataset or precision reads. Each broken rule is one line naming the keys and the fix."""

from __future__ import annotations

import dataclasses
import re

from ..defaults import CLI, CLI_SUBDIVISIONS
from ..errors import ConfigError, Refused
from .schema import Config
from .sections import (
    ADAPTIVE_KEYS,
    AugmentConfig,
    DataConfig,
    LossScaleConfig,
    ModelConfig,
    OptimizerConfig,
)
from .wording import _blamer, _came_from_set, _show


def resolve_batches(cfg: Config, batch_size_given: bool, source: str, overridden: set) -> Config:
    """subdivisions or micro_batch_size (the default k when neither is given); batch_schedule checked and its
    first batch made batch_size when it starts at the start."""

    where = _blamer(source, overridden)

    if cfg.subdivisions is not None and cfg.micro_batch_size is not None:
        by_set, micro_by_set = (_came_from_set(key, overridden) for key in ("subdivisions", "micro_batch_size"))
        if by_set != micro_by_set:  # --set of one over the file's other: the later word wins, as for any key
            cfg = dataclasses.replace(cfg, **{"subdivisions" if micro_by_set else "micro_batch_size": None})
    if cfg.subdivisions is not None and cfg.micro_batch_size is not None:
        raise ConfigError(
            f"{where('subdivisions', 'micro_batch_size')}: give subdivisions or micro_batch_size, not both "
            f"(subdivisions={cfg.subdivisions}, micro_batch_size={cfg.micro_batch_size}): remove one"
        )
    if cfg.subdivisions is None and cfg.micro_batch_size is None:
        cfg = dataclasses.replace(cfg, subdivisions=CLI_SUBDIVISIONS)
    changes = cfg.batch_schedule
    if not changes:
        return cfg
    if cfg.whole_set:
        raise ConfigError(
            f"{where('batch_size', 'batch_schedule')}: batch_size=all is every training example in one batch, "
            f"which no batch_schedule can grow: give batch_size a number, or remove batch_schedule"
        )
    at = where("batch_schedule")
    if cfg.batch_rule is not None:
        _check_rule(cfg, where)
        return cfg
    for i, change in enumerate(changes):
        if (change.epoch is None) == (change.step is None):
            raise ConfigError(
                f"{at}: batch_schedule[{i}] needs an epoch or a step, not both or neither "
                f"(e.g. {{epoch: 6, batch_size: 2000}} or {{step: 600, batch_size: 2000}})"
            )
        if change.batch_size is None:
            raise ConfigError(f"{at}: batch_schedule[{i}] needs a batch_size (e.g. {{epoch: 6, batch_size: 2000}})")
    unit = "epoch" if changes[0].epoch is not None else "step"
    starts = [getattr(change, unit) for change in changes]
    if any(start is None for start in starts):
        raise ConfigError(f"{at}: batch_schedule mixes epoch and step entries: key every entry by {unit}")
    for i in range(1, len(starts)):
        if starts[i] <= starts[i - 1]:
            raise ConfigError(
                f"{at}: batch_schedule[{i}] ({unit} {starts[i]}) must come after batch_schedule[{i - 1}] "
                f"({unit} {starts[i - 1]}): list the changes in increasing {unit}s"
            )
    if starts[0] == (1 if unit == "epoch" else 0):
        first = changes[0].batch_size
        set_size, set_schedule = (
            _came_from_set("batch_size", overridden),
            _came_from_set("batch_schedule", overridden, True),
        )
        if batch_size_given and set_size and not set_schedule:  # --set of one over the file's other: it wins
            first = cfg.batch_size
        elif set_schedule and not set_size:
            batch_size_given = False
        if batch_size_given and cfg.batch_size != first:
            raise ConfigError(
                f"{where('batch_size', 'batch_schedule')}: batch_size={cfg.batch_size} and batch_schedule[0] "
                f"({unit} {starts[0]}, batch_size={first}) both set the first batch size: remove one"
            )
        cfg = dataclasses.replace(cfg, batch_size=first, batch_schedule=changes[1:])
    return cfg


def _check_rule(cfg: Config, where) -> None:
    """batch_schedule as a rule ({rule: noise_scale, max_batch_size: N}): what it needs of itself and of the
    keys around it."""
    rule, at = cfg.batch_rule, where("batch_schedule")
    if rule.rule is None:
        raise ConfigError(
            f"{at}: batch_schedule as a mapping needs rule: noise_scale "
            f"(e.g. {{rule: noise_scale, max_batch_size: 16000}})"
        )
    if rule.max_batch_size is None:
        raise ConfigError(
            f"{at}: batch_schedule rule {rule.rule} needs max_batch_size, the largest batch it may grow to "
            f"(e.g. {{rule: {rule.rule}, max_batch_size: 16000}})"
        )
    if cfg.micro_batch_size is None:
        raise ConfigError(
            f"{where('batch_schedule', 'subdivisions')}: batch_schedule rule {rule.rule} grows the batch in whole "
            f"micro-batches: give micro_batch_size (what fits in memory) instead of subdivisions"
        )
    if rule.max_batch_size < cfg.batch_size:
        raise ConfigError(
            f"{where('batch_schedule', 'batch_size')}: batch_schedule max_batch_size={rule.max_batch_size} is "
            f"smaller than batch_size={cfg.batch_size} (the rule never shrinks the batch): raise max_batch_size"
        )
    if rule.every_epochs >= cfg.epochs:
        raise ConfigError(
            f"{where('batch_schedule', 'epochs')}: batch_schedule every_epochs={rule.every_epochs} leaves no epoch "
            f"for the batch to change at (epochs={cfg.epochs}): lower every_epochs or raise epochs"
        )
    if cfg.baseline:
        raise ConfigError(
            f"{where('batch_schedule', 'baseline')}: batch_schedule rule {rule.rule} measures from the micro-batches "
            f"of each update, and the baseline has none: set baseline=false or remove batch_schedule"
        )
    schedule = cfg.optimizer.schedule
    if schedule.name != "constant" and schedule.decay_steps is None:
        raise ConfigError(
            f"{where('optimizer.schedule.decay_steps', 'batch_schedule')}: optimizer.schedule.name={schedule.name} "
            f"decays over the run's updates, which batch_schedule rule {rule.rule} does not know before it runs: "
            f"give optimizer.schedule.decay_steps, or set optimizer.schedule.name=constant"
        )


def check_relations(cfg: Config, source: str, overridden: set) -> None:
    where = _blamer(source, overridden)

    # auto is chosen as the run goes (memory.py); with batch_size: all, the training set's size is known when the
    # data are, and Timeline checks k against it
    fixed_k = not cfg.auto_subdivisions and not cfg.whole_set
    if fixed_k and cfg.subdivisions is not None and cfg.subdivisions > min(cfg.batch_sizes):
        if cfg.batch_schedule and cfg.subdivisions <= cfg.batch_size:
            raise ConfigError(
                f"{where('subdivisions', 'batch_schedule')}: subdivisions={cfg.subdivisions} cannot cut "
                f"batch_schedule's batch_size={min(cfg.batch_sizes)} (a micro-batch holds at least one example): "
                f"give micro_batch_size instead, so that k follows the batch"
            )
        raise ConfigError(
            f"{where('subdivisions', 'batch_size')}: subdivisions={cfg.subdivisions} "
            f"must be <= batch_size={cfg.batch_size} (a micro-batch holds at least one example)"
        )
    if cfg.batch_changes:
        if cfg.auto_subdivisions:
            raise ConfigError(
                f"{where('subdivisions', 'batch_schedule')}: batch_schedule needs micro_batch_size or a fixed "
                f"subdivisions (auto probes one batch size): set micro_batch_size to what fits"
            )
        last = cfg.batch_schedule[-1]
        if last.epoch is not None and last.epoch > cfg.epochs:
            raise ConfigError(
                f"{where('batch_schedule', 'epochs')}: batch_schedule starts batch_size={last.batch_size} at epoch "
                f"{last.epoch}, after the last epoch (epochs={cfg.epochs}): raise epochs or remove the entry"
            )
    _check_optimizer_keys(cfg.optimizer, where)
    if cfg.baseline and cfg.parallel_micro_steps not in ("auto", 1):
        raise ConfigError(
            f"{where('parallel_micro_steps', 'baseline')}: parallel_micro_steps="
            f"{cfg.parallel_micro_steps} needs baseline=false (the baseline has no micro-steps): "
            f"remove it or set baseline=false"
        )
    _check_model_keys(cfg.model, where)
    for key in ("loss", "metrics"):
        if getattr(cfg, key) is not None and cfg.model.name != "keras_file":
            raise ConfigError(
                f"{where(key, 'model.name')}: {key} is only for model.name=keras_file, not {cfg.model.name} "
                f"(the built-in nets train with sparse cross-entropy on class labels): remove it"
            )
    if cfg.precision != "mixed_float16" and cfg.loss_scale != LossScaleConfig():
        raise ConfigError(
            f"{where('loss_scale.initial', 'loss_scale.growth_steps', 'precision')}: loss_scale is only for "
            f"precision=mixed_float16 (precision={cfg.precision} needs no loss scaling): remove it or set the precision"
        )
    if cfg.strategy.cpu_devices is not None and cfg.strategy.name != "mirrored":
        raise ConfigError(f"{where('strategy.cpu_devices')}: strategy.cpu_devices is only for strategy.name=mirrored")
    _check_data_keys(cfg.data, where)
    _check_trim(cfg, where)
    limit = cfg.data.train_limit
    if limit is not None and cfg.data.validation >= limit:
        raise ConfigError(
            f"{where('data.validation', 'data.train_limit')}: data.validation={cfg.data.validation} "
            f"leaves no training examples of data.train_limit={limit}: lower it or raise the limit"
        )
    if limit is not None and not cfg.whole_set and limit < cfg.batch_size:
        raise ConfigError(
            f"{where('data.train_limit', 'batch_size')}: data.train_limit={limit} is smaller "
            f"than batch_size={cfg.batch_size}: raise it or lower batch_size"
        )
    if limit is not None and not cfg.whole_set and limit < max(cfg.batch_sizes):
        raise ConfigError(
            f"{where('data.train_limit', 'batch_schedule')}: data.train_limit={limit} is smaller than "
            f"batch_schedule's batch_size={max(cfg.batch_sizes)}: raise it or lower that batch size"
        )


def _only_for(section, prefix: str, key: str, owner: str, owners: tuple, where, fix: str | None = None) -> None:
    """``prefix + key`` away from its default where ``prefix + owner`` is none of ``owners``, the only ones that read
    it: refused, since it would be silently ignored; ``fix`` (default: set the owner) ends the line."""
    value, named = getattr(section, owner), " or ".join(owners)
    if getattr(section, key) != getattr(type(section)(), key) and value not in owners:
        raise ConfigError(
            f"{where(prefix + key, prefix + owner)}: {prefix}{key} is only for {prefix}{owner}={named}, not {value}: "
            f"{fix or f'remove it or set {prefix}{owner}={named}'}"
        )


def _check_optimizer_keys(optimizer: OptimizerConfig, where) -> None:
    for key in ADAPTIVE_KEYS:
        owners = ("lars",) if key == "trust_coefficient" else ("lars", "lamb")
        _only_for(optimizer, "optimizer.", key, "name", owners, where, "remove it or change the optimizer")
    for pattern in optimizer.exclude_from_adaptation or ():
        try:
            re.compile(pattern)
        except re.error as err:
            raise ConfigError(
                f"{where('optimizer.exclude_from_adaptation')}: optimizer.exclude_from_adaptation has "
                f"{pattern!r}, not a regular expression ({err}): escape it, e.g. 'conv1/bias'"
            ) from None


# Model keys that only one kind of model reads: a value other than the default
# for the other kind would be silently ignored, so it is refused.
BUILT_IN_MODEL_KEYS = ("width", "norm", "hidden", "groups", "bn_momentum")


def _check_model_keys(model: ModelConfig, where) -> None:
    default = ModelConfig()
    if model.name == "keras_file":
        if model.path is None:
            raise ConfigError(
                f"{where('model.name', 'model.path')}: model.name=keras_file needs model.path "
                f"(e.g. model: {{name: keras_file, path: my_model.keras}})"
            )
        if not model.path.endswith(".keras"):
            raise ConfigError(
                f"{where('model.path')}: model.path={_show(model.path)} must name a .keras file "
                f"(Keras 3's format, written by model.save('my_model.keras'))"
            )
        for key in BUILT_IN_MODEL_KEYS:
            if getattr(model, key) != getattr(default, key):
                raise ConfigError(
                    f"{where('model.' + key, 'model.name')}: model.{key} is only for the built-in "
                    f"models (seed_convnet, mlp), not keras_file, whose layers come from its file: "
                    f"remove it, or replace the whole model mapping: "
                    f"--set 'model={{name: keras_file, path: {model.path}}}'"
                )
        return
    _only_for(model, "model.", "path", "name", ("keras_file",), where)
    _only_for(
        model, "model.", "from_logits", "name", ("keras_file",), where, "the built-in models output logits; remove it"
    )
    _only_for(model, "model.", "bn_momentum", "norm", ("batchnorm",), where)
    _only_for(model, "model.", "groups", "norm", ("groupnorm",), where)
    if model.norm != "groupnorm":
        return
    channels = model.norm_channels
    if any(c % model.groups for c in channels):
        fits = max(g for g in range(1, model.groups + 1) if all(c % g == 0 for c in channels))
        key = "width" if model.name == "seed_convnet" else "hidden"
        raise ConfigError(
            f"{where('model.groups', 'model.' + key)}: model.groups={model.groups} must divide the "
            f"channels of every normalised layer of {model.name} (model.{key}={getattr(model, key):g}: "
            f"{', '.join(map(str, channels))}): set model.groups={fits} or change model.{key}"
        )


def _check_trim(cfg: Config, where) -> None:
    """data.trim_padding cuts sequences of a keras_file model, on one replica, and the batch rule's noise scale
    needs micro-batches drawn at random, not ordered by length."""
    trim = cfg.data.trim_padding
    if trim is None:
        return
    if cfg.model.name != "keras_file":
        raise ConfigError(
            f"{where('data.trim_padding', 'model.name')}: data.trim_padding={trim} cuts the padding of sequences "
            f"a keras_file model takes, not {cfg.model.name}'s images: remove it"
        )
    if cfg.strategy.name != "default":
        raise Refused(
            "trim-replicas",
            f"{where('data.trim_padding', 'strategy.name')}: data.trim_padding={trim} runs on one replica, and "
            f"strategy.name={cfg.strategy.name} trains on several: remove one of them",
        )
    if cfg.batch_rule is not None:
        raise ConfigError(
            f"{where('data.trim_padding', 'batch_schedule')}: data.trim_padding={trim} orders each batch by length, "
            f"and batch_schedule's noise_scale rule measures micro-batches drawn at random: remove one of them"
        )


# Which data.name each dataset key is for (name, dir, train_limit, test_limit are for all).
DATA_KEYS_FOR = {
    "dir": ("fashion_mnist",),
    "path": ("npz", "image_folder"),
    "image_size": ("image_folder",),
    "channels": ("image_folder",),
    "keep_decoded": ("image_folder",),
    "num_classes": ("npz",),
    "factory": ("python",),
    "shuffle_buffer": ("python",),
    "options": ("python",),
    "trim_padding": ("npz",),
}
DATA_KEY_HINTS = {
    ("dir", "npz"): "give the .npz file as data.path",
    ("dir", "image_folder"): "give the folder as data.path",
    ("path", "fashion_mnist"): "Fashion-MNIST's folder is data.dir; for your own data set data.name to npz "
    "or image_folder",
    ("image_size", "npz"): "an .npz's images are used at their own size",
    ("channels", "npz"): "an .npz's channels are its images' last axis",
    ("keep_decoded", "npz"): "an .npz's arrays are held in memory already",
    ("num_classes", "image_folder"): "the classes are the folder's class folders",
    ("trim_padding", "python"): "a stream is not read by index: cut the padding in the factory's pipeline",
}


def _check_data_keys(data: DataConfig, where) -> None:
    for key, names in DATA_KEYS_FOR.items():  # each None by default
        hint = DATA_KEY_HINTS.get((key, data.name), f"remove it or set data.name to {' or '.join(names)}")
        _only_for(data, "data.", key, "name", names, where, hint)
    if data.name in DATA_KEYS_FOR["path"] and data.path is None:
        example = "mydata.npz" if data.name == "npz" else "my_images"
        raise ConfigError(
            f"{where('data.name', 'data.path')}: data.name={data.name} needs data.path "
            f"(e.g. data: {{name: {data.name}, path: {example}}})"
        )
    if data.name == "python":
        if data.factory is None or ":" not in data.factory:
            raise ConfigError(
                f"{where('data.factory', 'data.name')}: data.name=python needs data.factory as module:function "
                f"(e.g. data: {{name: python, factory: my_pipeline:make_dataset}}), got {_show(data.factory)}"
            )
        for key, default, why in (
            ("validation", CLI["data.validation"], "hold examples out in the factory, or give the test split"),
            ("augment", AugmentConfig(), "augment in the factory's own pipeline"),
        ):
            if getattr(data, key) != default:
                raise ConfigError(
                    f"{where('data.' + key, 'data.name')}: data.{key} is not for data.name=python (a stream is "
                    f"not read by index): {why}"
                )
    if data.channels is not None and data.channels not in (1, 3):
        raise ConfigError(f"{where('data.channels')}: data.channels={data.channels} must be 1 (grayscale) or 3 (RGB)")
