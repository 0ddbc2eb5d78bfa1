"""Reading a config: YAML (PyYAML's SafeLoader: data only, no tags, no eval, no imports), ``--set KEY=VALUE``
overrides, a run directory's config.yaml in today's key names, and the entry points that turn a path, a dict
or a Config into a checked Config; each key and value is checked by values.py, the rules that tie keys
together after it (rules.py)."""

from __future__ import annotations

import copy
import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from .rules import check_relations, resolve_batches
from .schema import Config
from .values import RENAMED, _build
from .wording import _show, _type_word


def load_config(
    path: str | Path | None, overrides: typing.Sequence[str] = (), *, written_by_us: bool = False
) -> Config:
    """Read a YAML file (or only defaults, if path is None), apply overrides. ``written_by_us``: the file is a run
    directory's config.yaml, whose renamed keys (``RENAMED``) are read under their new names."""
    source = str(path) if path is not None else "defaults"
    raw: dict = {}
    if path is not None:
        raw = _read_yaml(Path(path))
        if written_by_us:
            raw = _renamed(raw)
    cfg = with_overrides(raw, overrides, source)
    folder = Path(path).parent if path is not None else None
    if not written_by_us:
        cfg = anchored_paths(cfg, folder)
    return anchored_factory(cfg, folder) if folder is not None else cfg


def load_run_config(run_dir: str | Path, overrides: typing.Sequence[str] = ()) -> Config:
    """The config a run directory recorded (its config.yaml), in today's key names."""
    return load_config(Path(run_dir) / "config.yaml", overrides, written_by_us=True)


def _renamed(raw: dict) -> dict:
    raw = copy.deepcopy(raw)
    for old, new in RENAMED.items():
        *parents, name = old.split(".")
        node = raw
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and name in node:
            node[new.rsplit(".", 1)[-1]] = node.pop(name)
    return raw


def anchored_paths(cfg: Config, folder: Path | None = None) -> Config:
    """data.path, data.dir and model.path, where each names a file or folder that exists from the working
    directory, else from ``folder`` (the config file's), as its absolute path: config.yaml records them so, and a
    resume, evaluate or predict from another working directory reads the same files. A path found in neither
    stays as given (its error names it so)."""

    def anchored(value):
        places = [Path(value)] + ([Path(folder) / value] if folder is not None else []) if value else []
        return next((str(place.absolute()) for place in places if place.exists()), value)

    data = dataclasses.replace(cfg.data, path=anchored(cfg.data.path), dir=anchored(cfg.data.dir))
    return dataclasses.replace(cfg, data=data, model=dataclasses.replace(cfg.model, path=anchored(cfg.model.path)))


def anchored_factory(cfg: Config, folder: Path) -> Config:
    """data.factory's module, when it is a file in the working directory or ``folder`` (the config file's),
    written as that file's absolute path: config.yaml records it, and a resume from the run directory (or
    another working directory) imports the same file. A module found neither place stays a module name
    (an installed package)."""
    if cfg.data.name != "python" or cfg.data.factory is None:
        return cfg
    module, _, function = cfg.data.factory.rpartition(":")
    relative = Path(module) if module.endswith(".py") else Path(*module.split(".")).with_suffix(".py")
    for base in (Path.cwd(), Path(folder)):
        candidate = base / relative
        if candidate.is_file():
            data = dataclasses.replace(cfg.data, factory=f"{candidate.resolve()}:{function}")
            return dataclasses.replace(cfg, data=data)
    return cfg


def with_overrides(base: Config | dict, overrides, source: str = "config") -> Config:
    """A Config (or a dict in the YAML's shape) with overrides applied, checked: ``overrides`` as --set takes
    them ("KEY=VALUE" strings, the value read as YAML) or a dict {KEY: value}."""
    raw = copy.deepcopy(base.to_dict() if isinstance(base, Config) else base)
    items = overrides.items() if isinstance(overrides, dict) else [_parse_override(item) for item in overrides]
    if not isinstance(raw, dict):  # (a file of a YAML list) refused in config_from_dict's words
        return config_from_dict(raw, source)
    for key, value in items:
        _set_dotted(raw, key, value, source)
    return config_from_dict(raw, source, {key for key, _ in items})


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
    cfg = resolve_batches(cfg, "batch_size" in raw, source, set(overridden))
    check_relations(cfg, source, set(overridden))
    return cfg


class _OneOfEachKey(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping, where PyYAML keeps the last silently (an
    optimizer: section written twice would train with the second alone)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue  # not a key a mapping can hold: the constructor's own error
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"{key!r} is given twice in one mapping (the second would replace the first): keep one",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def _load(text: str):
    return yaml.load(text, Loader=_OneOfEachKey)  # a SafeLoader: data only, no tags, no eval


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
        data = _load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "an unknown place"
        problem = err.problem or str(err)
        raise ConfigError(f"{path}: YAML syntax error at {where}: {problem}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: YAML error: {str(err).splitlines()[0]}") from None
    return {} if data is None else data


def override_key(item: str) -> str:
    """The KEY of a ``KEY=VALUE`` override (one line naming the form when it has none)."""
    key, sep, _ = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r} must look like KEY=VALUE, e.g. --set subdivisions=10")
    return key.strip()


def _parse_override(item: str):
    key, text = override_key(item), item.partition("=")[2]
    try:
        value = _load(text) if text.strip() else None
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
