"""Write docs/api.md, the Python API reference, from the signatures and docstrings of the public API
(accum_train.fit, accum_train.run, accum_train.Progress and the errors of accum/errors.py): the page
cannot drift from the code.

    python scripts/api_reference.py            # rewrite docs/api.md
    python scripts/api_reference.py --check    # exit 1 if it is not current (tests/test_api_reference.py runs this)
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"

# The public objects, in the order a reader meets them; tests/test_api_reference.py checks that every name of
# accum_train.__all__ is on the page.
PUBLIC = ("fit", "run", "Progress")

HEAD = """\
# Python API

The public Python API of accum-train: `accum_train.fit` (model.fit with gradient accumulation that keeps the
whole batch's update, for a Keras model you hold; its conditions in [limitations.md](limitations.md)),
`accum_train.run` (what `accum-train run` does), `accum_train.Progress` (the callbacks of a run) and the errors that
bad input raises. [python.md](python.md) is the guide, with examples; the keys a config may
set are in [configuration.md](configuration.md).

This page is generated from the signatures and docstrings by `python scripts/api_reference.py`; a test
(tests/test_api_reference.py) checks that it is current.
"""


def _default(value) -> str:
    if isinstance(value, str) and '"' not in value and "\\" not in value:
        return '"' + value + '"'  # as the (ruff-formatted) source writes it
    if inspect.isroutine(value) or inspect.isclass(value):  # print, not <built-in function print> or an address
        return value.__qualname__
    text = repr(value)
    if re.search(r" at 0x[0-9a-fA-F]+", text):  # <Foo object at 0x7f...>: by its class's name, not an address
        return f"{type(value).__qualname__}()"
    return text


def _annotation(value) -> str:
    if isinstance(value, str):  # `from __future__ import annotations`: the source's own text
        return value
    return inspect.formatannotation(value)


def _parts(sig: inspect.Signature) -> list[str]:
    """Each parameter as the source writes it, with the ``/`` and ``*`` markers where they go."""
    parts, star = [], False
    params = list(sig.parameters.values())
    for i, param in enumerate(params):
        if param.kind is param.KEYWORD_ONLY and not star:
            parts.append("*")
        star = star or param.kind in (param.VAR_POSITIONAL, param.KEYWORD_ONLY)
        text = "*" if param.kind is param.VAR_POSITIONAL else "**" if param.kind is param.VAR_KEYWORD else ""
        text += param.name
        annotated = param.annotation is not param.empty
        if annotated:
            text += f": {_annotation(param.annotation)}"
        if param.default is not param.empty:
            text += (" = " if annotated else "=") + _default(param.default)
        parts.append(text)
        last_positional = param.kind is param.POSITIONAL_ONLY
        if last_positional and (i + 1 == len(params) or params[i + 1].kind is not param.POSITIONAL_ONLY):
            parts.append("/")
    return parts


def signature(obj, name: str | None = None) -> str:
    """``name(params) -> return``, each parameter with its annotation and default as in the source; one parameter
    a line, as the formatter writes it, where one line would be too long."""
    sig = inspect.signature(obj)
    parts = _parts(sig)
    tail = f" -> {_annotation(sig.return_annotation)}" if sig.return_annotation is not sig.empty else ""
    name = name or obj.__name__
    text = f"{name}({', '.join(parts)}){tail}"
    if len(text) <= 110:
        return text
    return f"{name}(\n" + "".join(f"    {part},\n" for part in parts) + f"){tail}"


def docstring(obj) -> str:
    """The docstring as Markdown text: reST's ``code`` is a Markdown code span already; a line indented by 4
    would turn into a code block in the middle of a paragraph, so indented lines are kept as they are, inside a
    block of their own."""
    text = inspect.getdoc(obj)
    if not text:
        return "*(no docstring)*"
    out, block = [], False
    for line in text.splitlines():
        indented = line.startswith("    ") and line.strip()
        if indented and not block:
            out += ["", "```"]
            block = True
        elif block and not indented and line.strip():
            out += ["```", ""]
            block = False
        out.append(line)
    if block:
        out.append("```")
    return "\n".join(out).strip()


def _class_block(cls, name: str) -> str:
    """``class Name(Base):`` with its own public attributes and methods, as a stub."""
    bases = ", ".join(b.__name__ for b in cls.__bases__ if b is not object)
    lines = [f"class {name}({bases}):" if bases else f"class {name}:"]
    for attr, value in vars(cls).items():
        if attr.startswith("_"):
            continue
        if inspect.isfunction(value):
            lines.append(f"    def {signature(value, attr)}: ...")
        elif not callable(value) and not isinstance(value, (classmethod, staticmethod, property)):
            lines.append(f"    {attr} = {_default(value)}")
    if len(lines) == 1:
        lines[0] += " ..."
    return "\n".join(lines)


def public_errors(errors) -> list[type]:
    """The exceptions accum/errors.py defines (UserError and its subclasses first; Interrupted, a KeyboardInterrupt,
    among them), in the order it defines them: each is what a run can end with."""
    found = [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__
    ]
    return sorted(found, key=lambda cls: not issubclass(cls, errors.UserError))  # stable: source order within


def _methods_doc(cls) -> str:
    """Each public method's docstring, one bullet each (a class's own docstring says what the class is)."""
    return "\n".join(
        f"- `{attr}`: " + docstring(value).replace("\n", "\n  ")
        for attr, value in vars(cls).items()
        if not attr.startswith("_") and inspect.isfunction(value) and inspect.getdoc(value)
    )


def _section(title: str, block: str, doc: str, level: int = 2) -> list[str]:
    return [f"{'#' * level} {title}\n", "```python", block, "```\n", doc, ""]


def render() -> str:
    import accum_train  # the installed package (make setup); accum_train.fit imports TensorFlow
    from accum_train import errors

    lines = [HEAD]
    for name in PUBLIC:
        obj = getattr(accum_train, name)
        block = _class_block(obj, name) if inspect.isclass(obj) else f"def {signature(obj)}"
        doc = docstring(obj)
        if inspect.isclass(obj) and _methods_doc(obj):
            doc += "\n\n" + _methods_doc(obj)
        lines += _section(f"accum_train.{name}", block, doc)
    lines.append("## Errors\n")
    lines.append(
        "Each error carries one line and its `exit_code`, the code the CLI exits with after printing that line.\n"
        "Bad input raises `UserError` (or a subclass): the line names what is wrong and how to fix it (code 2).\n"
        "The others end a run that cannot finish: out of memory (3), stopped (1), interrupted by a signal.\n"
    )
    for cls in public_errors(errors):
        where = "accum_train" if cls.__name__ in accum_train.__all__ else "accum_train.errors"
        lines += _section(f"{where}.{cls.__name__}", _class_block(cls, cls.__name__), docstring(cls), level=3)
    return "\n".join(lines).rstrip() + "\n"


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is not current")
    options = parser.parse_args(argv)
    text = render()
    if options.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{_where(PAGE)} is stale: python scripts/api_reference.py rewrites it")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"written: {_where(PAGE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
