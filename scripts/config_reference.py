"""Write docs/configuration.md, the config key reference, from the schema's own defaults, ranges, choices and
help texts (accum/config/schema.py and sections.py): the page cannot drift from what the parser accepts.

    python scripts/config_reference.py            # rewrite docs/configuration.md
    python scripts/config_reference.py --check    # exit 1 if it is not current (tests/test_readme.py runs this)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"

HEAD = """\
# Configuration

A YAML file lists only what differs from these defaults; `--set KEY=VALUE` overrides any key (dotted for
nested ones: `--set optimizer.learning_rate=0.002`), and `accum_train.run(config, overrides)` takes the same.
Every key and value is checked once, before anything runs: an unknown key, a value out of range or two keys
that contradict each other end in one line naming the key and the fix (exit code 2). The run's own
`config.yaml` is the config as resolved (defaults filled in, `decay_steps` fixed), and reads back as it ran.

This page is generated from the schema (accum/config/schema.py) by `python scripts/config_reference.py`;
a test checks that it is current.
"""

DATA_LOOKUP = """\
Where Fashion-MNIST is read from (`datasets/fashion_mnist.py`): the folder `data.dir` names, else the one
`$ACCUM_TRAIN_DATA` names; either must hold the four files, or the run stops in one line saying how to get them.
With neither set: `/usr/share/datasets/fashion-mnist` (Debian's `dataset-fashion-mnist`), then the user cache
(`$XDG_CACHE_HOME/accum-train/fashion-mnist`, else `~/.cache/accum-train/fashion-mnist`); if neither holds the
files, the four are downloaded from the Fashion-MNIST mirror into the user cache, and a failed download stops the
run in one line. The tests name a local copy (Debian's, or `$ACCUM_TRAIN_DATA`), so they never download. Every
file is checked against the SHA-256 of its decompressed content before training starts.
"""


def _load_schema():
    from accum_train import config  # the installed package (make setup): schema.py's Config, sections.py's sections

    return config


def _default(field) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _shown(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _allowed(meta: dict) -> str:
    parts = []
    choices = meta.get("choices")
    if isinstance(choices, tuple):
        parts.append(" \\| ".join(choices))
    elif choices in ("auto", "all"):
        parts.append(f"or {choices}")
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None:
        parts.append(f"{'>' if meta.get('exclusive_min') else '>='} {_shown(lo)}")
    if hi is not None:
        parts.append(f"<= {_shown(hi)}")
    return ", ".join(parts)


def _rows(cls, prefix: str, out: list, sections: list) -> None:
    for field in dataclasses.fields(cls):
        hints = typing.get_type_hints(cls)
        kind = hints[field.name]
        key = prefix + field.name
        if dataclasses.is_dataclass(kind) and field.default_factory is not dataclasses.MISSING:
            sections.append((key, kind))
            continue
        help_text = field.metadata.get("help", "").replace("|", "\\|")
        out.append(f"| `{key}` | `{_shown(_default(field))}` | {_allowed(field.metadata)} | {help_text} |")


def render() -> str:
    schema = _load_schema()
    lines = [HEAD]
    pending = [("", schema.Config)]
    while pending:
        prefix, cls = pending.pop(0)
        title = prefix or "top level"
        lines.append(f"## {title}\n")
        lines.append("| key | default | allowed | what it does |")
        lines.append("|---|---|---|---|")
        nested: list = []
        _rows(cls, prefix + "." if prefix else "", lines, nested)
        lines.append("")
        pending = nested + pending
        if prefix == "data":
            lines.append(DATA_LOOKUP)
    for cls, where in ((schema.BatchChange, "batch_schedule[i]"), (schema.BatchRule, "batch_schedule (a rule)")):
        lines.append(f"## {where}\n")
        lines.append("| key | default | allowed | what it does |")
        lines.append("|---|---|---|---|")
        _rows(cls, "", lines, [])
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is not current")
    options = parser.parse_args(argv)
    text = render()
    if options.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: python scripts/config_reference.py rewrites it")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"written: {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
