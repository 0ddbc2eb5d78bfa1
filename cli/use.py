"""``accum-train plan``, ``evaluate`` and ``predict``: before and after training.

``plan`` shows what a config will do without training (the split of each
batch, the updates, the learning rate, warnings); ``evaluate`` measures a
trained run on its test data and draws its confusion matrix; ``predict``
gives class probabilities for image or .npz files. Both read a run directory
of accum_train.fit(output_dir=...) too: evaluate on the arrays of ``--data``,
predict the model's outputs. The work is in the core
(accum_train.plan, .evaluate, .predict); this module parses flags and
formats the results. Errors follow the rest of the tool: one line, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..config import load_config
from ..errors import UserError
from ..files import strict_json
from ..outcome import ending, scores_text
from ..quiet import quiet_tensorflow
from ..text import counted, shape_text, size_text
from .common import output_dir_option, set_option, verbose_option

LABEL_WIDTH = 15
CLASS_NAMES_SHOWN = 5


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


def _row(label: str, text: str) -> str:
    return f"{label:<{LABEL_WIDTH}}{text}"


def _split_text(n: int, micro_batches) -> str:
    """'64 = 1 x 12 + 4 x 13': counts and sizes of the micro-batches of a batch of n."""
    return f"{n} = " + " + ".join(f"{count} x {size}" for count, size in micro_batches)


def _rate(value: float) -> str:
    return f"{value:.4g}"


def _loss_text(losses: list) -> str:
    """'huber_loss' for one output; 'mse (price, weight 1.0) + ...' per output."""
    if len(losses) == 1 and losses[0]["weight"] is None:
        return losses[0]["loss"]
    return " + ".join(
        f"{entry['loss']} ({entry['output']}" + (f", weight {entry['weight']:g})" if entry["weight"] else ")")
        for entry in losses
    )


def format_plan(result: dict) -> str:
    data, model, rate = result["data"], result["model"], result["learning_rate"]
    names = data["class_names"]
    shown = ", ".join(names[:CLASS_NAMES_SHOWN]) + (", ..." if len(names) > CLASS_NAMES_SHOWN else "")
    layers = model["batchnorm_layers"]
    norm = f", {counted(layers, 'BatchNorm layer')}" if layers else ", no BatchNorm"
    name = f"{model['name']} {model['path']}" if model["path"] else model["name"]
    cache = model["gradient_cache_bytes"]
    lines = [
        _row("data", f"{data['name']}, {data['source']}"),
        _row(
            "examples",
            f"{data['train_examples']} train, "
            + (f"{data['validation_examples']} validation (held out of train), " if data["validation_examples"] else "")
            + f"{data['test_examples']} test",
        ),
        _row("input", shape_text(data["input_shape"])),
        *([_row("classes", f"{data['num_classes']}: {shown}")] if data["num_classes"] else []),
        _row("model", f"{name}, {model['trainable_parameters']} trainable parameters{norm}"),
        *([_row("cache", f"{size_text(cache)} in float32 (the gradient cache)")] if cache else []),
        _row("loss", _loss_text(result["loss"])),
        _row("metrics", ", ".join(result["metrics"]) or "none"),
        _row(
            "batch_size",
            f"{result['batch_size']} examples per update"
            + (" (all: the whole training set as one batch)" if result.get("whole_training_set") else ""),
        ),
    ]
    full, last = result["full_batch"], result["last_batch"]
    if result["baseline"]:
        lines.append(_row("micro-batches", "none: baseline=true runs each batch whole, no gradient cache"))
    elif full["micro_batches"] is None:
        lines.append(
            _row(
                "micro-batches",
                f"chosen when the run starts (subdivisions=auto, memory_limit={result['memory_limit']})",
            )
        )
    else:
        given = (
            f"micro_batch_size={result['micro_batch_size']}: subdivisions={result['subdivisions']}"
            if result["micro_batch_size"]
            else f"subdivisions={result['subdivisions']}"
        )
        lines.append(_row("micro-batches", f"{_split_text(full['size'], full['micro_batches'])} ({given})"))
    if not result["baseline"] and result["parallel_micro_steps"] > 1:
        lines.append(
            _row(
                "in flight",
                f"{result['parallel_micro_steps']} micro-batches at once (parallel_micro_steps; "
                f"memory holds {result['parallel_micro_steps']})",
            )
        )
    augment = [
        text
        for on, text in (
            (data["augment"]["flip"], "flip"),
            (data["augment"]["crop"], f"crop {data['augment']['crop']}"),
        )
        if on
    ]
    if augment:
        lines.append(_row("augment", ", ".join(augment) + " (training images, drawn from seed and update)"))
    if data["trim_padding"]:
        lines.append(
            _row(
                "trim_padding",
                f"each batch ordered by length, each micro-batch cut after its longest sequence (a multiple of "
                f"{data['trim_padding']} steps)",
            )
        )
    if result["phases"]:
        lines.append(_row("updates", f"{result['total_updates']} in {counted(result['epochs'], 'epoch')}"))
        for phase in result["phases"]:
            micro = "one pass" if result["baseline"] else f"k={phase['subdivisions']} of <={phase['micro_batch']}"
            lines.append(
                _row(
                    "batch phase",
                    f"from update {phase['update']} (epoch {phase['epoch']}): batch_size {phase['batch_size']} "
                    f"({micro}), {phase['updates_per_epoch']} updates per epoch, "
                    + (f"the last of {phase['last_batch']} examples, " if phase["last_batch"] else "")
                    + f"learning rate {_rate(phase['learning_rate'])}",
                )
            )
    else:
        rule = result["noise_scale"]["rule"]
        lines.append(
            _row(
                "updates",
                f"{result['updates_per_epoch']} per epoch x {counted(result['epochs'], 'epoch')} = "
                f"{result['total_updates']}" + (" at most (fewer as the batch grows)" if rule else ""),
            )
        )
    if result["phases"]:
        pass  # each phase's line says its last batch
    elif last is None:
        lines.append(
            _row(
                "last batch", f"none: every batch is full ({data['train_examples']} = {full['count']} x {full['size']})"
            )
        )
    else:
        split = (
            f": {_split_text(last['size'], last['micro_batches'])}"
            if last["micro_batches"] and not result["baseline"]
            else ""
        )
        only = " (the only batch)" if not full["count"] else ""
        lines.append(_row("last batch", f"{last['size']} examples{only}{split}"))
    schedule = rate["schedule"]
    settings = [f"{key}={rate[key]}" for key in ("warmup_steps", "decay_steps") if rate[key]]
    scaled = rate["scaled"]
    lines.append(
        _row(
            "optimizer",
            f"{rate['optimizer']}, learning_rate {rate['peak']:g}"
            + (
                f" at batch {scaled['base_batch_size']}, {_rate(scaled['peak'])} at batch_size "
                f"{result['batch_size']} ({scaled['rule']} rule)"
                if scaled
                else ""
            )
            + f", schedule {schedule}"
            + (f" ({', '.join(settings)})" if settings else ""),
        )
    )
    if result["noise_scale"]["rule"]:  # the batches, and so the scaled rates, come as the run measures
        first = rate["first"]
        grows = f"scaled by the {scaled['rule']} rule to the batch in force" if scaled else "whatever the batch"
        lines.append(_row("learning rate", f"{_rate(first['value'])} at update 1 (first), then {grows}"))
    elif schedule == "constant" and not rate["warmup_steps"] and not result["phases"]:
        lines.append(_row("learning rate", f"{_rate(rate['first']['value'])} throughout"))
    else:
        points = [(rate["first"], "first")]
        if rate["warmup_end"]:
            points.append((rate["warmup_end"], "end of warm-up"))
        points.append((rate["last"], "last"))
        lines.append(
            _row(
                "learning rate",
                ", ".join(f"{_rate(p['value'])} at update {p['update']} ({what})" for p, what in points),
            )
        )
    lines += _noise_lines(result)
    lines += [f"warning: {text}" for text in result["warnings"]]
    return "\n".join(lines)


def _noise_lines(result: dict) -> list[str]:
    """The gradient noise scale's measurement, and batch_schedule's rule that follows it."""
    noise = result["noise_scale"]
    if not noise["measured"]:
        if result["data"]["trim_padding"] and not result["baseline"]:
            why = "data.trim_padding orders each batch by length (the estimate needs micro-batches drawn at random)"
        else:
            why = "baseline=true has no micro-batches" if result["baseline"] else "each update is one micro-batch"
            why += " (the estimate needs two or more)"
        return [_row("noise scale", f"none: {why}")]
    lines = [
        _row(
            "noise scale",
            f"measured each update from its micro-batches (exponential average, decay {noise['decay']:g} per update)",
        )
    ]
    rule = noise["rule"]
    if rule:
        scaled = result["learning_rate"]["scaled"]
        every = "each epoch's end" if rule["every_epochs"] == 1 else f"the end of every {rule['every_epochs']} epochs"
        lines.append(
            _row(
                "batch rule",
                f"{rule['rule']}: at {every} the batch becomes the noise scale in whole micro-batches of "
                f"{rule['micro_batch_size']}, from {result['batch_size']} up to {rule['max_batch_size']}; "
                + (f"learning rate by the {scaled['rule']} rule" if scaled else "learning rate unscaled"),
            )
        )
    return lines


@click.command(short_help="Test loss, accuracy and confusion matrix of a trained run.")
@click.argument("run_dir", type=click.Path(path_type=Path))
@set_option("Change the test data (data.* keys only), e.g. --set data.test_limit=1000")
@click.option(
    "--data",
    "data_file",
    type=click.Path(path_type=Path),
    default=None,
    help="A run directory of accum_train.fit: the .npz to evaluate on (arrays x and y, optionally sample_weight).",
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
    """
    quiet_tensorflow(verbose)
    with ending():
        from ..evaluate import evaluate as run_evaluate
        from ..evaluate import evaluation_dir

        out_dir = Path(output_dir) if output_dir else evaluation_dir(run_dir)
        result = run_evaluate(run_dir, output_dir, overrides, data_file=data_file)
    if "correct" not in result:  # a Keras loss's run, or fit's: its loss and metrics
        click.echo(f"{scores_text(result, 'test')} on {result['test_examples']} examples")
        click.echo(f"written: {out_dir / 'evaluate.json'}")
        return
    click.echo(
        f"test loss {result['test_loss']:.4f}, test accuracy {result['test_accuracy']:.4f} "
        f"({result['correct']}/{result['test_examples']} correct)"
    )
    click.echo(f"written: {out_dir / 'evaluate.json'}, {out_dir / 'evaluate.png'}")


