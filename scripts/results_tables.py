"""Write the results tables (docs/results/, the README's headline) from the JSON their benchmark wrote, or check
that they are current.

A generated table stands between two markers naming its source and kind:

    <!-- table from docs/large-batch.json: rows -->
    ...generated...
    <!-- end of table -->

Each table opens with its caption, one line naming the machine and commit its JSON records (or saying that the
JSON does not record them) and the command that wrote the JSON.

    python scripts/results_tables.py            # rewrite every generated table
    python scripts/results_tables.py --check    # exit 1, naming the table, where one differs (a test runs this)
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(
    r"(?P<open><!-- table from (?P<source>\S+): (?P<kind>[\w-]+) -->\n)(?P<body>.*?)(?P<close><!-- end of table -->)",
    re.S,
)


@functools.cache  # one load per module, however many tables it makes
def _benchmark(name: str):
    if str(ROOT / "benchmarks") not in sys.path:  # as when a benchmark runs: its sibling modules importable
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# source file name -> (the module of benchmarks/ that makes its tables, {kind: that module's function}).
# benchmarks/tables.py makes the tables of scripts that import TensorFlow at the top (and of compare's JSON).
MAKERS = {
    "large-batch.json": ("large_batch", {"rows": "table", "targets": "targets"}),
    "peers.json": ("tables", {"results": "peers"}),
    "peers-keras-file.json": ("tables", {"results": "peers_keras"}),
    "peers-masked.json": ("peers_masked", {"results": "markdown_table"}),
    "peers-masked-threads.json": ("peers_masked", {"results": "markdown_table"}),
    "peers-causal-lm.json": ("peers_causal_lm", {"results": "markdown_table"}),
    "peers-jax.json": ("peers_jax", {"results": "markdown_table"}),
    "memory-batch.json": ("memory_batch", {"rows": "table"}),
    "remat-memory.json": ("remat_memory", {"rows": "table"}),
    "image-folder.json": ("image_folder", {"check": "check_table", "train": "train_table"}),
    "compare-fmnist.json": ("tables", {"results": "compare"}),
    "subdivided.json": ("subdivided", {"results": "table"}),
    "distributed.json": ("tables", {"results": "distributed"}),
    "profile.json": ("tables", {"results": "profile"}),
    "main-job.json": ("tables", {"results": "main_job", "noise-scale": "noise_scale"}),
    "subdivided-precision.json": ("subdivided", {"results": "table"}),
}

# Commits a page named for a JSON written before its script recorded one: the caption says where it came from
STATED = {"peers-masked.json": {"stated_commit": "a93e03e"}}


# Tables made from several JSONs (the marker names them all, comma-separated): kind -> (module, function).
SEVERAL = {"headline": ("tables", "headline")}


def render(source: str, kind: str) -> str:
    if "," in source:
        if kind not in SEVERAL:
            raise SystemExit(f"no table of kind {kind!r} is made from {source} (scripts/results_tables.py: SEVERAL)")
        module, function = SEVERAL[kind]
        reports = {Path(name).name: json.loads((ROOT / name).read_text()) for name in source.split(",")}
        return getattr(_benchmark(module), function)(reports).rstrip() + "\n"
    path = ROOT / source
    if path.name not in MAKERS or kind not in MAKERS[path.name][1]:
        raise SystemExit(f"no table of kind {kind!r} is made from {source} (scripts/results_tables.py: MAKERS)")
    module, kinds = MAKERS[path.name]
    make = getattr(_benchmark(module), kinds[kind])
    return make(json.loads(path.read_text()), **STATED.get(path.name, {})).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a generated table is not current")
    options = parser.parse_args(argv)
    stale = []
    for page in [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "docs" / "results").glob("*.md")),
    ]:
        text = page.read_text()
        fresh = BLOCK.sub(lambda m: m["open"] + render(m["source"], m["kind"]) + m["close"], text)
        if fresh != text:
            stale.append(page)
            if not options.check:
                page.write_text(fresh)
    for page in stale:
        print(f"{'stale' if options.check else 'rewritten'}: {page.relative_to(ROOT)}")
    return 1 if stale and options.check else 0


if __name__ == "__main__":
    sys.exit(main())
