"""``accum-train plan``'s text: one labelled row per fact of the plan (accum_train.plan's dict), then its
warnings."""

from __future__ import annotations

from ..text import counted, shape_text, size_text

LABEL_WIDTH = 15
CLASS_NAMES_SHOWN = 5


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

    def add(label: str, text: str) -> None:
        lines.append(_row(label, text))

    if result["baseline"]:
        add("micro-batches", "none: baseline=true runs each batch whole, no gradient cache")
    elif full["micro_batches"] is None:
        add("micro-batches", f"chosen when the run starts (subdivisions=auto, memory_limit={result['memory_limit']})")
    else:
        given = f"subdivisions={result['subdivisions']}"
        if result["micro_batch_size"]:
            given = f"micro_batch_size={result['micro_batch_size']}: {given}"
        add("micro-batches", f"{_split_text(full['size'], full['micro_batches'])} ({given})")
    if not result["baseline"] and result["parallel_micro_steps"] > 1:
        add(
            "in flight",
            f"{result['parallel_micro_steps']} micro-batches at once (parallel_micro_steps; "
            f"memory holds {result['parallel_micro_steps']})",
        )
    flip, crop = data["augment"]["flip"], data["augment"]["crop"]
    augment = [text for on, text in ((flip, "flip"), (crop, f"crop {crop}")) if on]
    if augment:
        add("augment", ", ".join(augment) + " (training images, drawn from seed and update)")
    if data["trim_padding"]:
        add(
            "trim_padding",
            f"each batch ordered by length, each micro-batch cut after its longest sequence (a multiple of "
            f"{data['trim_padding']} steps)",
        )
    if result["phases"]:  # each phase's line says its last batch
        add("updates", f"{result['total_updates']} in {counted(result['epochs'], 'epoch')}")
        for phase in result["phases"]:
            micro = "one pass" if result["baseline"] else f"k={phase['subdivisions']} of <={phase['micro_batch']}"
            add(
                "batch phase",
                f"from update {phase['update']} (epoch {phase['epoch']}): batch_size {phase['batch_size']} "
                f"({micro}), {phase['updates_per_epoch']} updates per epoch, "
                + (f"the last of {phase['last_batch']} examples, " if phase["last_batch"] else "")
                + f"learning rate {_rate(phase['learning_rate'])}",
            )
    else:
        rule = result["noise_scale"]["rule"]
        add(
            "updates",
            f"{result['updates_per_epoch']} per epoch x {counted(result['epochs'], 'epoch')} = "
            f"{result['total_updates']}" + (" at most (fewer as the batch grows)" if rule else ""),
        )
        if last is None:
            add(
                "last batch", f"none: every batch is full ({data['train_examples']} = {full['count']} x {full['size']})"
            )
        else:
            split = (
                f": {_split_text(last['size'], last['micro_batches'])}"
                if last["micro_batches"] and not result["baseline"]
                else ""
            )
            only = " (the only batch)" if not full["count"] else ""
            add("last batch", f"{last['size']} examples{only}{split}")
    schedule = rate["schedule"]
    settings = [f"{key}={rate[key]}" for key in ("warmup_steps", "decay_steps") if rate[key]]
    scaled = rate["scaled"]
    add(
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
    if result["noise_scale"]["rule"]:  # the batches, and so the scaled rates, come as the run measures
        first = rate["first"]
        grows = f"scaled by the {scaled['rule']} rule to the batch in force" if scaled else "whatever the batch"
        add("learning rate", f"{_rate(first['value'])} at update 1 (first), then {grows}")
    elif schedule == "constant" and not rate["warmup_steps"] and not result["phases"]:
        add("learning rate", f"{_rate(rate['first']['value'])} throughout")
    else:
        points = [(rate["first"], "first")]
        if rate["warmup_end"]:
            points.append((rate["warmup_end"], "end of warm-up"))
        points.append((rate["last"], "last"))
        add("learning rate", ", ".join(f"{_rate(p['value'])} at update {p['update']} ({what})" for p, what in points))
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
