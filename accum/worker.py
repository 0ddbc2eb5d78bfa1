"""``python -m accum_train.worker CONFIG (--output-dir DIR | --resume DIR) [--set KEY=VALUE ...]``: one training
process started by the core itself, a worker of ``run --workers`` or one side of ``compare``.

It trains as ``accum-train run --quiet`` does and says the same: one line per
epoch, then the last line, and on failure one line on stderr and the exit
code of ``outcome.ending``, which is what the supervisor reads. It is the
core's own entry point: the core never starts (or imports) the CLI.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m accum_train.worker")
    parser.add_argument("config", type=Path)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--output-dir", type=Path)
    where.add_argument("--resume", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)

    from .outcome import EpochLines, ending, last_line, quiet_tensorflow

    quiet_tensorflow(verbose=False)
    from .from_config.api import run

    with ending():
        summary = run(
            args.config, output_dir=args.output_dir, overrides=args.overrides, progress=EpochLines(), resume=args.resume
        )
    print(last_line(summary, args.resume or args.output_dir), flush=True)


if __name__ == "__main__":
    main()
