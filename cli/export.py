"""``accum-train export``: a run's trained model as a standard Keras file (a run of 'accum-train run', or a run
directory of accum_train.fit(output_dir=...), finished or not)."""

from __future__ import annotations

from pathlib import Path

import click

from ..outcome import ending
from ..quiet import quiet_tensorflow
from .common import verbose_option


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--output",
    type=click.Path(dir_okay=True, path_type=Path),
    default=None,
    help="The .keras file to write (default: RUN_DIR/model.keras; a fit output_dir: RUN_DIR/export.keras).",
)
@click.option("--overwrite", is_flag=True, help="Replace the output file if it exists (atomically).")
@verbose_option
def export(run_dir, output, overwrite, verbose):
    """Write a run's trained model as a Keras file that keras.models.load_model
    opens without accum-train (BatchNorm with its trained moving statistics);
    also the model of a run directory of accum_train.fit at its latest checkpoint.

    \b
    accum-train export runs/smoke
    accum-train export runs/smoke --output smoke.keras --overwrite
    accum-train export runs/tagger --output tagger.keras
    """
    quiet_tensorflow(verbose)
    with ending():
        from ..export import export_run

        path = export_run(run_dir, output, overwrite)
    click.echo(f"written: {path}")
