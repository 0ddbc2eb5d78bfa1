"""A command run back to back in an earlier commit's tree and in this one: per-round ratios new/old of a figure.

    python benchmarks/versus.py REV --figure FILE:KEY.KEY... -- COMMAND...

REV (a commit, a tag, HEAD~3) is checked out into a temporary git worktree. COMMAND then runs --rounds times in each
tree, alternately (round 1 old then new, round 2 new then old, ...: neither tree always runs first), with the tree's
root as its working directory, so that a relative path in COMMAND (benchmarks/peers.py, configs/fmnist.yaml) is that
tree's. Both trees run under this interpreter's environment (its bin/ first on PATH: `python` and `accum-train` are
this venv's), each importing its own sources: PYTHONPATH names a small package folder built for the tree from its
setup.cfg's package_dir (accum_train -> accum/, accum_train.cli -> cli/, ...), symlinks to the tree's files, which
Python finds before the editable install's finder. Building it takes milliseconds and installs nothing, so the old
tree needs no venv of its own; it assumes the old commit runs with this venv's dependencies.

`{out}` in COMMAND stands for a fresh empty folder per run; --figure FILE:PATH names a number in the JSON the run
wrote there: FILE relative to that folder, PATH its keys joined by dots (an integer indexes a list). Per figure,
the ratio new/old is taken within each round (the two runs went back to back) and reported as the median of the
per-round ratios with a distribution-free 95% interval (benchmarks/paired.py: 6 rounds, the default, is the fewest
for which one reaches 95%). --better says which way is better for the figures (lower: times, the default); the
new tree is "no worse" when the median is on the better side of 1 or the interval contains 1.

    python benchmarks/versus.py REV --figure bench.json:rows.1.cpu_s_per_example -- \\
        accum-train bench configs/fmnist.yaml --subdivisions 1,8 --steps 10 --output-dir {out}
    python benchmarks/versus.py REV --figure 'peers.json:time.(a) accum-train.cpu_s_per_example' -- \\
        python benchmarks/peers.py --output {out}/peers.json
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import paired  # benchmarks/ is on sys.path: this script runs from there
import provenance

ROOT = Path(__file__).resolve().parent.parent
OUT = "{out}"


def git(*args, cwd=ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


def package_dirs(tree: Path) -> dict:
    """setup.cfg's [options] package_dir of ``tree``: import name -> folder in the tree."""
    cfg = configparser.ConfigParser()
    cfg.read(tree / "setup.cfg")
    lines = cfg.get("options", "package_dir", fallback="").strip().splitlines()
    mapping = dict(tuple(part.strip() for part in line.split("=", 1)) for line in lines if "=" in line)
    if not mapping:
        raise SystemExit(f"{tree / 'setup.cfg'} maps no package (options.package_dir): cannot import that tree")
    return mapping


def package_layout(tree: Path, into: Path) -> Path:
    """A folder to put on PYTHONPATH that imports ``tree``'s packages under their installed names: each top
    package a real folder of symlinks to its source folder's entries, each mapped subpackage a symlink in it."""
    mapping = package_dirs(tree)
    tops = {name: folder for name, folder in mapping.items() if "." not in name}
    for name, folder in tops.items():
        package = into / name
        package.mkdir(parents=True)
        for entry in (tree / folder).iterdir():
            (package / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        parent, _, child = name.rpartition(".")
        if not parent:
            continue
        if parent not in tops:
            raise SystemExit(f"package_dir maps {name} = {folder}: only subpackages of a top package are supported")
        link = into / parent / child
        if link.is_symlink():
            link.unlink()
        link.symlink_to(tree / folder)
    return into


def environment(layout: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(layout), env.get("PYTHONPATH")]))
    return env


def check_imports(tree: Path, env: dict) -> str:
    """Where ``tree``'s environment imports accum_train from; an error unless it is the tree's own sources."""
    code = "import os, accum_train; print(os.path.realpath(accum_train.__file__))"
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    found = done.stdout.strip()
    if done.returncode != 0 or not Path(found).is_relative_to(tree.resolve()):
        raise SystemExit(f"{tree} imports accum_train from {found or done.stderr[-2000:]}, not its own sources")
    return found


