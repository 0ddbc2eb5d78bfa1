"""The code's layers (docs/design.md): who may import whom, checked on the source's import statements.

- the CLI (cli/) sits on top: nothing under accum/ or datasets/ imports it;
- the dataset loaders (datasets/) import only the leaves of the core: config, defaults, errors, text, imports, files;
- the wings import downwards: the trainer (trainer/ and its rooms data/, store/, loss/) never imports a front end
  (from_config/, keras_fit/) or a command, the models never import the trainer or a front end, and the two front
  ends never import each other;
- the seam (accum/backends/__init__.py) imports only the leaves, and reaches its backends when asked, never by an
  import statement; a backend's folder (accum/backends/tensorflow/) imports only the leaves, Keras' internals, its
  own folder, the rooms of trainer/ every backend shares and models/containers, never the run machinery, a front end
  or a command (tests/test_backends.py: which modules speak TensorFlow, and that nothing outside reaches a backend
  but through the seam);
- no two modules import each other, directly or around a circle, even through imports inside functions;
- no module of accum/, cli/ or datasets/ is over 400 lines;
- every package folder (an ``__init__.py``, sub-rooms such as trainer/store/ too) is one setup.cfg installs, and
  every import of the package, from its own modules, the tests, benchmarks/ and scripts/, names a module it has.
"""

import ast
import configparser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "accum_train"
FOLDERS = {"accum": PACKAGE, "cli": f"{PACKAGE}.cli", "datasets": f"{PACKAGE}.datasets"}  # setup.cfg's package_dir
LEAVES = {f"{PACKAGE}.{name}" for name in ("config", "defaults", "errors", "text", "imports", "files")}
CLI, DATASETS = FOLDERS["cli"], FOLDERS["datasets"]
SEAM = f"{PACKAGE}.backends"
# What a backend's folder may import besides its own: the leaves, Keras' internals (keras_private), and the rooms of
# trainer/ that every backend shares: the noise scale's estimate, the feed's held batch and its pipeline, the batch
# arithmetic and layout, the data order, the arrays' checks and plan (JAX reads them as TensorFlow's ArrayFeed does),
# the sources' kinds, class weights as each example's and trim_padding's policy and cut; and what the
# accumulator needs of a network (models/containers).
DATA_ROOMS = ("feed", "batching", "reader", "order", "arrays", "conversion", "lengths")
BACKEND_MAY_IMPORT = (
    LEAVES
    | {f"{PACKAGE}.keras_private", f"{PACKAGE}.models.containers"}
    | {f"{PACKAGE}.trainer.data.{m}" for m in DATA_ROOMS}
    | {f"{PACKAGE}.trainer.noise"}
)
MAX_LINES = 400


def module_name(path: Path) -> str:
    """The import name of a source file: accum/trainer/loop.py is accum_train.trainer.loop, accum/__init__.py
    the package root accum_train itself."""
    relative = path.relative_to(ROOT)
    parts = [*FOLDERS[relative.parts[0]].split("."), *relative.with_suffix("").parts[1:]]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def sources() -> dict:
    return {module_name(path): path for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))}


def statements(path: Path, top_level_only: bool = False) -> list:
    """The import statements of ``path`` (``ast.Import``, ``ast.ImportFrom``), inside functions too unless
    ``top_level_only`` (those run when the function is called, after every module loaded)."""
    found = []

    def visit(node):
        if top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def import_bases(path: Path, name: str) -> list:
    """(line, module) for each import of the package in ``path`` (module ``name``): the module a ``from`` imports
    from, relative ones resolved, and each ``import accum_train.x`` (inside functions too)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in statements(path):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] + ([node.module] if node.module else [])
                found.append((node.lineno, ".".join(base)))
            elif node.module and node.module.split(".")[0] == PACKAGE:
                found.append((node.lineno, node.module))
        else:
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == PACKAGE]
    return found


def imports(path: Path, name: str, modules: dict, top_level_only: bool = False) -> set:
    """The package's modules that ``path`` (module ``name``) imports: relative (``from .x import y``) and absolute
    (``from accum_train.x import y``, ``import accum_train.x``) imports, inside functions too unless
    ``top_level_only``."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()

    def targets(base, names):
        for alias in names:
            target = ".".join([*base, alias])
            found.add(target if target in modules else ".".join(base))

    for node in statements(path, top_level_only):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] + ([node.module] if node.module else [])
                targets(base, [alias.name for alias in node.names])
            elif node.module and node.module.split(".")[0] == PACKAGE:
                targets(node.module.split("."), [alias.name for alias in node.names])
        else:
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE)
    return {target for target in found if target in modules and target != name}


