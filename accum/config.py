"""The config: every default in one place, parsed and validated once.

A YAML file lists only what differs from the defaults below. ``load_config``
reads it with ``yaml.safe_load`` (data only: no tags, no eval, no imports),
applies ``--set key=value`` overrides, checks every key and value against the
dataclasses here, and returns a frozen ``Config``. Nothing else in the project
reads raw dicts. Each error names the key, the value and what is allowed, in
one line, and says where the value came from (the file or ``--set``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from .errors import ConfigError

# Registries. The implementations live in models.py, optim.py and the datasets
# package; each checks at import that it implements exactly these names, so a
# config that validates here always finds its implementation.
MODEL_NAMES = ("seed_convnet", "mlp")
NORM_NAMES = ("batchnorm", "none")
OPTIMIZER_NAMES = ("adam", "sgd", "momentum", "rmsprop")
SCHEDULE_NAMES = ("constant", "cosine", "exponential")
DATASET_NAMES = ("fashion_mnist",)
STRATEGY_NAMES = ("default", "mirrored", "multi_worker")

# Large enough for any real run, small enough that a typo like 5e9 is caught
# before it allocates anything.
MAX_BATCH_SIZE = 1_000_000
MAX_EPOCHS = 100_000


def _spec(default=dataclasses.MISSING, *, help: str, minimum=None, maximum=None,
          choices=None, exclusive_min=False, default_factory=dataclasses.MISSING):
    meta = {"help": help, "min": minimum, "max": maximum, "choices": choices,
            "exclusive_min": exclusive_min}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelConfig:
    name: str = _spec("seed_convnet", choices=MODEL_NAMES,
                      help="seed_convnet: the seed's 5-conv net; mlp: a small dense net")
    width: float = _spec(0.25, minimum=0.0, exclusive_min=True, maximum=8.0,
                         help="channel multiplier of seed_convnet (1.0 = 128..640 channels)")
    norm: str = _spec("batchnorm", choices=NORM_NAMES,
                      help="batchnorm after each conv, or none (no batch-dependent layer)")
    hidden: int = _spec(256, minimum=1, maximum=65536, help="hidden units of mlp")


@dataclass(frozen=True)
class ScheduleConfig:
    name: str = _spec("constant", choices=SCHEDULE_NAMES,
                      help="learning-rate schedule, counted in updates (steps)")
    warmup_steps: int = _spec(0, minimum=0, help="linear warm-up from 0, in updates")
    decay_steps: Optional[int] = _spec(None, minimum=1,
                                       help="cosine: length (default: the whole run); "
                                            "exponential: updates per factor decay_rate")
    decay_rate: float = _spec(0.5, minimum=0.0, exclusive_min=True, maximum=1.0,
                              help="exponential: factor per decay_steps")
    min_ratio: float = _spec(0.0, minimum=0.0, maximum=1.0,
                             help="cosine: final learning rate as a fraction of the peak")


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = _spec("adam", choices=OPTIMIZER_NAMES, help="optimizer")
    learning_rate: float = _spec(0.001, minimum=0.0, exclusive_min=True, maximum=100.0,
                                 help="peak learning rate")
    momentum: float = _spec(0.9, minimum=0.0, maximum=1.0,
                            help="momentum (momentum) or rho (rmsprop)")
    clip_norm: Optional[float] = _spec(None, minimum=0.0, exclusive_min=True,
                                       help="clip the accumulated gradient to this global norm")
    schedule: ScheduleConfig = _spec(default_factory=ScheduleConfig, help="learning-rate schedule")


@dataclass(frozen=True)
class DataConfig:
    name: str = _spec("fashion_mnist", choices=DATASET_NAMES, help="dataset")
    dir: Optional[str] = _spec(None, help="folder with the IDX .gz files "
                                          "(default: $ACCUM_TRAIN_DATA, Debian's, the cache)")
    train_limit: Optional[int] = _spec(None, minimum=1, help="use only the first N training examples")
    test_limit: Optional[int] = _spec(None, minimum=1, help="use only the first N test examples")


@dataclass(frozen=True)
class StrategyConfig:
    name: str = _spec("default", choices=STRATEGY_NAMES,
                      help="default: one device; mirrored: the visible devices of this machine; "
                           "multi_worker: one process per machine, from TF_CONFIG or --workers")
    cpu_devices: Optional[int] = _spec(None, minimum=1, maximum=64,
                                       help="mirrored: split the CPU into this many logical devices")
    worker_timeout_s: float = _spec(60.0, minimum=0.0, exclusive_min=True,
                                    help="--workers: how long a worker may take to start, and how long "
                                         "the others get to stop when one fails")


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = _spec(0, minimum=0, help="also checkpoint every N updates (0: epoch ends only)")
    keep: int = _spec(3, minimum=1, maximum=1000, help="checkpoints kept")


@dataclass(frozen=True)
class Config:
    model: ModelConfig = _spec(default_factory=ModelConfig, help="the network")
    batch_size: int = _spec(500, minimum=1, maximum=MAX_BATCH_SIZE,
                            help="examples per update (the large batch)")
    subdivisions: Union[int, str] = _spec(5, minimum=1, maximum=MAX_BATCH_SIZE, choices="auto",
                                          help="micro-batches per update; sizes differ by at most one; "
                                               "auto: the fewest that fit in memory_limit")
    epochs: int = _spec(10, minimum=1, maximum=MAX_EPOCHS, help="passes over the training set")
    seed: int = _spec(0, minimum=0, maximum=2**31 - 1, help="weights and data order")
    optimizer: OptimizerConfig = _spec(default_factory=OptimizerConfig, help="the optimizer")
    data: DataConfig = _spec(default_factory=DataConfig, help="the dataset")
    baseline: bool = _spec(False, help="true: plain optimizer on the whole batch, no cache")
    log_every: int = _spec(10, minimum=1, help="updates between progress and TensorBoard writes")
    checkpoint: CheckpointConfig = _spec(default_factory=CheckpointConfig, help="checkpointing")
    strategy: StrategyConfig = _spec(default_factory=StrategyConfig, help="tf.distribute strategy")
    max_bad_updates: int = _spec(10, minimum=1, help="stop after this many updates in a row skipped "
                                                     "for a non-finite loss or gradient")
    memory_limit: Optional[str] = _spec(None, choices="size",
                                        help="stop a run whose TensorFlow allocator peak exceeds this "
                                             "(e.g. 2GiB): a smaller device, simulated")

    @property
    def memory_limit_bytes(self) -> Optional[int]:
        return None if self.memory_limit is None else parse_size(self.memory_limit, "memory_limit")

    @property
    def micro_batch_size(self) -> int:
        """The largest micro-batch: what memory has to hold."""
        if self.subdivisions == "auto":
            raise ValueError("subdivisions=auto has no micro-batch size until the run measures one")
        return math.ceil(self.batch_size / self.subdivisions)

    @property
    def auto_subdivisions(self) -> bool:
        return self.subdivisions == "auto"

    def with_decay_steps(self, decay_steps: Optional[int]) -> "Config":
        schedule = dataclasses.replace(self.optimizer.schedule, decay_steps=decay_steps)
        return dataclasses.replace(self, optimizer=dataclasses.replace(self.optimizer, schedule=schedule))

    def resolved(self, total_steps: int) -> "Config":
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
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# ----------------------------------------------------------------------------
# Parsing


def load_config(path: Union[str, Path, None], overrides: typing.Sequence[str] = ()) -> Config:
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


def config_from_dict(raw: Any, source: str = "config", overridden: typing.Collection[str] = ()) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the config must be a mapping of keys "
                          f"(e.g. 'batch_size: 500'), got {_type_word(raw)}")
    cfg = _build(Config, raw, "", source, set(overridden))
    _check_relations(cfg, source, set(overridden))
    return cfg


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist: pass the path of a YAML file, "
                          f"e.g. configs/fmnist.yaml") from None
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
        raise ConfigError(f"--set {item!r}: the value {text!r} is not valid YAML; "
                          f"quote strings, e.g. --set model.name=mlp") from None
    return key, value


def _set_dotted(raw: dict, key: str, value: Any, source: str) -> None:
    parts = key.split(".")
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            prefix = ".".join(parts[:depth + 1])
            raise ConfigError(f"--set {key}: {prefix} is {_show(child)} in {source}, "
                              f"not a mapping, so it has no key {parts[depth + 1]!r}")
        node = child
    node[parts[-1]] = value


# Names other tools use for our keys, which difflib cannot guess from spelling.
ALIASES = {"lr": "learning_rate", "lrate": "learning_rate", "bs": "batch_size",
           "batch": "batch_size", "subdiv": "subdivisions", "accumulation_steps": "subdivisions",
           "gradient_accumulation_steps": "subdivisions", "optim": "optimizer", "network": "model"}


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


def _came_from_set(dotted: str, overridden: set) -> bool:
    return any(dotted == k or dotted.startswith(k + ".") for k in overridden)


def _check_value(tp, meta, value, key, where, overridden):
    optional = False
    if typing.get_origin(tp) is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = type(None) in typing.get_args(tp)
        if meta.get("choices") == "auto":  # an integer, or the word auto
            if value == "auto":
                return value
            if isinstance(value, str):
                raise ConfigError(f"{where}: {key}={_show(value)} must be an integer{_range_text(meta)} "
                                  f"or auto")
            meta = {**meta, "choices": None}
        tp = args[0]
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: {key} is empty: {_expected(tp, meta)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {key}={_show(value)} must be a mapping of keys "
                              f"(e.g. {key}: {{{dataclasses.fields(tp)[0].name}: ...}})")
        return _build(tp, value, key + ".", where if where == "--set" else where, overridden)
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
            raise ConfigError(f"{where}: {key}={_show(value)} must be a string"
                              + (f" (one of {', '.join(meta['choices'])})" if meta.get("choices") else ""))
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
    def where(*keys):
        return "--set" if any(_came_from_set(k, overridden) for k in keys) else source

    if cfg.auto_subdivisions:
        if cfg.memory_limit is None:
            raise ConfigError(f"{where('subdivisions', 'memory_limit')}: subdivisions=auto needs memory_limit "
                              f"(e.g. memory_limit: 2GiB) to know what fits")
    elif cfg.subdivisions > cfg.batch_size:
        raise ConfigError(f"{where('subdivisions', 'batch_size')}: subdivisions={cfg.subdivisions} "
                          f"must be <= batch_size={cfg.batch_size} (a micro-batch holds at least one example)")
    if cfg.strategy.name != "default":
        name = cfg.strategy.name
        for bad, why in ((cfg.model.norm != "none", "model.norm=none (BatchNorm statistics are not yet "
                                                    "pooled across replicas)"),
                         (cfg.optimizer.clip_norm is not None, "optimizer.clip_norm=null (clipping needs the "
                                                               "all-reduced gradient, not yet supported)"),
                         (cfg.auto_subdivisions, "a fixed subdivisions (auto is single-device only)"),
                         (cfg.baseline, "baseline=false")):
            if bad:
                raise ConfigError(f"{where('strategy.name')}: strategy.name={name} needs {why}")
    if cfg.strategy.cpu_devices is not None and cfg.strategy.name != "mirrored":
        raise ConfigError(f"{where('strategy.cpu_devices')}: strategy.cpu_devices is only for "
                          f"strategy.name=mirrored")
    limit = cfg.data.train_limit
    if limit is not None and limit < cfg.batch_size:
        raise ConfigError(f"{where('data.train_limit', 'batch_size')}: data.train_limit={limit} is smaller "
                          f"than batch_size={cfg.batch_size}: raise it or lower batch_size")


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
    return {list: "a list", str: "a string", int: "a number", float: "a number",
            bool: "a boolean"}.get(type(value), type(value).__name__)


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)(i?)([bB]?)\s*$")


def parse_size(text: Union[str, int], key: str = "size") -> int:
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
    size = int(float(number) * base ** power)
    if size <= 0:
        raise ConfigError(f"{key}={_show(text)} must be > 0 bytes")
    return size
