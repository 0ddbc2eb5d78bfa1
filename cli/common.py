"""The options every command shares. How a command ends (one line on stderr and the exit code), the lines a run
prints and TensorFlow kept quiet are the core's (``outcome``, ``quiet``): its own child processes share them."""

from __future__ import annotations

from pathlib import Path

import click


def set_option(help_text: str):
    """--set KEY=VALUE, repeatable: a config override."""
    return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=help_text)


def output_dir_option(help_text: str):
    return click.option("--output-dir", type=click.Path(path_type=Path), default=None, help=help_text)


def count_option(name: str, default: int, help_text: str):
    """A whole number >= 1 with its default shown, e.g. --steps."""
    return click.option(name, default=default, show_default=True, type=click.IntRange(min=1), help=help_text)


verbose_option = click.option("--verbose", is_flag=True, help="Show TensorFlow's own log lines.")