@contextlib.contextmanager
def two_trees(rev: str, prefix: str):
    """(scratch folder, {"old": (tree, env), "new": (tree, env)}, {side: where it imports accum_train from}):
    REV checked out in a temporary worktree beside this one, each tree importing its own sources (checked); the
    worktree removed on leaving."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        scratch = Path(folder)
        old_tree = scratch / "old"
        git("worktree", "add", "--detach", str(old_tree), rev)
        try:
            trees = {
                "old": (old_tree, environment(package_layout(old_tree, scratch / "layout-old"))),
                "new": (ROOT, environment(package_layout(ROOT, scratch / "layout-new"))),
            }
            imports = {side: check_imports(tree, env) for side, (tree, env) in trees.items()}
            yield scratch, trees, imports
        finally:
            git("worktree", "remove", "--force", str(old_tree))


def figure(path: Path, keys: str, spec: str) -> float:
    """The number at ``keys`` (dot-joined) in the JSON file ``path``."""
    if not path.is_file():
        raise SystemExit(
            f"--figure {spec}: the run wrote no {path.name} (files: {sorted(p.name for p in path.parent.iterdir())})"
        )
    value = json.loads(path.read_text())
    for key in keys.split("."):
        try:
            value = value[int(key)] if isinstance(value, list) else value[key]
        except (KeyError, IndexError, ValueError, TypeError):
            there = (
                list(value)
                if isinstance(value, dict)
                else f"a list of {len(value)}"
                if isinstance(value, list)
                else value
            )
            raise SystemExit(f"--figure {spec}: no {key!r} in {path.name} at that point (there: {there})") from None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise SystemExit(f"--figure {spec}: {value!r} is not a number")
    return float(value)


def run(command: list, tree: Path, env: dict, out: Path, specs: list) -> dict:
    """COMMAND once in ``tree``, {out} replaced by ``out``; the figures it wrote, and its wall seconds."""
    out.mkdir(parents=True)
    words = [word.replace(OUT, str(out)) for word in command]
    started = time.perf_counter()
    done = subprocess.run(words, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(words)} failed in {tree} ({done.returncode}):\n{done.stderr[-3000:]}")
    return {"figures": [figure(out / file, keys, f"{file}:{keys}") for file, keys in specs], "wall_s": wall}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s REV [options] -- COMMAND...",
    )
    parser.add_argument("rev", help="the earlier commit (anything git rev-parse takes)")
    parser.add_argument("--figure", action="append", required=True, help="FILE:PATH in a run's {out}; repeatable")
    parser.add_argument("--better", choices=("lower", "higher"), default="lower", help="which way is better for them")
    parser.add_argument("--rounds", type=int, default=paired.ROUNDS, help="rounds, each one run per tree")
    parser.add_argument("--output", type=Path, default=None, help="also write the figures and ratios as JSON here")
    # the command is everything after the first "--", never parsed here: its options are its own
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        parser.error("give the command after --, e.g. -- python benchmarks/peers.py --output {out}/peers.json")
    specs = []
    for spec in args.figure:
        file, sep, keys = spec.partition(":")
        if not (sep and file and keys):
            parser.error(f"--figure {spec!r} must be FILE:PATH, e.g. bench.json:rows.1.cpu_s_per_example")
        specs.append((file, keys))
    if not any(OUT in word for word in command):
        parser.error(f"the command writes its JSON nowhere versus.py reads: put {OUT} in it (--output {OUT}/x.json)")

    old_commit = git("rev-parse", "--short", f"{args.rev}^{{commit}}")
    new_commit = provenance.commit()  # "+changes" where the code differs from HEAD
    started = time.perf_counter()
    with two_trees(old_commit, "versus-") as (scratch, trees, imports):
        setup_s = time.perf_counter() - started
        print(
            f"versus: {args.rev} ({old_commit}) against this tree ({new_commit}), {args.rounds} rounds, old and "
            f"new alternately first; set-up {setup_s:.1f} s (worktree, package folders, an import check each)",
            flush=True,
        )
        samples = {"old": [], "new": []}
        for r in range(args.rounds):
            for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
                tree, env = trees[side]
                sample = run(command, tree, env, scratch / "runs" / f"{r + 1}-{side}", specs)
                samples[side].append(sample)
                shown = ", ".join(f"{value:.6g}" for value in sample["figures"])
                print(f"  round {r + 1} {side}: {shown} ({sample['wall_s']:.0f} s)", flush=True)

    target = "<= 1.0" if args.better == "lower" else ">= 1.0"
    report = {}
    print(f"\nnew/old per figure ({args.better} is better), rounded to the nearest: median [95% interval]")
    for i, (file, keys) in enumerate(specs):
        old = [sample["figures"][i] for sample in samples["old"]]
        new = [sample["figures"][i] for sample in samples["new"]]
        ratio = paired.paired_ratio(new, old)
        no_worse = paired.reaches(target, ratio)
        rounds = ", ".join(f"{value:.3f}" for value in ratio["per_round"])
        print(
            f"  {file}:{keys}  {ratio['median']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}] "
            f"({100 * ratio['confidence']:.2f}% coverage; rounds {rounds}): "
            f"{'no worse' if no_worse else 'WORSE'}"
        )
        report[f"{file}:{keys}"] = {"old": old, "new": new, "new_over_old": ratio, "no_worse": no_worse}
    print(f"  ('no worse': {paired.RULE}; the target here new/old {target})")
    if args.output:
        args.output.write_text(
            json.dumps(
                {
                    "rev": args.rev,
                    "old_commit": old_commit,
                    "new_commit": new_commit,
                    "command": command,
                    "rounds": args.rounds,
                    "order": "round 1 old then new, then alternating",
                    "better": args.better,
                    "setup_s": setup_s,
                    "imports": imports,  # accum_train's __init__.py as each tree's runs import it
                    "wall_s": {side: [sample["wall_s"] for sample in samples[side]] for side in samples},
                    "figures": report,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
