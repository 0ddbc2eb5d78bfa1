"""Write the docs/ pages' results tables from the JSON their benchmark wrote, or check that they are current.

A generated table stands between two markers naming its source and kind:

    <!-- table from docs/large-batch.json: rows -->
    ...generated...
    <!-- end of table -->

    python scripts/results_tables.py            # rewrite every generated table
    python scripts/results_tables.py --check    # exit 1, naming the table, where one differs (a test runs this)
"""

from __future__ import annotations

import argparse
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


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _large_batch(report: dict, kind: str) -> str:
    bench = _benchmark("large_batch")
    return {"rows": bench.table, "targets": bench.targets}[kind](report)


# source file name -> how its kinds of table are made
MAKERS = {"large-batch.json": _large_batch}


def render(source: str, kind: str) -> str:
    path = ROOT / source
    return MAKERS[path.name](json.loads(path.read_text()), kind).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a generated table is not current")
    options = parser.parse_args(argv)
    stale = []
    for page in sorted((ROOT / "docs").glob("*.md")):
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
