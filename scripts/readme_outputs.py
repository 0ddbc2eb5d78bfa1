"""Keep the command output in the README and the docs/ pages true: regenerate it from the tool, or check it.

A block of a page that shows what a command prints stands under a marker
naming the command:

    <!-- output of: accum-train plan configs/fmnist.yaml -->
    ```
    ...what it prints...
    ```

``<!-- output after the example above: COMMAND -->`` runs COMMAND where the
own-data example (the first sh block of docs/data-and-models.md) has
just run, in a scratch folder holding a copy of configs/ and scripts/.
Such a block is predict's table after a training run, whose rounding differs
from one CPU to another: the check wants the same inputs and predictions and
every class probability within 0.02 (near-zero classes may swap places in
the top list). Other blocks must match to the character.

    python scripts/readme_outputs.py            # rewrite the blocks from what the commands print
    python scripts/readme_outputs.py --check    # exit 1, naming the block, where one differs

tests/test_readme.py runs the same check (the example's block in the slow suite).
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(
    r"^<!-- output (?P<where>of|after the example above): (?P<command>.+?) -->\n```\n(?P<body>.*?)```\n", re.M | re.S
)
EXAMPLE_HEADING = "# Your data and your model"
TOLERANCE = 0.02


@dataclass(frozen=True)
class Block:
    command: str
    after_example: bool
    body: str
    start: int  # offsets of the body in the README text
    end: int


def pages() -> list:
    """The pages whose blocks are checked: the README, then every docs/ page."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def all_text() -> str:
    """Every page, one after another (what the tests read the examples from)."""
    return "\n".join(page.read_text() for page in pages())


def blocks(text: str) -> list:
    return [
        Block(m["command"], m["where"] != "of", m["body"], m.start("body"), m.end("body"))
        for m in MARKER.finditer(text)
    ]


def example_commands(text: str) -> list:
    """The commands of the own-data example, in order (the venv's activation and comments left out)."""
    section = text[text.index(EXAMPLE_HEADING) :]
    body = section[section.index("```sh\n") + len("```sh\n") :]
    body = body[: body.index("```")]
    commands = [line.split("#", 1)[0].strip() for line in body.splitlines()]
    return [command for command in commands if command and not command.startswith(". ")]


def argv(command: str) -> list:
    """A README command as this interpreter runs it (the venv's accum-train and python)."""
    words = shlex.split(command)
    if words[0] == "accum-train":
        return [sys.executable, "-m", "accum_train.cli.main", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    raise ValueError(f"not a command of this project: {command}")


def run(command: str, cwd: Path) -> str:
    done = subprocess.run(argv(command), cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{command} (in {cwd}) failed with exit code {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def run_example(text: str, folder: Path) -> None:
    """The own-data example as the README gives it, in ``folder`` (with configs/ and scripts/ copied in)."""
    for name in ("configs", "scripts"):
        shutil.copytree(ROOT / name, folder / name)
    for command in example_commands(text):
        run(command, folder)


def same(shown: str, printed: str, after_example: bool) -> bool:
    """Equal text; for a block after the example (a predict table), equal inputs and predictions and every
    class probability within TOLERANCE (a class listed on one side only must be under it there)."""
    if not after_example:
        return shown == printed
    rows, again = shown.splitlines(), printed.splitlines()
    if len(rows) != len(again) or rows[0].split() != again[0].split():
        return False
    return all(_same_row(_cells(a), _cells(b)) for a, b in zip(rows[1:], again[1:]))


def _cells(row: str):
    """(input, prediction, its probability, {class: probability} of the top column) of a predict row."""
    name, prediction, probability, top = row.split(maxsplit=3)
    listed = dict(entry.rsplit(" ", 1) for entry in top.split(", "))
    return name, prediction, float(probability), {k: float(v) for k, v in listed.items()}


def _same_row(a, b) -> bool:
    if a[:2] != b[:2] or abs(a[2] - b[2]) > TOLERANCE:
        return False
    classes = set(a[3]) | set(b[3])
    return all(abs(a[3].get(c, 0.0) - b[3].get(c, 0.0)) <= TOLERANCE for c in classes)


def outputs(text: str, which: list, folder: Path | None = None) -> dict:
    """What the commands of ``which`` (blocks) print now; the example runs once, in ``folder``, if one needs it."""
    printed = {}
    for block in which:
        if block.after_example and folder is None:
            raise ValueError(f"{block.command} runs after the own-data example: give a folder for it")
        if block.after_example and not (folder / "runs").exists():
            run_example(text, folder)
        printed[block] = run(block.command, folder if block.after_example else ROOT)
    return printed


def main(args=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Only compare; exit 1 where a block differs.")
    options = parser.parse_args(args)
    everything, rewritten, seen, stale_any = all_text(), 0, 0, False
    with tempfile.TemporaryDirectory(prefix="readme-example-") as scratch:
        for page in pages():
            text = page.read_text()
            found = blocks(text)
            if not found:
                continue
            # the own-data example may stand on another page than the block that runs after it
            printed = outputs(everything, found, Path(scratch))
            stale = [block for block, out in printed.items() if not same(block.body, out, block.after_example)]
            for block in stale:
                print(f"stale: {page.relative_to(ROOT)}'s output of {block.command!r}", file=sys.stderr)
            seen, stale_any = seen + len(printed), stale_any or bool(stale)
            if options.check or not stale:
                continue
            for block in sorted(stale, key=lambda b: -b.start):  # from the end, so earlier offsets stay valid
                text = text[: block.start] + printed[block] + text[block.end :]
            page.write_text(text)
            rewritten += len(stale)
    if options.check:
        return 1 if stale_any else 0
    print(f"{rewritten} of {seen} blocks rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
