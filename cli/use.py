"""``accum-train plan``, ``evaluate``, ``predict``, ``export`` and ``describe``: before and after training, and the
options every command shares.

``plan`` shows what a config will do without training (the split of each batch, the updates, the learning rate,
warnings); ``evaluate`` measures a trained run on its test data and draws its confusion matrix; ``predict`` gives
class probabilities for image or .npz files; ``export`` writes a run's model as a standard Keras file; ``describe``
says what a run directory of either door holds, without loading TensorFlow. Evaluate and predict read a run
directory of accum_train.fit(output_dir=...) too: evaluate on the arrays of ``--data``, predict the model's outputs
(per position for a sequence), and for a KerasHub task raw .txt or .jsonl text through its own preprocessor. The
work is in the core (accum_train.plan, .evaluate, .predict, .export, .describe); this module parses flags and
formats the results. Errors follow the rest of the tool: one line, exit 2.
"""

from __future__ import annotations

import io
from pathlib import Path

import click

from ..config import load_config
from ..errors import UserError
from ..files import atomic_write, strict_json
from ..outcome import ending, quiet_tensorflow, scores_text
from ..text import counted
from .plan_text import format_plan


def set_option(help_text: str):
    """--set KEY=VALUE, repeatable: a config override."""
    return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=help_text)


def output_dir_option(help_text: str):
    return click.option("--output-dir", type=click.Path(path_type=Path), default=None, help=help_text)


verbose_option = click.option("--verbose", is_flag=True, help="Show TensorFlow's own log lines.")


@click.command(short_help="The split of each batch, the updates, the learning rate; trains nothing.")
@click.argument("config", type=click.Path(dir_okay=True, path_type=Path))
@set_option("Override a config value, e.g. --set subdivisions=10")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON document.")
@verbose_option
def plan(config, overrides, as_json, verbose):
    """Show what a run of CONFIG would do, without training or writing anything.

    \b
    accum-train plan configs/fmnist.yaml
    accum-train plan configs/smoke.yaml --set subdivisions=5
    """
    with ending():
        cfg = load_config(config, overrides)  # before TensorFlow loads: a bad config answers at once
        quiet_tensorflow(verbose)  # image_folder decodes with TensorFlow while it checks the files
        from ..from_config.build import load_data

        data = load_data(cfg)
        from ..plan import plan as make_plan

        result = make_plan(cfg, data)
    click.echo(strict_json(result, indent=2) if as_json else format_plan(result))


@click.command(short_help="Test loss, accuracy and confusion matrix of a trained run.")
@click.argument("run_dir", type=click.Path(path_type=Path))
@set_option("Change the test data (data.* keys only), e.g. --set data.test_limit=1000")
@click.option(
    "--data",
    "data_file",
    type=click.Path(path_type=Path),
    default=None,
    help="A run directory of accum_train.fit: the .npz to evaluate on (arrays x and y, optionally sample_weight); "
    'for a KerasHub task trained on raw text, a .txt file (one text a line) or a .jsonl file (one {"x": TEXT, '
    '"y": LABEL} a line; "y" where its preprocessor takes labels) read through its own preprocessor.',
)
@output_dir_option("Directory for evaluate.json and evaluate.png (default: RUN_DIR/evaluate).")
@verbose_option
def evaluate(run_dir, overrides, data_file, output_dir, verbose):
    """Test loss, accuracy and confusion matrix of a trained run (latest checkpoint); for a run directory of
    accum_train.fit, model.evaluate's loss and metrics on the arrays of --data.

    \b
    accum-train evaluate runs/smoke
    accum-train evaluate runs/smoke --set data.test_limit=100 --output-dir runs/smoke/eval-100
    accum-train evaluate runs/tagger --data held_out.npz
    accum-train evaluate runs/lora --data held_out.txt
    """
    with ending():
        from ..evaluate import evaluate as run_evaluate
        from ..evaluate import evaluation_dir

        out_dir = Path(output_dir) if output_dir else evaluation_dir(run_dir)
        # the request checked before TensorFlow loads: a bad one is refused at once
        result = run_evaluate(
            run_dir, output_dir, overrides, data_file=data_file, loading=lambda: quiet_tensorflow(verbose)
        )
    if "correct" not in result:  # a Keras loss's run, or fit's: its loss and metrics
        click.echo(f"{scores_text(result, 'test')} on {result['test_examples']} examples")
        click.echo(f"written: {out_dir / 'evaluate.json'}")
        return
    click.echo(
        f"test loss {result['test_loss']:.4f}, test accuracy {result['test_accuracy']:.4f} "
        f"({result['correct']}/{result['test_examples']} correct)"
    )
    click.echo(f"written: {out_dir / 'evaluate.json'}, {out_dir / 'evaluate.png'}")


