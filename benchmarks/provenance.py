"""Where a benchmark ran, written into its JSON so that the table made from it names the machine and commit once
(scripts/results_tables.py): the commit (with "+changes" when the code differs from it) and the CPU."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = ("accum", "cli", "datasets", "benchmarks", "configs", "setup.cfg", "pyproject.toml")


def commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    # the code that was measured: a results file written by an earlier benchmark of the same session is not it
    changed = git("status", "--porcelain", "--untracked-files=no", "--", *CODE)
    return head + ("+changes" if changed else "")


def cpu() -> str:
    """The CPU's model name (Linux), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> dict:
    return {"commit": commit(), "cpu": cpu(), "cpus": os.cpu_count()}