def outside_imports(path: Path) -> set:
    """The top-level names of the packages outside this one that ``path`` imports (``import tensorflow as tf``,
    ``from tensorflow.python import x``: tensorflow), inside functions too."""
    found = set()
    for node in statements(path):
        if isinstance(node, ast.ImportFrom):
            if not node.level and node.module:
                found.add(node.module.split(".")[0])
        else:
            found.update(alias.name.split(".")[0] for alias in node.names)
    return found - {PACKAGE}


def circles(graph: dict) -> list:
    """Every import circle of ``graph`` (module -> the modules it imports), each as "a -> b -> a"."""
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_nothing_below_the_cli_imports_it():
    modules = sources()
    offenders = {
        name: sorted(t for t in imports(path, name, modules) if t == CLI or t.startswith(f"{CLI}."))
        for name, path in modules.items()
        if not (name == CLI or name.startswith(f"{CLI}."))
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_core_starts_no_process_of_the_cli():
    """Workers, compare's sides and the core's other children run its own entry points (``accum_train.worker``,
    ``accum_train.bench``, ``accum_train.datasets``), never ``accum_train.cli``: a string naming it is enough to
    find one (a module name in a string constant, as ``-m`` takes it)."""
    naming = sorted(
        name
        for name, path in sources().items()
        if not name.startswith(CLI)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("accum_train.cli")
    )
    assert naming == []


def test_the_dataset_loaders_import_only_the_core_s_leaves():
    modules = sources()
    allowed = LEAVES | {name for name in modules if name.startswith(DATASETS)}
    wrong = {
        name: sorted(found - allowed)
        for name, path in modules.items()
        if name.startswith(DATASETS)
        for found in [imports(path, name, modules)]
    }
    assert {name: found for name, found in wrong.items() if found} == {}


COMMANDS = (
    "bench",
    "compare",
    "describe",
    "evaluate",
    "export",
    "loader",
    "plan",
    "predict",
    "raw_text",
    "reload",
    "worker",
    "outcome",
    "on_keras",  # the config's run on JAX: a config made one call of accum_train.fit, above both front ends
)
FRONT_ENDS = (f"{PACKAGE}.from_config", f"{PACKAGE}.keras_fit")


@pytest.mark.parametrize(
    "wing, forbidden",
    [
        (f"{PACKAGE}.trainer", (*FRONT_ENDS, *(f"{PACKAGE}.{name}" for name in COMMANDS))),
        (f"{PACKAGE}.models", (f"{PACKAGE}.trainer", *FRONT_ENDS)),
        (f"{PACKAGE}.from_config", (f"{PACKAGE}.keras_fit",)),
        (f"{PACKAGE}.keras_fit", (f"{PACKAGE}.from_config",)),
    ],
)
def test_the_wings_import_downwards(wing, forbidden):
    modules = sources()
    assert any(name.startswith(f"{wing}.") for name in modules)  # the wing is there to be checked
    wrong = {
        name: sorted(t for t in imports(path, name, modules) if any(t == f or t.startswith(f"{f}.") for f in forbidden))
        for name, path in modules.items()
        if name == wing or name.startswith(f"{wing}.")
    }
    assert {name: found for name, found in wrong.items() if found} == {}


def test_the_seam_imports_only_the_leaves():
    modules = sources()
    assert imports(modules[SEAM], SEAM, modules) - LEAVES == set()


def test_a_backend_imports_only_its_folder_the_leaves_and_the_update_s_pieces():
    modules = sources()

    def own(module):  # the backend folder a module is in (accum_train.backends.NAME), or None
        parts = module.split(".")
        return ".".join(parts[:3]) if module.startswith(f"{SEAM}.") else None

    backends = {name.split(".")[2] for name in modules if name.startswith(f"{SEAM}.")}
    assert backends == {"tensorflow", "jax"}  # the folders there are to check
    wrong = {
        name: sorted(t for t in imports(path, name, modules) if t not in BACKEND_MAY_IMPORT and own(t) != own(name))
        for name, path in modules.items()
        if name.startswith(f"{SEAM}.")
    }
    assert {name: found for name, found in wrong.items() if found} == {}


def test_the_config_stops_at_the_front_ends():
    """Issue 75: the front ends turn the config into door-neutral values; nothing of the Trainer (trainer/) or of
    a backend imports config/ or takes a ``cfg``."""
    modules = sources()
    inside = {name: path for name, path in modules.items() if name.startswith((f"{PACKAGE}.trainer", f"{SEAM}."))}
    config = f"{PACKAGE}.config"
    importing = sorted(name for name, path in inside.items() if config in imports(path, name, modules))
    taking = sorted(
        f"{name}:{getattr(node, 'name', 'lambda')}"
        for name, path in inside.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        and "cfg" in {argument.arg for argument in (*node.args.args, *node.args.kwonlyargs)}
    )
    assert len(inside) > 40  # trainer/ and the backends are there to check
    assert (importing, taking) == ([], [])


def test_no_import_circle():
    """Not at module level, and not through the imports inside functions either: a function-level import that
    closes a circle still drags one layer's modules into the other's processes (the training process into the
    supervisor's, say)."""
    modules = sources()
    assert circles({name: imports(path, name, modules) for name, path in modules.items()}) == []


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_no_room_is_over_400_lines(folder):
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_every_package_folder_is_installed():
    """setup.cfg lists its packages one by one: a folder left off is still importable from the checkout (the editable
    install maps the top folders), and missing from a wheel."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    folders = {name for name, path in sources().items() if path.name == "__init__.py"}
    assert set(setup["options"]["packages"].split()) == folders


def test_every_import_of_the_package_names_a_module_it_has():
    """The readers above pass over an import of a module that is not there (a room moved, an import left behind):
    this finds it, inside a function too, where importing the module would not."""
    modules = sources()
    importers = {**modules}
    importers.update(
        {
            str(path.relative_to(ROOT)): path
            for folder in ("tests", "benchmarks", "scripts")
            for path in (ROOT / folder).rglob("*.py")
        }
    )
    missing = [
        f"{path.relative_to(ROOT)}:{line} {target}"
        for name, path in sorted(importers.items())
        for line, target in import_bases(path, name)
        if target not in modules
    ]
    assert missing == []


def test_the_checks_see_what_they_check(tmp_path):
    """The premise: the import reader finds the package's own imports, relative, absolute and inside functions,
    the package root's too, and the circle finder finds a circle (a reader that found none would pass)."""
    modules = sources()

    def of(name, top_level_only=False):
        return imports(modules[name], name, modules, top_level_only)

    assert f"{PACKAGE}.files" in of(f"{DATASETS}.fashion_mnist")
    assert {f"{PACKAGE}.config", f"{PACKAGE}.errors"} <= of(f"{PACKAGE}.from_config.source", True)
    assert f"{PACKAGE}.from_config.lifecycle" in of(f"{PACKAGE}.from_config.api")  # inside run()
    assert f"{PACKAGE}.from_config.lifecycle" not in of(f"{PACKAGE}.from_config.api", True)
    assert f"{PACKAGE}.from_config.api" in of(PACKAGE)  # the root's own imports are read
    assert f"{PACKAGE}.cli.main" in imports(ROOT / "tests" / "test_worker.py", "tests.test_worker", modules)
    # a room's sub-rooms are read too (trainer/store/), their ``...`` and ``..`` resolved from their depth
    assert {f"{PACKAGE}.errors", f"{PACKAGE}.trainer.memory"} <= of(f"{PACKAGE}.trainer.store.rundir")
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a"]
    moved = tmp_path / "feed.py"  # an import left behind by a move, as the check above would see it
    moved.write_text("def f():\n    from ..trainer.feed import Feed\n")
    assert import_bases(moved, f"{PACKAGE}.cli.feed") == [(2, f"{PACKAGE}.trainer.feed")]
    assert f"{PACKAGE}.trainer.feed" not in modules
    rundir = f"{PACKAGE}.trainer.store.rundir"  # inside functions, two levels up and three
    assert {f"{PACKAGE}.trainer.runtime", f"{PACKAGE}.backends"} <= {
        t for _, t in import_bases(modules[rundir], rundir)
    }