@click.command(short_help="Class probabilities, or a model's outputs, for image, .npz or raw text files.")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON document: a list of {input, prediction, probabilities}, or of {input, outputs} for a run "
    "trained with a Keras loss or by accum_train.fit, or of {input, tokens: [{position, id, token, probability}]} "
    "for a sequence output.",
)
@click.option(
    "--top",
    "top",
    type=click.IntRange(min=1),
    default=None,
    help="Classes shown per input, most probable first (at most the class count).  [default: 3; only for a run "
    "of class probabilities]",
)
@click.option(
    "--output",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write FILE.npz: 'outputs' (the class probabilities, or the output values of a run trained with a "
    "Keras loss or by accum_train.fit; 'outputs_<name>' per output of a model with several) and 'inputs' (the row "
    "names); for a sequence output also 'token_ids' and 'probabilities' per position (-1 and 0 past the padding).",
)
@click.option("--overwrite", is_flag=True, help="Replace the --output file if it exists (atomically).")
@verbose_option
def predict(run_dir, files, as_json, top, output, overwrite, verbose):
    """Class probabilities from a trained run for image files (PNG, JPEG) or .npz files (array x); the model's
    outputs, for .npz files, from a run trained with a Keras loss or a run directory of accum_train.fit. A KerasHub
    task trained on raw text reads .txt files (one text a line) or .jsonl files (one {"x": TEXT} a line) through
    its own preprocessor. A sequence output (a causal LM's logits) gives per position the most likely next token
    and its probability.

    \b
    accum-train predict runs/smoke shoe.png shirt.jpg
    accum-train predict runs/smoke images.npz --top 5
    accum-train predict runs/smoke images.npz --json
    accum-train predict runs/tagger sentences.npz --output outputs.npz
    accum-train predict runs/lora prompts.txt
    """
    quiet_tensorflow(verbose)
    with ending():
        from ..predict import check_output
        from ..predict import predict as run_predict

        if output is not None:
            check_output(output, overwrite, run_dir, files)
        rows = run_predict(run_dir, files)
        if top is not None and "outputs" in rows[0]:
            raise UserError(
                f"--top {top}: {run_dir} gives its model's outputs as they are, not class probabilities to rank: "
                "leave --top out"
            )
        if output is not None:
            _write_outputs(output, rows)
    if "tokens" in rows[0]:  # a sequence output: per position (its values only in --output)
        shown = [{k: v for k, v in row.items() if k != "outputs"} for row in rows]
        click.echo(strict_json(shown, indent=2) if as_json else format_tokens(rows))
    elif "outputs" in rows[0]:  # a Keras loss's run, or fit's: the values
        click.echo(strict_json(rows, indent=2) if as_json else format_values(rows))
    else:
        click.echo(strict_json(rows, indent=2) if as_json else format_predictions(rows, top or 3))


def _write_outputs(path: Path, rows: list) -> None:
    import numpy as np

    if "outputs" in rows[0] and isinstance(rows[0]["outputs"], dict):  # several outputs: outputs_<name>
        arrays = {f"outputs_{k}": np.array([row["outputs"][k] for row in rows], np.float32) for k in rows[0]["outputs"]}
    elif "outputs" in rows[0]:
        arrays = {"outputs": np.array([row["outputs"] for row in rows], np.float32)}
    else:
        arrays = {"outputs": np.array([list(row["probabilities"].values()) for row in rows], np.float32)}
    if "tokens" in rows[0]:  # per position: -1 and 0 past the padding
        steps = len(rows[0]["outputs"])
        arrays["token_ids"] = np.full((len(rows), steps), -1, np.int32)
        arrays["probabilities"] = np.zeros((len(rows), steps), np.float32)
        for i, row in enumerate(rows):
            for token in row["tokens"]:
                arrays["token_ids"][i, token["position"]] = token["id"]
                arrays["probabilities"][i, token["position"]] = token["probability"]
    buffer = io.BytesIO()
    np.savez(buffer, **arrays, inputs=np.array([row["input"] for row in rows]))
    atomic_write(path, buffer.getvalue())


VALUES_SHOWN = 6


def format_values(rows: list) -> str:
    """One row per input: its output values (the first VALUES_SHOWN of them)."""
    import numpy as np

    width = max(len("input"), *(len(row["input"]) for row in rows))
    lines = [f"{'input':<{width}}  outputs"]

    def shown(values) -> str:
        flat = np.asarray(values).ravel()
        return " ".join(f"{v:.4f}" for v in flat[:VALUES_SHOWN]) + (" ..." if flat.size > VALUES_SHOWN else "")

    for row in rows:
        outputs = row["outputs"]
        text = (
            "; ".join(f"{k}: {shown(v)}" for k, v in outputs.items()) if isinstance(outputs, dict) else shown(outputs)
        )
        lines.append(f"{row['input']:<{width}}  {text}")
    return "\n".join(lines)


def format_tokens(rows: list) -> str:
    """Two lines per input: its name, then per position the most likely next token (its text where the run has a
    tokenizer, else its id) and that token's probability."""
    import json

    lines = []
    for row in rows:
        shown = (f"{json.dumps(t['token']) if 'token' in t else t['id']} {t['probability']:.2f}" for t in row["tokens"])
        lines += [f"{row['input']}: most likely next token (probability) per position", "  " + ", ".join(shown)]
    return "\n".join(lines)


def format_predictions(rows: list, top: int) -> str:
    """One row per input: the predicted class, its probability, the top classes with theirs."""
    from ..predict import top_k

    k = min(top, len(rows[0]["probabilities"]))
    table = [
        (
            row["input"],
            row["prediction"],
            f"{row['probabilities'][row['prediction']]:.4f}",
            ", ".join(f"{name} {p:.4f}" for name, p in top_k(row["probabilities"], k)),
        )
        for row in rows
    ]
    header = ("input", "prediction", "probability", f"top {k}")
    widths = [max(len(header[i]), *(len(r[i]) for r in table)) for i in range(3)]
    return "\n".join(
        f"{cells[0]:<{widths[0]}}  {cells[1]:<{widths[1]}}  {cells[2]:>{widths[2]}}  {cells[3]}"
        for cells in (header, *table)
    )


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
