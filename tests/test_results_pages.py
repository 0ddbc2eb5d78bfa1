"""docs/results/ holds measured tables, not a story, and a guide links only to them.

A results page answers "what was measured, where, at which commit, with which command" (STYLE.md 17): under its
title one short line, then headings, each over its tables. Beside a table stands at most one short line: the
caption of a table typed by hand (machine, commit, command), or a note on how to read it. A generated table
(between the markers of scripts/results_tables.py) carries its own caption. How a figure was reached belongs in
CHANGELOG.md and the git log, so a page has no history, no lab words ("stop 72", "session") and no link to a page
that is gone. The guide (README.md, docs/*.md) links into docs/results/ only at a page of tables or at a heading
over a table.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
GENERATED = re.compile(r"<!-- table from \S+: [\w-]+ -->\n.*?<!-- end of table -->", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`[^`]*`")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
INTRO_WORDS = 25  # the line under the title
NOTE_WORDS = 40  # a line beside a table, code spans (commands) not counted
LAB_WORDS = re.compile(r"\bstop \d+|\bsessions?\b|\bbranch\b|\bhistory\b|\bprototypes?\b|\bearlier\b|\bscratch\b", re.I)


def results_pages() -> list[Path]:
    return sorted(RESULTS.rglob("*.md"))


def guide_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(text: str) -> list[dict]:
    """The page cut at its headings: each with its heading, tables (a generated block counts as one) and the
    paragraphs of prose between them."""
    parts, current, paragraph = [], {"heading": None, "level": 0, "tables": 0, "paragraphs": []}, []

    def end_paragraph():
        if paragraph:
            current["paragraphs"].append(" ".join(paragraph))
            paragraph.clear()

    in_table = False
    for line in GENERATED.sub("| generated table |", text).splitlines():
        heading = re.match(r"(#+) (.*)", line)
        if heading:
            end_paragraph()
            parts.append(current)
            current = {"heading": heading[2], "level": len(heading[1]), "tables": 0, "paragraphs": []}
            in_table = False
        elif line.startswith("|"):
            end_paragraph()
            current["tables"] += not in_table
            in_table = True
        elif not line.strip():
            end_paragraph()
            in_table = False
        else:
            paragraph.append(line.strip())
            in_table = False
    end_paragraph()
    return [*parts, current][1:]  # before the title: nothing


def words(paragraph: str) -> int:
    return len(CODE.sub("", paragraph).split())


def faults(text: str) -> list[str]:
    """What makes ``text`` more than a page of tables: each fault one line."""
    found = []
    title, *rest = sections(text)
    if title["level"] != 1 or title["tables"] or len(title["paragraphs"]) > 1:
        found.append("the title: one line under it, then headings")
    elif title["paragraphs"] and words(title["paragraphs"][0]) > INTRO_WORDS:
        found.append(f"the line under the title: over {INTRO_WORDS} words")
    for section in rest:
        name = section["heading"]
        if not section["tables"]:
            found.append(f"{name}: no table")
        if len(section["paragraphs"]) > section["tables"]:
            found.append(f"{name}: {len(section['paragraphs'])} paragraphs for {section['tables']} table(s)")
        found += [f"{name}: a line of {words(p)} words" for p in section["paragraphs"] if words(p) > NOTE_WORDS]
    for table in re.finditer(r"((?:[^\n|#][^\n]*\n)*)\n((?:\|[^\n]*\n)+)", GENERATED.sub("", text) + "\n"):
        caption, rows = table.groups()
        if "Measured on" not in caption or not COMMIT.search(caption + rows) or not CODE.search(caption):
            found.append(f"a table typed by hand has no caption naming machine, commit and command: {rows[:60]!r}")
    found += [f"lab words: {m[0]!r}" for m in LAB_WORDS.finditer(GENERATED.sub("", text))]
    for target in LINK.findall(text):
        if "history.md" in target or "prototypes/" in target:
            found.append(f"a link to a page of history: {target}")
    return found


@pytest.mark.parametrize("page", results_pages(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_results_page_is_headings_and_tables(page):
    assert faults(page.read_text()) == []


def test_a_page_that_tells_a_story_is_caught():
    """The rules hold against the prose they are for (each a case taken from a page as it once was)."""
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    caption = "Measured on 2 CPUs (AMD EPYC), commit 1ee0622: `make test`\n\n"
    good = f"# Measured: X\n\nThe measured tables of x.md.\n\n## A\n\n{caption}{table}"
    assert faults(good) == []
    cases = {
        "a second paragraph": good + "\nThe budget is 4 minutes; the suite is over it.\n",
        "a heading with no table": good + "\n## What changed\n\nThe held-batch change is not the difference.\n",
        "a long note": good.replace("Measured on", "word " * 41 + "Measured on"),
        "no caption": good.replace(caption, ""),
        "lab words": good.replace("2 CPUs", "2 CPUs, the CI run of stop 72,"),
        "a link to history": good.replace("x.md", "[history.md](history.md#since-020)"),
    }
    for case, text in cases.items():
        assert faults(text) != [], case


def headings_over_tables(page: Path) -> set[str]:
    return {slug(s["heading"]) for s in sections(page.read_text())[1:] if s["tables"]}


def test_every_guide_link_into_the_results_is_a_table():
    """A link from README.md or docs/*.md into docs/results/ names a page there, and its anchor, if any, a heading
    over a table."""
    wrong = []
    for page in guide_pages():
        for target in LINK.findall(page.read_text()):
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve()
            if target.startswith(("http://", "https://", "#")) or RESULTS not in [resolved, *resolved.parents]:
                continue
            name = f"{page.relative_to(ROOT)}: {target}"
            if resolved.suffix != ".md" or not resolved.is_file():
                wrong.append(f"{name} (not a page of tables)")
            elif anchor and anchor not in headings_over_tables(resolved):
                wrong.append(f"{name} (no heading over a table has this anchor)")
    assert wrong == []


def test_the_anchor_is_github_s():
    assert slug("The default suite's time") == "the-default-suites-time"
    assert slug("accum_train.fit beside Keras' own accumulation on a GPT-2 causal LM") == (
        "accum_trainfit-beside-keras-own-accumulation-on-a-gpt-2-causal-lm"
    )
