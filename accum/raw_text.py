"""Raw examples for the readers of a KerasHub run (``accum-train predict`` and ``evaluate --data``).

A task trained by accum_train.fit on raw texts keeps its preprocessor in its model file; these files are read
through it, as ``task.predict`` and ``task.evaluate`` read raw data: a .txt file holds one text a line, a .jsonl
file one ``{"x": TEXT, "y": LABEL}`` a line (``y`` where the task's preprocessor takes labels, a classifier's; a
causal LM makes its own targets of the text, and predict reads ``x`` alone). Blank lines are skipped; a row is
named FILE:LINE. A bad file is one line naming the file, the line and how to write it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .errors import DataError

SUFFIXES = (".txt", ".jsonl")
RAW_HOW = 'a .txt file of one text a line, or a .jsonl file of one {"x": TEXT, "y": LABEL} a line'


def is_raw(path) -> bool:
    return Path(path).suffix.lower() in SUFFIXES


def read_examples(path: Path) -> list[tuple[str, str, object]]:
    """(row name FILE:LINE, text, label or None) of each example of the .txt or .jsonl file ``path``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} is not a file: pass {RAW_HOW}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot be read as UTF-8 text ({err}): pass {RAW_HOW}") from None
    examples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        text, label = (line, None) if path.suffix.lower() == ".txt" else _json_example(path, number, line)
        examples.append((f"{path}:{number}", text, label))
    if not examples:
        raise DataError(f"{path} holds no examples (every line is blank): pass {RAW_HOW}")
    return examples


def _json_example(path: Path, number: int, line: str) -> tuple[str, object]:
    where = f"{path} line {number}"
    try:
        example = json.loads(line)
    except ValueError as err:
        raise DataError(f'{where} is not JSON ({err}): write one {{"x": TEXT, "y": LABEL}} a line') from None
    if not isinstance(example, dict) or not isinstance(example.get("x"), str):
        raise DataError(f'{where} has no text "x": write one {{"x": TEXT, "y": LABEL}} a line')
    other = sorted(set(example) - {"x", "y"})
    if other:
        raise DataError(f'{where} has keys {other} besides "x" and "y": write one {{"x": TEXT, "y": LABEL}} a line')
    return example["x"], example.get("y")


def _preprocessor(preprocessor, run_dir, files: Sequence[Path]):
    if preprocessor is None:
        names = ", ".join(str(p) for p in files)
        raise DataError(
            f"{names}: the model of {run_dir} has no preprocessor to read raw text with (a task built with "
            f"preprocessor=None, or no KerasHub task): pass .npz files of the arrays it takes"
        )
    return preprocessor


def _arrays(values):
    if values is None:
        return None
    if isinstance(values, dict):
        return {name: np.asarray(value) for name, value in values.items()}
    return np.asarray(values)


def read_inputs(paths: Sequence[Path], preprocessor, run_dir) -> tuple[list[str], dict]:
    """(one name per row, the model's inputs) of raw files, through the task's ``preprocessor``; labels unread."""
    import keras

    preprocessor = _preprocessor(preprocessor, run_dir, paths)
    examples = [example for path in paths for example in read_examples(path)]
    x, _, _ = keras.utils.unpack_x_y_sample_weight(preprocessor([text for _, text, _ in examples]))
    return [name for name, _, _ in examples], _arrays(x)


def read_data(path: Path, preprocessor, run_dir) -> tuple[int, dict, object, object]:
    """(examples, x, y, sample_weight) of the raw file ``path`` as the task's ``preprocessor`` makes them: its
    labels where the lines have them, or the targets it makes of the texts (a causal LM's next tokens)."""
    import keras

    preprocessor = _preprocessor(preprocessor, run_dir, [path])
    examples = read_examples(path)
    labelled = [label is not None for _, _, label in examples]
    if any(labelled) and not all(labelled):
        line = examples[labelled.index(False)][0]
        raise DataError(f'{line} has no "y" where other lines have one: give every example its label, or none')
    texts = [text for _, text, _ in examples]
    made = (
        preprocessor(texts, np.asarray([label for _, _, label in examples])) if all(labelled) else preprocessor(texts)
    )
    x, y, weights = keras.utils.unpack_x_y_sample_weight(made)
    if y is None:
        raise DataError(
            f"{path} holds texts without labels, and the task's preprocessor makes no targets of them: write a "
            f'.jsonl file of one {{"x": TEXT, "y": LABEL}} a line'
        )
    return len(examples), _arrays(x), _arrays(y), _arrays(weights)
