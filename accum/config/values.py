"""Each key and value of a config checked against the schema's types, ranges and choices, and built into its
frozen dataclasses: an unknown key is named with the key meant (a close spelling, another tool's name for it,
its new name), a wrong value with what is allowed. parse.py reads the YAML and the overrides first; the rules
that tie keys together come after (rules.py)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Union

from ..errors import ConfigError
from .rules import DATA_KEYS_FOR
from .sections import BatchChange, BatchRule, DataConfig
from .wording import _blamer, _came_from_set, _show, parse_size

# Keys renamed since a release (old dotted name: new). A run directory's config.yaml that an earlier release wrote
# is read under the new names (parse.py's ``load_run_config``); a config of yours with an old name is refused,
# naming the new.
RENAMED = {"max_bad_updates": "max_bad_steps", "loss_scale.growth_updates": "loss_scale.growth_steps"}

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
    if prefix + key in RENAMED:
        return f"renamed {RENAMED[prefix + key]!r}"
    if ALIASES.get(key) in valid:
        return f"did you mean {prefix + ALIASES[key]!r}?"
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"did you mean {prefix + close[0]!r}?"
    return "valid keys: " + ", ".join(valid)


# What data.name=python reads itself, every other key under data: being the factory's: the keys no other loader owns
# (rules.DATA_KEYS_FOR), and trim_padding, which rules.py refuses for it in its own words.
PYTHON_DATA_KEYS = (
    *(f.name for f in dataclasses.fields(DataConfig) if "python" in DATA_KEYS_FOR.get(f.name, ("python",))),
    "trim_padding",
)


def _build(cls, raw: dict, prefix: str, source: str, overridden: set):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if cls is DataConfig and raw.get("name") == "python":  # a factory's other keys are its keyword arguments
        # path, dir, ... too: other loaders' keys, which the factory may well want (config.yaml lists them as
        # null, and options with their values)
        extra = {key: value for key, value in raw.items() if key not in PYTHON_DATA_KEYS and value is not None}
        if extra or set(raw) - set(PYTHON_DATA_KEYS):
            raw = {key: value for key, value in raw.items() if key in PYTHON_DATA_KEYS}
            raw["options"] = {**(raw.get("options") or {}), **extra}
    hints = typing.get_type_hints(cls)
    for key in raw:
        if key not in fields:
            dotted = prefix + str(key)
            where = _blamer(source, overridden)(dotted)
            raise ConfigError(f"{where}: unknown key {dotted!r} ({_hint(str(key), list(fields), prefix)})")
    values = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        dotted = prefix + name
        where = "--set" if _came_from_set(dotted, overridden) else source
        values[name] = _check_value(hints[name], f.metadata, raw[name], dotted, where, overridden)
    return cls(**values)


def _check_value(tp, meta, value, key, where, overridden):
    if meta.get("choices") == "schedule":  # batch_schedule: a list of changes, or a rule
        return _check_schedule(value, key, where, overridden)
    optional = False
    if typing.get_origin(tp) in (Union, types.UnionType):  # Optional[int] or int | None
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = type(None) in typing.get_args(tp)
        if meta.get("choices") in ("auto", "all"):  # an integer, or the word
            word = meta["choices"]
            if value == word:
                return value
            if isinstance(value, str):
                raise ConfigError(f"{where}: {key}={_show(value)} must be an integer{_range_text(meta)} or {word}")
            meta = {**meta, "choices": None}
        tp = args[0]
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: {key} is empty: {_expected(tp, meta)}")
    if meta.get("choices") in ("loss", "metrics"):
        return _check_objective(meta["choices"], value, key, where)
    if meta.get("choices") == "options":
        if not isinstance(value, dict) or not all(isinstance(name, str) for name in value):
            raise ConfigError(f"{where}: {key}={_show(value)} must be a mapping of keyword arguments")
        return dict(value)
    if typing.get_origin(tp) is tuple and typing.get_args(tp)[-1] is Ellipsis:  # a list of strings, any length
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{where}: {key}={_show(value)} must be a list of strings, e.g. ['bias', 'norm']")
        return tuple(value)
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


def _check_schedule(value, key: str, where: str, overridden):
    """batch_schedule: [] or null (none), a list of {epoch or step, batch_size}, or a mapping {rule: ...}."""
    if value is None:
        return ()
    one_change = isinstance(value, dict) and "rule" not in value and {"epoch", "step", "batch_size"} & set(value)
    if isinstance(value, dict) and not one_change:
        return _build(BatchRule, value, key + ".", where, overridden)
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ConfigError(
            f"{where}: {key}={_show(value)} must be a list of changes, e.g. [{{epoch: 6, batch_size: 2000}}], "
            f"or a rule, e.g. {{rule: noise_scale, max_batch_size: 16000}}"
        )
    return tuple(_build(BatchChange, item, f"{key}[{i}].", where, overridden) for i, item in enumerate(value))


def _check_objective(kind: str, value, key: str, where: str):
    """``loss``: a name, or a mapping {output name: name}; ``metrics``: a list of names, or a mapping
    {output name: [names]}. Whether Keras knows each name is checked when the model is built."""
    one = "a name such as mse" if kind == "loss" else "a list of names such as [mae]"
    example = "{price: mse, kind: sparse_categorical_crossentropy}" if kind == "loss" else "{price: [mae]}"

    def entry(item, at):
        if kind == "loss":
            if not isinstance(item, str) or not item.strip():
                raise ConfigError(f"{where}: {at}={_show(item)} must be {one} (or package.module:function)")
            return item
        if not isinstance(item, list) or not all(isinstance(name, str) and name.strip() for name in item):
            raise ConfigError(f"{where}: {at}={_show(item)} must be {one}")
        return list(item)

    if isinstance(value, dict):
        if not value:
            raise ConfigError(f"{where}: {key}={{}} is empty: give {one}, or one per output, e.g. {example}")
        # lists, not tuples, inside a mapping: config.yaml is written with YAML's safe dumper
        return {str(name): entry(item, f"{key}.{name}") for name, item in value.items()}
    if kind == "loss" and isinstance(value, list):
        raise ConfigError(f"{where}: {key}={_show(value)} must be {one}, or a mapping per output name, e.g. {example}")
    return entry(value, key) if kind == "loss" else tuple(entry(value, key))


def _check_range(value, meta, key, where):
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and (not value > lo if meta.get("exclusive_min") else value < lo):
        raise ConfigError(f"{where}: {key}={_show(value)} must be{_range_text(meta)}")
    if hi is not None and value > hi:
        raise ConfigError(f"{where}: {key}={_show(value)} must be <= {hi}")


def _range_text(meta) -> str:
    lo, hi = meta.get("min"), meta.get("max")
    parts = [] if lo is None else [f"{'>' if meta.get('exclusive_min') else '>='} {lo}"]
    parts += [] if hi is None else [f"<= {hi}"]
    return " " + " and ".join(parts) if parts else ""


def _expected(tp, meta) -> str:
    word = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, "a mapping")
    if meta.get("choices"):
        return f"set it to one of {', '.join(meta['choices'])}"
    return f"set it to {word}{_range_text(meta)}"
