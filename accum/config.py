"""The config: every default in one place, parsed and validated once.

A YAML file lists only what differs from the defaults below. ``load_config``
reads it with ``yaml.safe_load`` (data only: no tags, no eval, no imports),
applies ``--set key=value`` overrides, checks every key and value against the
dataclasses here, and returns a frozen ``Config``. Nothing else in the project
reads raw dicts. Each error names the key, the value and what is allowed, in
one line, and says where the value came from (the file or ``--set``).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from .batching import k_for_micro_batch
from .errors import ConfigError

# Registries. The implementations live in models.py, optim.py and the datasets
# package; each checks at import that it implements exactly these names, so a
# config that validates here always finds its implementation.
MODEL_NAMES = ("seed_convnet", "mlp", "keras_file")
NORM_NAMES = ("batchnorm", "groupnorm", "none")
OPTIMIZER_NAMES = ("adam", "sgd", "momentum", "rmsprop", "lars", "lamb")
SCALE_RULES = ("none", "linear", "sqrt")
SCHEDULE_NAMES = ("constant", "cosine", "exponential")
DATASET_NAMES = ("fashion_mnist", "npz", "image_folder")
STRATEGY_NAMES = ("default", "mirrored", "multi_worker")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")

# subdivisions when neither it nor micro_batch_size is given
DEFAULT_SUBDIVISIONS = 5

# Large enough for any real run, small enough that a typo like 5e9 is caught
# before it allocates anything.
MAX_BATCH_SIZE = 1_000_000
MAX_EPOCHS = 100_000


def _spec(
    default=dataclasses.MISSING,
    *,
    help: str,
    minimum=None,
    maximum=None,
    choices=None,
    exclusive_min=False,
    default_factory=dataclasses.MISSING,
):
    meta = {"help": help, "min": minimum, "max": maximum, "choices": choices, "exclusive_min": exclusive_min}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


# seed_convnet's channels at width 1.0 (models.py builds from them; groupnorm's groups are checked against them).
SEED_CHANNELS = (128, 256, 384, 512, 640)


@dataclass(frozen=True)
class ModelConfig:
    name: str = _spec(
        "seed_convnet",
        choices=MODEL_NAMES,
        help="seed_convnet: the seed's 5-conv net; mlp: a small dense net; "
        "keras_file: your own Keras 3 model from model.path",
    )
    width: float = _spec(
        0.25,
        minimum=0.0,
        exclusive_min=True,
        maximum=8.0,
        help="channel multiplier of seed_convnet (1.0 = 128..640 channels)",
    )
    norm: str = _spec(
        "batchnorm",
        choices=NORM_NAMES,
        help="seed_convnet and mlp: batchnorm after each conv (hidden layer), groupnorm "
        "(per example: micro-batch independent), or none",
    )
    hidden: int = _spec(256, minimum=1, maximum=65536, help="hidden units of mlp")
    bn_momentum: float = _spec(
        0.9,
        minimum=0.0,
        maximum=1.0,
        help="norm=batchnorm: share of the moving statistics kept at each update (moving = moving * m + "
        "batch * (1 - m)); they move once per update, so with few updates (a large batch) lower it, "
        "e.g. 0.9 ** (batch_size / 500) keeps the horizon of 0.9 at batch 500",
    )
    groups: int = _spec(
        8,
        minimum=1,
        maximum=65536,
        help="norm=groupnorm: channel groups; must divide every normalised layer's channels",
    )
    path: str | None = _spec(
        None,
        help="keras_file: a .keras file written by model.save() (loaded with "
        "safe_mode=True: no Lambda layers or custom code)",
    )
    from_logits: bool = _spec(
        True,
        help="keras_file: true if the model outputs logits, false if it ends "
        "in a softmax (trained on the logits under it; export keeps it)",
    )

    @property
    def norm_channels(self) -> tuple[int, ...]:
        """Channels of each layer the built-in model normalises (groupnorm's groups must divide them)."""
        if self.name == "seed_convnet":
            return tuple(max(1, round(c * self.width)) for c in SEED_CHANNELS)
        if self.name == "mlp":
            return (self.hidden,)
        return ()


@dataclass(frozen=True)
class ScheduleConfig:
    name: str = _spec("constant", choices=SCHEDULE_NAMES, help="learning-rate schedule, counted in updates (steps)")
    warmup_steps: int = _spec(0, minimum=0, help="linear warm-up from 0, in updates")
    decay_steps: int | None = _spec(
        None, minimum=1, help="cosine: length (default: the whole run); exponential: updates per factor decay_rate"
    )
    decay_rate: float = _spec(
        0.5, minimum=0.0, exclusive_min=True, maximum=1.0, help="exponential: factor per decay_steps"
    )
    min_ratio: float = _spec(
        0.0, minimum=0.0, maximum=1.0, help="cosine: final learning rate as a fraction of the peak"
    )


@dataclass(frozen=True)
class ScaleConfig:
    rule: str = _spec(
        "none",
        choices=SCALE_RULES,
        help="none: the rate as given; linear: rate x batch_size / base_batch_size (Goyal et al. 2017); "
        "sqrt: rate x (batch_size / base_batch_size) ** 0.5; with batch_schedule, the batch in force",
    )
    base_batch_size: int = _spec(
        256, minimum=1, maximum=MAX_BATCH_SIZE, help="the batch size optimizer.learning_rate is meant for"
    )

    def factor(self, batch_size: int) -> float:
        """What the configured rate is multiplied by at ``batch_size``."""
        power = {"none": 0.0, "linear": 1.0, "sqrt": 0.5}[self.rule]
        return 1.0 if power == 0.0 else (batch_size / self.base_batch_size) ** power


# Keys only the layer-wise adaptive optimizers read (lars, lamb): refused for the others, whose
# update they would not change.
ADAPTIVE_KEYS = ("weight_decay", "exclude_from_adaptation", "trust_coefficient")


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = _spec(
        "adam",
        choices=OPTIMIZER_NAMES,
        help="adam | sgd | momentum | rmsprop; lars: momentum SGD with a layer-wise trust ratio (You et al. "
        "2017); lamb: Adam with a layer-wise trust ratio (You et al. 2019)",
    )
    learning_rate: float = _spec(
        0.001,
        minimum=0.0,
        exclusive_min=True,
        maximum=100.0,
        help="peak learning rate (for scale_learning_rate.base_batch_size when scale_learning_rate.rule is set)",
    )
    momentum: float = _spec(0.9, minimum=0.0, maximum=1.0, help="momentum (momentum, lars) or rho (rmsprop)")
    clip_norm: float | None = _spec(
        None, minimum=0.0, exclusive_min=True, help="clip the accumulated gradient to this global norm"
    )
    schedule: ScheduleConfig = _spec(default_factory=ScheduleConfig, help="learning-rate schedule")
    scale_learning_rate: ScaleConfig = _spec(
        default_factory=ScaleConfig, help="scale learning_rate with the batch size (linear or sqrt rule)"
    )
    weight_decay: float = _spec(
        0.0,
        minimum=0.0,
        maximum=1.0,
        help="lars, lamb: weight decay added to the gradient (lars) or the update (lamb) before the trust "
        "ratio, as the papers do; not applied to the variables excluded from adaptation",
    )
    exclude_from_adaptation: tuple[str, ...] | None = _spec(
        None,
        help="lars, lamb: variables that get neither the trust ratio nor weight decay, as regular expressions "
        "searched in each variable's path; null: every variable with one axis (biases, normalisation scales "
        "and offsets), as both papers exclude them; []: none",
    )
    trust_coefficient: float = _spec(
        0.001, minimum=0.0, exclusive_min=True, maximum=1.0, help="lars: eta, the trust coefficient"
    )


@dataclass(frozen=True)
class BatchChange:
    epoch: int | None = _spec(None, minimum=1, maximum=MAX_EPOCHS, help="the 1-based epoch it starts at")
    step: int | None = _spec(None, minimum=0, help="or: the updates done before it starts (0: from the first)")
    batch_size: int | None = _spec(None, minimum=1, maximum=MAX_BATCH_SIZE, help="the batch size from then on")


@dataclass(frozen=True)
class AugmentConfig:
    flip: bool = _spec(
        False,
        help="mirror each training image left-right with probability 1/2 (only for "
        "data whose mirror image keeps its class: clothes, not digits or text)",
    )
    crop: int = _spec(
        0,
        minimum=0,
        maximum=4096,
        help="pad each training image with this many zero pixels per side and cut a random "
        "window of its own size: shifts of up to crop pixels",
    )


@dataclass(frozen=True)
class DataConfig:
    name: str = _spec(
        "fashion_mnist",
        choices=DATASET_NAMES,
        help="fashion_mnist: the built-in set; npz: your arrays in one .npz file; "
        "image_folder: your PNG/JPEG files in class folders",
    )
    dir: str | None = _spec(
        None, help="fashion_mnist: folder with the IDX .gz files (default: $ACCUM_TRAIN_DATA, Debian's, the cache)"
    )
    path: str | None = _spec(
        None,
        help="npz: the .npz file (x_train, y_train, x_test, y_test, optional "
        "class_names); image_folder: the folder holding train/CLASS/*.png "
        "and test/CLASS/*.png (also .jpg, .jpeg)",
    )
    image_size: tuple[int, int] | None = _spec(
        None,
        minimum=1,
        help="image_folder: resize every image to [H, W] (bilinear); null: every image must already have one size",
    )
    channels: int | None = _spec(
        None,  # 1 or 3: checked with the other data keys
        help="image_folder: decode every image to 1 (grayscale) or 3 (RGB) "
        "channels; null: 3, as keras.utils.image_dataset_from_directory",
    )
    num_classes: int | None = _spec(
        None,
        minimum=2,
        maximum=1_000_000,
        help="npz: the class count (null: the largest label + 1, or the "
        "length of class_names); a label >= num_classes is an error",
    )
    shuffle: bool = _spec(
        True, help="false: every epoch reads the training examples in their stored order (as model.fit(shuffle=False))"
    )
    train_limit: int | None = _spec(None, minimum=1, help="use only the first N training examples")
    test_limit: int | None = _spec(None, minimum=1, help="use only the first N test examples")
    validation: int = _spec(
        0,
        minimum=0,
        help="hold out this many training examples (the same random choice in every run) "
        "as a validation split, evaluated every epoch: choose settings on it and "
        "keep the test split for the final figure",
    )
    augment: AugmentConfig = _spec(
        default_factory=AugmentConfig, help="random changes to each training image, drawn from (seed, update)"
    )


@dataclass(frozen=True)
class StrategyConfig:
    name: str = _spec(
        "default",
        choices=STRATEGY_NAMES,
        help="default: one device; mirrored: the visible devices of this machine; "
        "multi_worker: one process per machine, from TF_CONFIG or --workers",
    )
    cpu_devices: int | None = _spec(
        None, minimum=1, maximum=64, help="mirrored: split the CPU into this many logical devices"
    )
    worker_timeout_s: float = _spec(
        60.0,
        minimum=0.0,
        exclusive_min=True,
        help="--workers: how long a worker may take to start, and how long the others get to stop when one fails",
    )


@dataclass(frozen=True)
class LossScaleConfig:
    initial: float = _spec(
        32768.0, minimum=1.0, maximum=2.0**64, help="mixed_float16: the loss scale of the first update"
    )
    growth_updates: int = _spec(
        2000, minimum=1, help="mixed_float16: double the scale after this many applied updates in a row"
    )


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = _spec(0, minimum=0, help="also checkpoint every N updates (0: epoch ends only)")
    keep: int = _spec(3, minimum=1, maximum=1000, help="checkpoints kept")


@dataclass(frozen=True)
class Config:
    model: ModelConfig = _spec(default_factory=ModelConfig, help="the network")
    batch_size: int = _spec(
        500,
        minimum=1,
        maximum=MAX_BATCH_SIZE,
        help="examples per update (the large batch); the first of batch_schedule",
    )
    subdivisions: int | str | None = _spec(
        None,
        minimum=1,
        maximum=MAX_BATCH_SIZE,
        choices="auto",
        help=f"micro-batches per update; sizes differ by at most one; auto: the fewest that fit in memory_limit; "
        f"null: from micro_batch_size ({DEFAULT_SUBDIVISIONS} when neither is given)",
    )
    micro_batch_size: int | None = _spec(
        None,
        minimum=1,
        maximum=MAX_BATCH_SIZE,
        help="instead of subdivisions: the most examples a device computes at once (what fits); "
        "k = ceil(batch_size / micro_batch_size) per device, and again at each batch_schedule change",
    )
    batch_schedule: tuple[BatchChange, ...] = _spec(
        (),
        help="batch sizes that change during the run, keyed by epoch or by step: "
        "[{epoch: 1, batch_size: 500}, {epoch: 6, batch_size: 2000}]",
    )
    epochs: int = _spec(10, minimum=1, maximum=MAX_EPOCHS, help="passes over the training set")
    seed: int = _spec(0, minimum=0, maximum=2**31 - 1, help="weights and data order")
    optimizer: OptimizerConfig = _spec(default_factory=OptimizerConfig, help="the optimizer")
    data: DataConfig = _spec(default_factory=DataConfig, help="the dataset")
    baseline: bool = _spec(False, help="true: plain optimizer on the whole batch, no cache")
    log_every: int = _spec(10, minimum=1, help="updates between progress and TensorBoard writes")
    checkpoint: CheckpointConfig = _spec(default_factory=CheckpointConfig, help="checkpointing")
    strategy: StrategyConfig = _spec(default_factory=StrategyConfig, help="tf.distribute strategy")
    max_bad_updates: int = _spec(
        10, minimum=1, help="stop after this many updates in a row skipped for a non-finite loss or gradient"
    )
    precision: str = _spec(
        "float32",
        choices=PRECISIONS,
        help="float32 | mixed_bfloat16 | mixed_float16: compute in 16 bits, with weights, "
        "gradient cache and optimizer state in float32",
    )
    loss_scale: LossScaleConfig = _spec(
        default_factory=LossScaleConfig, help="mixed_float16 only: one dynamic loss scale per update"
    )
    parallel_micro_steps: int | str = _spec(
        "auto",
        minimum=1,
        maximum=64,
        choices="auto",
        help="micro-batches computed at once, each on its share of the CPU cores (memory then holds this "
        "many); auto: 2 on a machine without a GPU when subdivisions > 1 and no memory_limit is set "
        "(measured faster there), else 1",
    )
    memory_limit: str | None = _spec(
        None,
        choices="size",
        help="stop a run whose TensorFlow allocator peak exceeds this (e.g. 2GiB): a smaller device, simulated",
    )

    @property
    def memory_limit_bytes(self) -> int | None:
        return None if self.memory_limit is None else parse_size(self.memory_limit, "memory_limit")

    def subdivisions_for(self, batch_size: int, replicas: int = 1) -> int | str:
        """k for a batch of ``batch_size`` on ``replicas``: each replica cuts its share into this many micro-batches
        (micro_batch_size: the fewest that keep each within it; subdivisions: as given; auto: "auto")."""
        if self.micro_batch_size is None:
            return self.subdivisions
        return k_for_micro_batch(batch_size, self.micro_batch_size, replicas)

    @property
    def largest_micro_batch(self) -> int:
        """The largest micro-batch of the first batch on one device: what memory has to hold."""
        if self.auto_subdivisions:
            raise ValueError("subdivisions=auto has no micro-batch size until the run measures one")
        return math.ceil(self.batch_size / self.subdivisions_for(self.batch_size))

    @property
    def auto_subdivisions(self) -> bool:
        return self.subdivisions == "auto"

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Every batch size the run uses: batch_size, then batch_schedule's."""
        return (self.batch_size, *(change.batch_size for change in self.batch_schedule))

    def with_decay_steps(self, decay_steps: int | None) -> Config:
        schedule = dataclasses.replace(self.optimizer.schedule, decay_steps=decay_steps)
        return dataclasses.replace(self, optimizer=dataclasses.replace(self.optimizer, schedule=schedule))

    def resolved(self, total_steps: int) -> Config:
        """Fix what is computed from the run's length when the run starts.

        A decaying schedule with decay_steps null decays over the whole run
        (after warm-up). The length is resolved here and written into the
        run's config.yaml, so a run resumed with more epochs keeps the curve
        it started on instead of silently bending it."""
        schedule = self.optimizer.schedule
        if schedule.name == "constant" or schedule.decay_steps is not None:
            return self
        return self.with_decay_steps(max(1, total_steps - schedule.warmup_steps))

    def to_dict(self) -> dict:
        # YAML's safe dumper has no tuples (data.image_size): write them as lists.
        return dataclasses.asdict(
            self,
            dict_factory=lambda items: {
                key: list(value) if isinstance(value, tuple) else value for key, value in items
            },
        )

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# ----------------------------------------------------------------------------
# Parsing


def load_config(path: str | Path | None, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML file (or only defaults, if path is None), apply overrides."""
    source = str(path) if path is not None else "defaults"
    raw: dict = {}
    if path is not None:
        raw = _read_yaml(Path(path))
    overridden: set = set()
    for item in overrides:
        key, value = _parse_override(item)
        _set_dotted(raw, key, value, source)
        overridden.add(key)
    return config_from_dict(raw, source, overridden)


def with_overrides(base: Config | dict, overrides, source: str = "config") -> Config:
    """A Config (or a dict in the YAML's shape) with overrides applied, checked: ``overrides`` as --set takes
    them ("KEY=VALUE" strings, the value read as YAML) or a dict {KEY: value}."""
    raw = copy.deepcopy(base.to_dict() if isinstance(base, Config) else base)
    if not isinstance(raw, dict):
        return config_from_dict(raw, source)
    items = overrides.items() if isinstance(overrides, dict) else [_parse_override(item) for item in overrides]
    overridden: set = set()
    for key, value in items:
        _set_dotted(raw, key, value, source)
        overridden.add(key)
    return config_from_dict(raw, source, overridden)


def as_config(config: str | Path | dict | Config | None, overrides=()) -> Config:
    """A checked Config from a YAML path (None: the defaults), a dict in the YAML's shape or a Config,
    overrides applied (see ``with_overrides``)."""
    if isinstance(config, (Config, dict)):
        return with_overrides(config, overrides or ())
    if isinstance(overrides, dict):
        source = str(config) if config is not None else "defaults"
        raw = _read_yaml(Path(config)) if config is not None else {}
        return with_overrides(raw, overrides, source)
    return load_config(config, overrides or ())


def config_from_dict(raw: Any, source: str = "config", overridden: typing.Collection[str] = ()) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: the config must be a mapping of keys (e.g. 'batch_size: 500'), got {_type_word(raw)}"
        )
    cfg = _build(Config, raw, "", source, set(overridden))
    cfg = _resolve_batches(cfg, "batch_size" in raw, source, set(overridden))
    _check_relations(cfg, source, set(overridden))
    return cfg


def _resolve_batches(cfg: Config, batch_size_given: bool, source: str, overridden: set) -> Config:
    """subdivisions or micro_batch_size (the default k when neither is given); batch_schedule checked and its
    first batch made batch_size when it starts at the start."""

    where = _blamer(source, overridden)

    if cfg.subdivisions is not None and cfg.micro_batch_size is not None:
        # --set of one over the file's other: the later word wins, as for any key
        by_set = {key: _came_from_set(key, overridden) for key in ("subdivisions", "micro_batch_size")}
        if by_set["micro_batch_size"] and not by_set["subdivisions"]:
            cfg = dataclasses.replace(cfg, subdivisions=None)
        elif by_set["subdivisions"] and not by_set["micro_batch_size"]:
            cfg = dataclasses.replace(cfg, micro_batch_size=None)
    if cfg.subdivisions is not None and cfg.micro_batch_size is not None:
        raise ConfigError(
            f"{where('subdivisions', 'micro_batch_size')}: give subdivisions or micro_batch_size, not both "
            f"(subdivisions={cfg.subdivisions}, micro_batch_size={cfg.micro_batch_size}): remove one"
        )
    if cfg.subdivisions is None and cfg.micro_batch_size is None:
        cfg = dataclasses.replace(cfg, subdivisions=DEFAULT_SUBDIVISIONS)
    changes = cfg.batch_schedule
    if not changes:
        return cfg
    at = where("batch_schedule")
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
        if batch_size_given and cfg.batch_size != first:
            raise ConfigError(
                f"{where('batch_size', 'batch_schedule')}: batch_size={cfg.batch_size} and batch_schedule[0] "
                f"({unit} {starts[0]}, batch_size={first}) both set the first batch size: remove one"
            )
        cfg = dataclasses.replace(cfg, batch_size=first, batch_schedule=changes[1:])
    return cfg


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file {path} does not exist: pass the path of a YAML file, e.g. configs/fmnist.yaml"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory: pass the path of a YAML file") from None
    except PermissionError:
        raise ConfigError(f"config file {path} is not readable: check its permissions") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text: pass a YAML file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "an unknown place"
        problem = err.problem or str(err)
        raise ConfigError(f"{path}: YAML syntax error at {where}: {problem}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: YAML error: {str(err).splitlines()[0]}") from None
    return {} if data is None else data


def _parse_override(item: str):
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r} must look like KEY=VALUE, e.g. --set subdivisions=10")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        raise ConfigError(
            f"--set {item!r}: the value {text!r} is not valid YAML; quote strings, e.g. --set model.name=mlp"
        ) from None
    return key, value


def _set_dotted(raw: dict, key: str, value: Any, source: str) -> None:
    parts = key.split(".")
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            prefix = ".".join(parts[: depth + 1])
            raise ConfigError(
                f"--set {key}: {prefix} is {_show(child)} in {source}, "
                f"not a mapping, so it has no key {parts[depth + 1]!r}"
            )
        node = child
    node[parts[-1]] = value


# Names other tools use for our keys, which difflib cannot guess from spelling.
ALIASES = {
    "lr": "learning_rate",
    "lrate": "learning_rate",
    "bs": "batch_size",
    "batch": "batch_size",
    "subdiv": "subdivisions",
    "accumulation_steps": "subdivisions",
    "gradient_accumulation_steps": "subdivisions",
    "optim": "optimizer",
    "network": "model",
}


def _hint(key: str, valid: typing.Sequence[str], prefix: str = "") -> str:
    if ALIASES.get(key) in valid:
        return f"did you mean {prefix + ALIASES[key]!r}?"
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"did you mean {prefix + close[0]!r}?"
    return "valid keys: " + ", ".join(valid)


def _build(cls, raw: dict, prefix: str, source: str, overridden: set):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in raw:
        if key not in fields:
            dotted = prefix + str(key)
            where = "--set" if dotted in overridden else source
            raise ConfigError(f"{where}: unknown key {dotted!r} ({_hint(str(key), list(fields), prefix)})")
    values = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        dotted = prefix + name
        where = "--set" if _came_from_set(dotted, overridden) else source
        values[name] = _check_value(hints[name], f.metadata, raw[name], dotted, where, overridden)
    return cls(**values)


def _blamer(source: str, overridden: set):
    """``where(*keys)``: "--set" if any of ``keys`` came from --set, else ``source`` (what an error names)."""

    def where(*keys) -> str:
        return "--set" if any(_came_from_set(k, overridden) for k in keys) else source

    return where


def _came_from_set(dotted: str, overridden: set) -> bool:
    return any(dotted == k or dotted.startswith(k + ".") for k in overridden)


def _check_value(tp, meta, value, key, where, overridden):
    optional = False
    if typing.get_origin(tp) in (Union, types.UnionType):  # Optional[int] or int | None
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = type(None) in typing.get_args(tp)
        if meta.get("choices") == "auto":  # an integer, or the word auto
            if value == "auto":
                return value
            if isinstance(value, str):
                raise ConfigError(f"{where}: {key}={_show(value)} must be an integer{_range_text(meta)} or auto")
            meta = {**meta, "choices": None}
        tp = args[0]
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: {key} is empty: {_expected(tp, meta)}")
    if typing.get_origin(tp) is tuple and typing.get_args(tp)[-1] is Ellipsis:  # a list of any length
        return _check_list(typing.get_args(tp)[0], value, key, where, overridden)
    if typing.get_origin(tp) is tuple:  # a fixed-length list of integers, e.g. data.image_size
        size = len(typing.get_args(tp))
        if (
            not isinstance(value, list)
            or len(value) != size
            or any(isinstance(v, bool) or not isinstance(v, int) or v < meta["min"] for v in value)
        ):
            words = {2: "two", 3: "three"}
            example = "[28, 28]" if size == 2 else str([1] * size)
            raise ConfigError(
                f"{where}: {key}={_show(value)} must be a list of {words.get(size, size)} "
                f"integers >= {meta['min']}, e.g. {example}"
            )
        return tuple(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(
                f"{where}: {key}={_show(value)} must be a mapping of keys "
                f"(e.g. {key}: {{{dataclasses.fields(tp)[0].name}: ...}})"
            )
        return _build(tp, value, key + ".", where, overridden)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key}={_show(value)} must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {key}={_show(value)} must be an integer{_range_text(meta)}")
    elif tp is float:
        # YAML 1.1 reads 1e-3 (no dot) as a string; users mean the number.
        if isinstance(value, str) and re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+\s*", value):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {key}={_show(value)} must be a number{_range_text(meta)}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: {key}={_show(value)} must be a finite number{_range_text(meta)}")
        _check_range(value, meta, key, where)
        return float(value)
    elif tp is str and meta.get("choices") == "size":
        try:
            parse_size(value, key)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
        return str(value)
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(
                f"{where}: {key}={_show(value)} must be a string"
                + (f" (one of {', '.join(meta['choices'])})" if meta.get("choices") else "")
            )
        choices = meta.get("choices")
        if choices and value not in choices:
            close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: {key}={_show(value)} is not one of {', '.join(choices)}{hint}")
        return value
    else:  # pragma: no cover - a field type the schema does not handle is a bug
        raise TypeError(f"unsupported config type {tp!r} for {key}")
    _check_range(value, meta, key, where)
    return value


def _check_list(item_type, value, key, where, overridden) -> tuple:
    """A list of strings, or of mappings read as ``item_type`` (a dataclass), each item named key[i]."""
    if dataclasses.is_dataclass(item_type):
        first = dataclasses.fields(item_type)[0].name
        example = f"[{{{first}: ...}}, ...]"
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise ConfigError(f"{where}: {key}={_show(value)} must be a list of mappings, e.g. {example}")
        return tuple(_build(item_type, item, f"{key}[{i}].", where, overridden) for i, item in enumerate(value))
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{where}: {key}={_show(value)} must be a list of strings, e.g. ['bias', 'norm']")
    return tuple(value)


def _check_range(value, meta, key, where):
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None:
        if meta.get("exclusive_min") and not value > lo:
            raise ConfigError(f"{where}: {key}={_show(value)} must be > {lo}{_upper(hi)}")
        if not meta.get("exclusive_min") and value < lo:
            raise ConfigError(f"{where}: {key}={_show(value)} must be >= {lo}{_upper(hi)}")
    if hi is not None and value > hi:
        raise ConfigError(f"{where}: {key}={_show(value)} must be <= {hi}")


def _upper(hi) -> str:
    return f" and <= {hi}" if hi is not None else ""


def _range_text(meta) -> str:
    lo, hi = meta.get("min"), meta.get("max")
    if lo is None and hi is None:
        return ""
    parts = []
    if lo is not None:
        parts.append(f"{'>' if meta.get('exclusive_min') else '>='} {lo}")
    if hi is not None:
        parts.append(f"<= {hi}")
    return " " + " and ".join(parts)


def _expected(tp, meta) -> str:
    word = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, "a mapping")
    if meta.get("choices"):
        return f"set it to one of {', '.join(meta['choices'])}"
    return f"set it to {word}{_range_text(meta)}"


def _check_relations(cfg: Config, source: str, overridden: set) -> None:
    where = _blamer(source, overridden)

    if cfg.auto_subdivisions:
        if cfg.memory_limit is None:
            raise ConfigError(
                f"{where('subdivisions', 'memory_limit')}: subdivisions=auto needs memory_limit "
                f"(e.g. memory_limit: 2GiB) to know what fits"
            )
    elif cfg.subdivisions is not None and cfg.subdivisions > min(cfg.batch_sizes):
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
    if cfg.batch_schedule:
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
    if cfg.precision != "mixed_float16" and cfg.loss_scale != LossScaleConfig():
        raise ConfigError(
            f"{where('loss_scale.initial', 'loss_scale.growth_updates', 'precision')}: loss_scale is only for "
            f"precision=mixed_float16 (precision={cfg.precision} needs no loss scaling): remove it or set the precision"
        )
    if cfg.strategy.cpu_devices is not None and cfg.strategy.name != "mirrored":
        raise ConfigError(f"{where('strategy.cpu_devices')}: strategy.cpu_devices is only for strategy.name=mirrored")
    _check_data_keys(cfg.data, where)
    limit = cfg.data.train_limit
    if limit is not None and cfg.data.validation >= limit:
        raise ConfigError(
            f"{where('data.validation', 'data.train_limit')}: data.validation={cfg.data.validation} "
            f"leaves no training examples of data.train_limit={limit}: lower it or raise the limit"
        )
    if limit is not None and limit < cfg.batch_size:
        raise ConfigError(
            f"{where('data.train_limit', 'batch_size')}: data.train_limit={limit} is smaller "
            f"than batch_size={cfg.batch_size}: raise it or lower batch_size"
        )
    if limit is not None and limit < max(cfg.batch_sizes):
        raise ConfigError(
            f"{where('data.train_limit', 'batch_schedule')}: data.train_limit={limit} is smaller than "
            f"batch_schedule's batch_size={max(cfg.batch_sizes)}: raise it or lower that batch size"
        )


def _check_optimizer_keys(optimizer: OptimizerConfig, where) -> None:
    default = OptimizerConfig()
    for key in ADAPTIVE_KEYS:
        owners = ("lars",) if key == "trust_coefficient" else ("lars", "lamb")
        if getattr(optimizer, key) != getattr(default, key) and optimizer.name not in owners:
            raise ConfigError(
                f"{where('optimizer.' + key, 'optimizer.name')}: optimizer.{key} is only for optimizer.name="
                f"{' or '.join(owners)}, not {optimizer.name}: remove it or change the optimizer"
            )
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
    for key, hint in (
        ("path", "remove it or set model.name=keras_file"),
        ("from_logits", "the built-in models output logits; remove it"),
    ):
        if getattr(model, key) != getattr(default, key):
            raise ConfigError(
                f"{where('model.' + key, 'model.name')}: model.{key} is only for "
                f"model.name=keras_file, not {model.name}: {hint}"
            )
    if model.norm != "batchnorm" and model.bn_momentum != default.bn_momentum:
        raise ConfigError(
            f"{where('model.bn_momentum', 'model.norm')}: model.bn_momentum is only for "
            f"model.norm=batchnorm, not {model.norm}: remove it or set model.norm=batchnorm"
        )
    if model.norm != "groupnorm":
        if model.groups != default.groups:
            raise ConfigError(
                f"{where('model.groups', 'model.norm')}: model.groups is only for "
                f"model.norm=groupnorm, not {model.norm}: remove it or set model.norm=groupnorm"
            )
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


# Which data.name each dataset key is for (name, dir, train_limit, test_limit are for all).
DATA_KEYS_FOR = {
    "dir": ("fashion_mnist",),
    "path": ("npz", "image_folder"),
    "image_size": ("image_folder",),
    "channels": ("image_folder",),
    "num_classes": ("npz",),
}
DATA_KEY_HINTS = {
    ("dir", "npz"): "give the .npz file as data.path",
    ("dir", "image_folder"): "give the folder as data.path",
    ("path", "fashion_mnist"): "Fashion-MNIST's folder is data.dir; for your own data set data.name to npz "
    "or image_folder",
    ("image_size", "npz"): "an .npz's images are used at their own size",
    ("channels", "npz"): "an .npz's channels are its images' last axis",
    ("num_classes", "image_folder"): "the classes are the folder's class folders",
}


def _check_data_keys(data: DataConfig, where) -> None:
    for key, names in DATA_KEYS_FOR.items():
        if getattr(data, key) is not None and data.name not in names:
            hint = DATA_KEY_HINTS.get((key, data.name), f"remove it or set data.name to {' or '.join(names)}")
            raise ConfigError(
                f"{where('data.' + key, 'data.name')}: data.{key} is only for data.name="
                f"{' or '.join(names)}, not {data.name}: {hint}"
            )
    if data.name in DATA_KEYS_FOR["path"] and data.path is None:
        example = "mydata.npz" if data.name == "npz" else "my_images"
        raise ConfigError(
            f"{where('data.name', 'data.path')}: data.name={data.name} needs data.path "
            f"(e.g. data: {{name: {data.name}, path: {example}}})"
        )
    if data.channels is not None and data.channels not in (1, 3):
        raise ConfigError(f"{where('data.channels')}: data.channels={data.channels} must be 1 (grayscale) or 3 (RGB)")


def _show(value) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        text = yaml.safe_dump(value, default_flow_style=True).strip()
        return text if len(text) <= 40 else text[:37] + "..."
    return str(value)


def _type_word(value) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)(i?)([bB]?)\s*$")


def parse_size(text: str | int, key: str = "size") -> int:
    """'2GiB' -> 2147483648. KiB/MiB/GiB and bare K/M/G are powers of 1024; KB/MB/GB of 1000."""
    if isinstance(text, bool):
        raise ConfigError(f"{key}={_show(text)} must be a size such as 2GiB or 512MB")
    if isinstance(text, int):
        if text <= 0:
            raise ConfigError(f"{key}={text} must be > 0 bytes")
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ConfigError(f"{key}={_show(text)} must be a size such as 2GiB, 512MB or 1073741824")
    number, unit, binary, byte = match.groups()
    power = " KMGT".index(unit.upper()) if unit else 0
    base = 1000 if (unit and byte and not binary) else 1024
    size = int(float(number) * base**power)
    if size <= 0:
        raise ConfigError(f"{key}={_show(text)} must be > 0 bytes")
    return size
