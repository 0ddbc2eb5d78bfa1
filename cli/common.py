"""What every command shares: quiet TensorFlow, output directory names, and
the one place where a run's end becomes an exit code and one line on stderr."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import click

from ..errors import OUT_OF_MEMORY_LINE, Interrupted, OutOfMemory, TrainingStopped, UserError


def quiet_tensorflow(verbose: bool, load: bool = True) -> None:
    """TensorFlow's C++ log lines off unless --verbose: a first run should not look like a failure.

    TF_CPP_MIN_LOG_LEVEL=3 silences its logging once it runs (grappler's
    'remapper failed' among it); child processes (workers, compare's runs,
    bench) inherit it. The oneDNN and absl lines printed while TensorFlow
    loads ignore it, so the import itself runs with stderr closed. A Python
    error in the import still shows, after stderr is back."""
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if not load or "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def exit_codes():
    """The one place where a run's end becomes an exit code and one line on stderr."""
    try:
        yield
    except (UserError, TrainingStopped) as err:
        die(f"error: {err}", err.exit_code)
    except OutOfMemory as err:
        die(f"{OUT_OF_MEMORY_LINE}{err}", err.exit_code)
    except Interrupted as stop:
        name = signal.Signals(stop.signum).name
        how = (
            f"stopped at once by a second {name}; the last checkpoint (update {stop.step}) is intact"
            if stop.forced
            else f"stopped by {name} after update {stop.step}; checkpoint saved"
        )
        die(f"{how}. Resume with: accum-train run --resume {stop.run_dir}", stop.exit_code)


def die(line: str, code: int) -> None:
    click.echo(line, err=True)
    sys.exit(code)


def set_option(help_text: str):
    """--set KEY=VALUE, repeatable: a config override."""
    return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=help_text)


def output_dir_option(help_text: str):
    return click.option("--output-dir", type=click.Path(path_type=Path), default=None, help=help_text)


def count_option(name: str, default: int, help_text: str):
    """A whole number >= 1 with its default shown, e.g. --steps."""
    return click.option(name, default=default, show_default=True, type=click.IntRange(min=1), help=help_text)


verbose_option = click.option("--verbose", is_flag=True, help="Show TensorFlow's own log lines.")


def scores_text(record: dict, prefix: str) -> str:
    """ "test loss 0.3012, test accuracy 0.8950" of a record's ``prefix``_ scores (loss first, then the others:
    accuracy for the built-in loss, the compiled metrics for a Keras loss's run)."""
    keys = [
        key
        for key in record
        if key.startswith(prefix + "_") and not key.endswith("_examples") and isinstance(record[key], (int, float))
    ]
    keys.sort(key=lambda key: key != f"{prefix}_loss")
    return ", ".join(f"{prefix} {key[len(prefix) + 1 :].replace('_', ' ')} {record[key]:.4f}" for key in keys)
