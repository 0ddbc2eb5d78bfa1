"""docs/limitations.md against the code: every refusal the code raises (errors.Refused, found in the source) has
its row in the page's table, and every row names a refusal the code raises. The README's first screen links the
page."""

import ast
import re
from pathlib import Path

import pytest
from accum_train.errors import Refused, UserError

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "limitations.md"


# the helpers that make a Refused of their first argument, the key (backends/jax/objective.py's ``refused``)
MAKERS = ("Refused", "refused")
# words that only a refusal says: a raise that says one of them must be a Refused, with its row below
REFUSING = (
    "is not on Keras' JAX backend yet",
    "which only TensorFlow runs",
    "does not run:",
    "is not supported",
    "are not supported",
    "works on TensorFlow's engine only",
    "has no engine for",
    "cannot be pooled",
)


def sources():
    for folder in ("accum", "cli", "datasets"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def raised_keys() -> dict:
    """{key: [file:line, ...]} of every refusal made under accum/, cli/ and datasets/: ``Refused("key", ...)`` or
    ``refused("key", ...)``, raised where it is made or by a caller."""
    found: dict = {}
    for path, tree in sources():
        # the makers' own bodies pass their key on: the calls of the makers name it
        inside = {id(n) for d in ast.walk(tree) if getattr(d, "name", None) in MAKERS for n in ast.walk(d)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) in MAKERS) or id(node) in inside:
                continue
            first = node.args[0] if node.args else None
            assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
                f"{path}:{node.lineno}: a refusal's key must be a string literal, for this test to read"
            )
            found.setdefault(first.value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def refusals_raised_otherwise() -> list:
    """file:line of every raise whose message says a refusal's words (REFUSING) but is no refusal (MAKERS)."""
    wrong = []
    for path, tree in sources():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            if getattr(node.exc.func, "id", None) in MAKERS:
                continue
            said = " ".join(
                c.value for c in ast.walk(node.exc) if isinstance(c, ast.Constant) and isinstance(c.value, str)
            )
            if any(words in said for words in REFUSING):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return wrong


def test_every_refusal_is_a_refused_with_a_key():
    """Issue 77: a refusal raised as a bare UserError (or NotImplementedError) escaped the list below."""
    assert refusals_raised_otherwise() == []


def documented_keys() -> list:
    """The keys of the refusal table's rows, in order."""
    text = PAGE.read_text()
    table = text[text.index("## What is refused") :]
    return re.findall(r"^\| `([a-z0-9-]+)` \|", table, flags=re.M)


def test_the_page_lists_exactly_the_refusals_the_code_raises():
    raised, documented = raised_keys(), documented_keys()
    assert len(raised) >= 30  # the search found the refusals (an empty match would pass the comparison)
    assert len(documented) == len(set(documented)), "a key has two rows"
    missing = sorted(set(raised) - set(documented))
    assert not missing, f"refused in the code, not in docs/limitations.md: {[(k, raised[k]) for k in missing]}"
    stale = sorted(set(documented) - set(raised))
    assert not stale, f"in docs/limitations.md, raised nowhere: {stale}"


def test_a_refusal_is_a_user_error_with_its_key_and_one_line():
    err = Refused("trim-replicas", "accum_train.fit: trim_padding runs on one replica")
    assert isinstance(err, UserError) and err.exit_code == 2
    assert (err.key, str(err)) == ("trim-replicas", "accum_train.fit: trim_padding runs on one replica")


@pytest.mark.parametrize("page", ["README.md", "docs/fit.md", "docs/python.md"])
def test_the_pages_that_list_limits_link_the_one_list(page):
    assert "limitations.md" in (ROOT / page).read_text()


def support_rows() -> list:
    """(cells, tests named) of every row of docs/support.md's tables."""
    rows = []
    for line in (ROOT / "docs" / "support.md").read_text().splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.append((cells, re.findall(r"`(tests/[\w/]+\.py|\.ci/run)`", cells[-1])))
    return rows


def test_every_tested_cell_of_the_support_matrix_names_tests_that_exist():
    rows = [(cells, tests) for cells, tests in support_rows() if cells[-1] != "tested by"]
    assert len(rows) >= 25
    for cells, tests in rows:
        says_tested = any(re.match(r"tested\b", c) for c in cells[1:-1])
        assert says_tested == bool(tests), f"docs/support.md: a row that says tested names its tests, no other: {cells}"
        for test in tests:
            assert (ROOT / test).is_file(), f"docs/support.md names {test}, which does not exist"
    # GPU is untested in CI: the page must not claim otherwise
    gpu = [cells for cells, _ in rows if "GPU" in cells[0]]
    assert gpu and all("untested" in " ".join(cells) for cells in gpu)
