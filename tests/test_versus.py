"""benchmarks/versus.py: the package folder it builds from a tree's setup.cfg, the figures it reads from a run's JSON
(and its errors), its usage errors, and one whole comparison against HEAD in which each tree's runs import that tree's
own sources."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_file

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "versus.py"


@pytest.fixture
def versus(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports its siblings (paired, provenance) as a script
    return load_file(SCRIPT, "versus")


def test_the_package_folder_maps_each_package_to_the_tree_s_folder(versus, tmp_path):
    tree = tmp_path / "tree"
    for folder in ("accum", "accum/config", "cli", "datasets"):
        (tree / folder).mkdir(parents=True)
        (tree / folder / "__init__.py").write_text("")
    (tree / "accum" / "engine.py").write_text("")
    (tree / "setup.cfg").write_text(
        "[options]\npackage_dir =\n    accum_train = accum\n"
        "    accum_train.cli = cli\n    accum_train.datasets = datasets\n"
    )
    layout = versus.package_layout(tree, tmp_path / "layout")
    package = layout / "accum_train"
    assert package.is_dir() and not package.is_symlink()
    links = {path.name: path.readlink() for path in package.iterdir()}
    assert links == {
        "__init__.py": tree / "accum" / "__init__.py",
        "config": tree / "accum" / "config",
        "engine.py": tree / "accum" / "engine.py",
        "cli": tree / "cli",
        "datasets": tree / "datasets",
    }


@pytest.mark.parametrize(
    "content, keys, message",
    [
        (None, "a", "--figure f.json:a: the run wrote no f.json (files: [])"),
        (
            {"rows": [{"x": 1}]},
            "rows.2.x",
            "--figure f.json:rows.2.x: no '2' in f.json at that point (there: a list of 1)",
        ),
        ({"a": {"b": 1}}, "a.c", "--figure f.json:a.c: no 'c' in f.json at that point (there: ['b'])"),
        ({"a": "fast"}, "a", "--figure f.json:a: 'fast' is not a number"),
        ({"a": True}, "a", "--figure f.json:a: True is not a number"),
    ],
)
def test_figure_errors(versus, tmp_path, content, keys, message):
    if content is not None:
        (tmp_path / "f.json").write_text(json.dumps(content))
    with pytest.raises(SystemExit) as raised:
        versus.figure(tmp_path / "f.json", keys, f"f.json:{keys}")
    assert str(raised.value) == message


def test_figure_reads_through_dicts_and_lists(versus, tmp_path):
    (tmp_path / "f.json").write_text(json.dumps({"rows": [{}, {"cpu_s_per_example": 0.25}], "time": {"(a) x": 3}}))
    assert versus.figure(tmp_path / "f.json", "rows.1.cpu_s_per_example", "") == 0.25
    assert versus.figure(tmp_path / "f.json", "time.(a) x", "") == 3.0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["HEAD", "--figure", "f.json:a"], "give the command after --, e.g. -- python benchmarks/peers.py --output"),
        (["HEAD", "--figure", "f.json", "--", "true", "{out}"], "--figure 'f.json' must be FILE:PATH, e.g. bench.json"),
        (
            ["HEAD", "--figure", "f.json:a", "--", "true"],
            "the command writes its JSON nowhere versus.py reads: put {out}",
        ),
    ],
)
def test_usage_errors(argv, message):
    done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith(f"versus.py: error: {message}")


def test_each_tree_runs_its_own_sources_and_the_ratio_is_taken_per_round(tmp_path):
    # each run writes 1.0 where accum_train came from the tree it runs in (its working directory), else 0.0
    code = (
        "import json, os, sys, accum_train; "
        "own = os.path.realpath(accum_train.__file__).startswith(os.path.realpath(os.getcwd()) + os.sep); "
        "json.dump({'own': float(own), 'rows': [{'n': 2}]}, open(sys.argv[1], 'w'))"
    )
    out = tmp_path / "versus.json"
    argv = ["HEAD", "--rounds", "3", "--figure", "f.json:own", "--figure", "f.json:rows.0.n", "--output", str(out)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *argv, "--", "python", "-c", code, "{out}/f.json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["rounds"] == 3 and report["command"][-1] == "{out}/f.json"
    old_tree = Path(report["imports"]["old"]).parent.parent
    assert Path(report["imports"]["new"]) == ROOT / "accum" / "__init__.py" and old_tree != ROOT
    assert not old_tree.exists()  # the temporary worktree is gone
    for spec in ("f.json:own", "f.json:rows.0.n"):
        figures = report["figures"][spec]
        value = 1.0 if spec == "f.json:own" else 2.0
        assert figures["old"] == figures["new"] == [value] * 3
        assert figures["new_over_old"]["per_round"] == [1.0] * 3
        assert (figures["new_over_old"]["median"], figures["new_over_old"]["confidence"]) == (1.0, 0.75)
        assert figures["no_worse"] is True
    rounds = [line.split(":")[0].strip() for line in done.stdout.splitlines() if line.startswith("  round ")]
    assert rounds == ["round 1 old", "round 1 new", "round 2 new", "round 2 old", "round 3 old", "round 3 new"]
    assert "  f.json:own  1.000 [1.000, 1.000] (75.00% coverage; rounds 1.000, 1.000, 1.000): no worse" in done.stdout
