"""How config errors name things: where a value came from (the file or --set), a value as YAML shows it,
and sizes such as 2GiB."""

from __future__ import annotations

import re

import yaml

from ..errors import ConfigError


def _blamer(source: str, overridden: set):
    """``where(*keys)``: "--set" if any of ``keys``, or a key under one, came from --set, else ``source`` (what an
    error names)."""

    def where(*keys) -> str:
        return "--set" if any(_came_from_set(k, overridden, under=True) for k in keys) else source

    return where


def _came_from_set(dotted: str, overridden: set, under: bool = False) -> bool:
    """Whether --set gave ``dotted`` (or a key above it); ``under``: or a key under it (--set foo.bar=1 made foo)."""
    return any(dotted == k or dotted.startswith(k + ".") or (under and k.startswith(dotted + ".")) for k in overridden)


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
