"""How shapes, sizes and errors read in the tool's messages and tables: one way each.

Nothing here imports TensorFlow: the ``--workers`` supervisor and the data
loaders use it before (or without) a runtime.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


def shape_text(shape: Sequence) -> str:
    """(28, 28, 1) -> '28x28x1'; a dimension a model leaves open (None) reads '?'."""
    return "x".join("?" if d is None else str(int(d)) for d in shape)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 epoch', '3 epochs'; '1 micro-batch', '2 micro-batches' (``plural`` given)."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def size_text(n_bytes: int | None, missing: str = "n/a") -> str:
    """Bytes in the largest unit that keeps a whole part, to 4 figures: '36 bytes', '1.417 MiB'; ``missing`` where
    nothing was measured."""
    if n_bytes is None:
        return missing
    units = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("bytes", 1))
    name, unit = next((name, unit) for name, unit in units if n_bytes >= unit or unit == 1)
    return f"{n_bytes / unit:.4g} {name}"


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (TensorFlow's run to pages), or its type's name."""
    text = (getattr(err, "message", None) or str(err)).strip()  # a message may open with a line break
    return (text.splitlines() or [type(err).__name__])[0]


def traced_error_line(err: BaseException) -> str:
    """What Keras or TensorFlow said of a traced call, in one line: TensorFlow's tracing context ("in user
    code:", "File ...") and its graph node names left out."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    said = [
        line
        for line in lines
        if not line.startswith(("in user code", "File ", "Traceback", "Detected at node", "[[", "Graph execution"))
    ]
    # a traced call's error and a graph's at run time ("Graph execution error:") say what went wrong last
    traced = lines and lines[0].startswith(("in user code", "Graph execution error"))
    message = said[-1] if traced and said else (lines or [""])[0]
    message = re.sub(r"^[A-Za-z]+Error: ", "", message)  # the tracing context's "ValueError: ..." form
    message = re.sub(r"\s*\[\[\{\{node [^]]*\]\]|\s*\[Op:[^]]*\]", "", message)  # a graph's node and op names
    return re.sub(r" for '\{\{node [^}]*\}\}[^']*'", "", message)