@click.command(short_help="Class probabilities for image or .npz files from a trained run.")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON document: a list of {input, prediction, probabilities}, or of {input, outputs} for a run "
    "trained with a Keras loss or by accum_train.fit.",
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
    "names).",
)
@click.option("--overwrite", is_flag=True, help="Replace the --output file if it exists (atomically).")
@verbose_option
def predict(run_dir, files, as_json, top, output, overwrite, verbose):
    """Class probabilities from a trained run for image files (PNG, JPEG) or .npz files (array x); the model's
    outputs, for .npz files, from a run trained with a Keras loss or a run directory of accum_train.fit.

    \b
    accum-train predict runs/smoke shoe.png shirt.jpg
    accum-train predict runs/smoke images.npz --top 5
    accum-train predict runs/smoke images.npz --json
    accum-train predict runs/tagger sentences.npz --output outputs.npz
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
    if "outputs" in rows[0]:  # a Keras loss's run, or fit's: the values
        click.echo(strict_json(rows, indent=2) if as_json else format_values(rows))
    else:
        click.echo(strict_json(rows, indent=2) if as_json else format_predictions(rows, top or 3))


def _write_outputs(path: Path, rows: list) -> None:
    import io

    import numpy as np

    from ..files import atomic_write

    if "outputs" in rows[0] and isinstance(rows[0]["outputs"], dict):  # several outputs: outputs_<name>
        arrays = {f"outputs_{k}": np.array([row["outputs"][k] for row in rows], np.float32) for k in rows[0]["outputs"]}
    elif "outputs" in rows[0]:
        arrays = {"outputs": np.array([row["outputs"] for row in rows], np.float32)}
    else:
        arrays = {"outputs": np.array([list(row["probabilities"].values()) for row in rows], np.float32)}
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
    lines = []
    for cells in (header, *table):
        lines.append(f"{cells[0]:<{widths[0]}}  {cells[1]:<{widths[1]}}  {cells[2]:>{widths[2]}}  {cells[3]}")
    return "\n".join(lines)
