"""``accum-train describe``: what a run directory of either door holds and how far it got, without loading
TensorFlow (the work is accum_train.describe's; this formats it)."""

from __future__ import annotations

from pathlib import Path

import click

from ..files import strict_json
from ..outcome import ending
from ..text import counted


@click.command(short_help="Which door wrote a run directory, its batch, how far it got, how to go on.")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print it as one JSON document.")
def describe(run_dir, as_json):
    """Show what RUN_DIR holds: the door that wrote it ('accum-train run' or accum_train.fit), its batch and
    micro-batches, the updates logged, the checkpoints kept, whether it finished, and how to go on with it.
    Reads the files only: nothing is written, and a run that is training is not disturbed.

    \b
    accum-train describe runs/smoke
    accum-train describe runs/tagger --json
    """
    with ending():
        from ..describe import describe as describe_run

        result = describe_run(run_dir)
    click.echo(strict_json(result, indent=2) if as_json else format_description(result))


def format_description(d: dict) -> str:
    k, size = d["subdivisions_in_force"], d["batch_size_in_force"]
    batch = f"{size} in {counted(k, 'micro-batch', 'micro-batches')}" if k not in (None, "auto") else f"{size} ({k})"
    state = {
        "training": f"training (process {d['writer_pid']} writes it)",
        "finished": "finished",
        "stopped": "stopped before its end",
    }[d["state"]]
    loss = "" if d["last_loss"] is None else f", last loss {d['last_loss']:.4g}"
    noise = "" if d["noise_scale"] is None else f", noise scale {d['noise_scale']:.4g}"
    checkpoints = ", ".join(f"ckpt-{n}" for n in d["checkpoints"]) or "none"
    lines = [
        f"{d['run_dir']}: written by {d['door']}, {state}",
        f"  model      {d['model']}" + (f" (its file: {d['model_file']})" if d["model_file"] else ""),
        f"  batch      {batch}, seed {d['seed']}",
        f"  progress   {counted(d['updates_logged'], 'update')} logged, {counted(d['epochs_ended'], 'epoch')} ended"
        f"{loss}{noise}",
        f"  kept       {checkpoints}",
    ]
    if d["next"]:
        lines.append(f"  go on      {d['next']}")
    return "\n".join(lines)
