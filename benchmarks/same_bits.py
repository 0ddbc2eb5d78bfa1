"""The same runs in an earlier commit's tree and in this one: are the trained weights the same bits?

    python benchmarks/same_bits.py REV [--case NAME ...] [--output FILE.json]

A refactor keeps what a run computes. Each case is one `accum-train run` command, run once in REV's tree (a
temporary git worktree, imported through versus.py's package folder: no second venv) and once in this tree, each
into a fresh output directory; then every array of the two weights.npz files is compared: equal bit for bit, or the
largest absolute difference. The cases (``CASES``) are the main job's first epoch, the smoke config, the smoke config
on two mirrored CPU replicas, and the smoke config on two local workers (`--workers 2`, inside a private network
namespace as the tests run them, since TensorFlow's gRPC server listens on every interface without authentication).
Both trees run under this venv and its thread pools, one run at a time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import versus  # benchmarks/ is on sys.path: this script runs from there

SMOKE = ["configs/smoke.yaml"]
CASES = {
    "main-epoch-1": ["configs/fmnist.yaml", "--set", "epochs=1"],
    "smoke": SMOKE,
    "mirrored": [*SMOKE, "--set", "strategy.name=mirrored", "--set", "strategy.cpu_devices=2"],
    "workers-2": [*SMOKE, "--workers", "2"],
}


def private_network(command: list) -> list:
    """``command`` in a new user and network namespace with loopback up (workers never listen on the host)."""
    quoted = " ".join(f"'{part}'" for part in command)
    return ["unshare", "-rn", "sh", "-c", f"ip link set lo up && exec {quoted}"]


def train(tree: Path, env: dict, args: list, out: Path) -> float:
    """One run of ``args`` in ``tree`` into ``out``; its wall seconds."""
    command = ["accum-train", "run", *args, "--output-dir", str(out), "--quiet"]
    if "--workers" in args:
        command = private_network(command)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {tree} ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def compare(old: Path, new: Path) -> dict:
    """Each array of two weights.npz files: the same bits, or the largest absolute difference."""
    with np.load(old / "weights.npz") as a, np.load(new / "weights.npz") as b:
        if sorted(a.files) != sorted(b.files):
            return {"same_names": False, "old": sorted(a.files), "new": sorted(b.files)}
        differing = {
            name: float(np.max(np.abs(a[name] - b[name]))) for name in a.files if a[name].tobytes() != b[name].tobytes()
        }
        return {"same_names": True, "arrays": len(a.files), "identical": not differing, "max_abs_difference": differing}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev", help="the earlier commit (anything git rev-parse takes)")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="a case to run (default: all)")
    parser.add_argument("--output", type=Path, default=None, help="also write the comparison as JSON here")
    args = parser.parse_args()
    old_commit = versus.git("rev-parse", "--short", f"{args.rev}^{{commit}}")
    report = {"old": old_commit, "new": versus.provenance.commit(), "cases": {}}
    with versus.two_trees(old_commit, "same-bits-") as (scratch, trees, _imports):
        for name in args.case or list(CASES):
            walls = {side: train(tree, env, CASES[name], scratch / name / side) for side, (tree, env) in trees.items()}
            result = {**compare(scratch / name / "old", scratch / name / "new"), "wall_s": walls}
            report["cases"][name] = result
            verdict = "the same bits" if result.get("identical") else f"DIFFERENT: {result}"
            print(f"{name}: {verdict} ({walls['old']:.0f} s old, {walls['new']:.0f} s new)", flush=True)
    if args.output is not None:
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(0 if all(case.get("identical") for case in report["cases"].values()) else 1)


if __name__ == "__main__":
    main()
