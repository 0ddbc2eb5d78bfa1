"""What a config's settings do badly, in the config's own keys: ``accum-train plan`` lists them and a run says
them as it starts (lifecycle.py). The trainer's own lines (trainer/) name no key.
"""

from __future__ import annotations

from ..trainer.data.order import MIN_BATCHNORM_MICRO_BATCH, noisy_batchnorm


def split_warnings(cfg, k: int | None, n_train: int, batchnorm_layers: int, total_updates: int) -> list[str]:
    """Settings that train badly, as ``accum-train plan`` lists them and a run says them as it starts: ``k``
    micro-batches per batch (None: whole batches, the baseline's, or subdivisions=auto's not chosen yet); one
    device's view (plan says so of a strategy)."""
    warnings = []
    rest = n_train % cfg.batch_size
    if k is not None and rest and rest < k:
        warnings.append(
            f"subdivisions={k} is more than the {rest} examples of each epoch's last batch: that batch runs as "
            f"{rest} micro-batches of 1"
        )
    if k is not None and batchnorm_layers:
        fix = (
            "replace the model file's BatchNormalization layers (e.g. by GroupNormalization)"
            if cfg.model.name == "keras_file"
            else "set model.norm=groupnorm or model.norm=none"
        )
        smallest, last = noisy_batchnorm(cfg.batch_size, k), noisy_batchnorm(rest, k)
        if cfg.batch_size <= n_train and smallest:
            warnings.append(
                f"micro-batches of {smallest} examples (under {MIN_BATCHNORM_MICRO_BATCH}) give BatchNorm noisy "
                f"statistics: {fix}, or use fewer subdivisions"
            )
        elif last:
            warnings.append(
                f"the last batch of each epoch ({rest} examples) has micro-batches of {last} "
                f"(under {MIN_BATCHNORM_MICRO_BATCH}), which give BatchNorm noisy statistics: {fix}, or use a "
                "training set that batch_size divides (data.train_limit)"
            )
    warmup = cfg.optimizer.schedule.warmup_steps
    if warmup > total_updates:
        warnings.append(
            f"optimizer.schedule.warmup_steps={warmup} is more than the run's {total_updates} updates: the learning "
            f"rate never reaches {cfg.optimizer.learning_rate:g}"
        )
    return warnings
