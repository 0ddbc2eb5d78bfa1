"""Write the "Defaults" section of docs/doors.md, what each door does with a setting left out, from the module
both doors read their defaults from (accum/defaults.py's ``SETTINGS``, with ``CLI`` and ``FIT`` for the values):
the table cannot drift from what the config and accum_train.fit do.

    python scripts/defaults_table.py            # rewrite the section of docs/doors.md
    python scripts/defaults_table.py --check    # exit 1 if it is not current (tests/test_defaults.py runs this)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "doors.md"
HEADING = "## Defaults\n"

HEAD = """\
## Defaults

What each door does with a setting you leave out. Both doors read their defaults from one module,
`accum/defaults.py`: the CLI's are its `CLI`, the config's (every key in [configuration.md](configuration.md)),
fit's its `FIT`, `accum_train.fit`'s signature, which keeps model.fit's convention where model.fit has one (marked
"as model.fit"). This table is generated from the module by `python scripts/defaults_table.py`; a test checks that it
is current.

| setting | `accum-train run` | `accum_train.fit` |
|---|---|---|
"""


def _yaml(value) -> str:
    """A config value as a YAML file writes it (as docs/configuration.md shows it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _cell(code: str | None, text: str) -> str:
    """``code`` (the key or argument at its default) then what it does, either alone where the other is empty."""
    if code is None:
        return text
    return f"`{code}`: {text}" if text else f"`{code}`"


def _row(setting, cli: dict, fit: dict) -> str:
    run = _cell(None if setting.key is None else f"{setting.key}: {_yaml(cli[setting.key])}", setting.cli)
    if setting.argument is None:
        call = f"no argument: {setting.fit}"
    else:
        call = _cell(f"{setting.argument}={fit[setting.argument]!r}", setting.fit)
    if setting.model_fit:
        call += ", as model.fit"
    return f"| {setting.setting} | {run} | {call} |"


def render_section() -> str:
    from accum_train import defaults  # the installed package (make setup)

    rows = [_row(setting, defaults.CLI, defaults.FIT) for setting in defaults.SETTINGS]
    return HEAD + "\n".join(rows) + "\n"


def render(page: str) -> str:
    """``page`` (docs/doors.md's text) with its Defaults section, up to the next heading of its level, rewritten."""
    if HEADING not in page:
        raise SystemExit(f"{PAGE.relative_to(ROOT)} has no line {HEADING.strip()!r} to write the table under")
    before, after = page.split(HEADING, 1)
    rest = after.split("\n## ", 1)
    tail = "\n## " + rest[1] if len(rest) > 1 else ""
    return before + render_section() + ("\n" + tail.lstrip("\n") if tail else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/doors.md's Defaults are not current")
    options = parser.parse_args(argv)
    page = PAGE.read_text()
    text = render(page)
    if options.check:
        if page != text:
            print(f"{PAGE.relative_to(ROOT)}'s Defaults are stale: python scripts/defaults_table.py rewrites them")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"written: {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
