"""The code's layers (docs/design.md): who may import whom, checked on the source's import statements.

- the CLI (cli/) sits on top: nothing under accum/ or datasets/ imports it;
- the dataset loaders (datasets/) import only the leaves of the core: config, errors, text, imports, files;
- no two modules import each other, directly or around a circle, at module level;
- no module of accum/, cli/ or datasets/ is over 500 lines.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"accum": "", "cli": "cli", "datasets": "datasets"}  # each folder's place under accum_train
LEAVES = {"config", "errors", "text", "imports", "files"}
MAX_LINES = 500


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT)
    parts = [FOLDERS[relative.parts[0]]] if FOLDERS[relative.parts[0]] else []
    parts += list(relative.with_suffix("").parts[1:])
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def sources() -> dict:
    return {module_name(path): path for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))}


def imports(path: Path, name: str, modules: dict) -> set:
    """The package's modules that ``path`` (module ``name``) imports anywhere, inside functions too."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = package[: len(package) - (node.level - 1)] + ([node.module] if node.module else [])
        for alias in node.names:
            target = ".".join([*base, alias.name])
            found.add(target if target in modules else ".".join(base))
    return {target for target in found if target in modules and target != name}


def lazy_free_imports(path: Path, name: str, modules: dict) -> set:
    """Module-level imports only: those inside a function run when it is called, after every module loaded."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] + ([node.module] if node.module else [])
            for alias in node.names:
                target = ".".join([*base, alias.name])
                found.add(target if target in modules else ".".join(base))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {target for target in found if target in modules and target != name}


def test_nothing_below_the_cli_imports_it():
    modules = sources()
    offenders = {
        name: sorted(t for t in imports(path, name, modules) if t == "cli" or t.startswith("cli."))
        for name, path in modules.items()
        if not (name == "cli" or name.startswith("cli."))
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_core_starts_no_process_of_the_cli():
    """Workers, compare's sides and the core's other children run its own entry points (``accum_train.worker``,
    ``accum_train.bench``, ``accum_train.datasets``), never ``accum_train.cli``: a string naming it is enough to
    find one (a module name in a string constant, as ``-m`` takes it)."""
    naming = sorted(
        name
        for name, path in sources().items()
        if not name.startswith("cli")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("accum_train.cli")
    )
    assert naming == []


def test_the_dataset_loaders_import_only_the_core_s_leaves():
    modules = sources()
    allowed = LEAVES | {name for name in modules if name.startswith("datasets")}
    wrong = {
        name: sorted(found - allowed)
        for name, path in modules.items()
        if name.startswith("datasets")
        for found in [imports(path, name, modules)]
    }
    assert {name: found for name, found in wrong.items() if found} == {}


def test_no_import_circle_at_module_level():
    modules = sources()
    graph = {name: lazy_free_imports(path, name, modules) for name, path in modules.items()}
    circles, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                circles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert circles == []


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_no_room_is_over_500_lines(folder):
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_checks_see_what_they_check():
    """The premise: the import reader finds the package's own imports (a reader that found none would pass)."""
    modules = sources()
    assert "files" in imports(modules["datasets.fashion_mnist"], "datasets.fashion_mnist", modules)
    assert {"config", "errors"} <= lazy_free_imports(modules["rundir"], "rundir", modules)
    assert "engine" in lazy_free_imports(modules["training_run"], "training_run", modules)
