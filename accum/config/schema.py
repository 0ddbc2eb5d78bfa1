"""The config's schema: the frozen ``Config``, its top-level keys with their defaults (accum/defaults.py's
``CLI``), ranges and help texts, the nested sections it holds (sections.py) and what is computed from its keys (the
batch's micro-batches, the run's length, the YAML it writes back).

The help texts are the key reference (``docs/configuration.md`` is generated from them, starting here)."""

from __future__ import annotations

import dataclasses

import yaml

from ..defaults import AUTO_PARALLEL, CLI_SUBDIVISIONS, PRECISIONS
from ..errors import ConfigError
from ..trainer.data.batching import k_for_micro_batch, largest_micro_batch
from .sections import (
    ALL,
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    BatchChange,
    BatchRule,
    CheckpointConfig,
    DataConfig,
    LossScaleConfig,
    ModelConfig,
    OptimizerConfig,
    StrategyConfig,
    _spec,
    section,
)
from .wording import parse_size


@section("")
class Config:
    model: ModelConfig = _spec(default_factory=ModelConfig, help="the network")
    batch_size: int | str = _spec(
        minimum=1,
        maximum=MAX_BATCH_SIZE,
        choices="all",
        help="examples per update (the large batch); the first of batch_schedule; all: the whole training set "
        "as one batch (batch gradient descent), resolved when the data are loaded",
    )
    subdivisions: int | str | None = _spec(
        minimum=1,
        maximum=MAX_BATCH_SIZE,
        choices="auto",
        help=f"micro-batches per update; sizes differ by at most one; auto: the fewest that fit (measured under "
        f"memory_limit; doubled when an update runs out of memory); null: from micro_batch_size "
        f"({CLI_SUBDIVISIONS} when neither is given)",
    )
    micro_batch_size: int | None = _spec(
        minimum=1,
        maximum=MAX_BATCH_SIZE,
        help="instead of subdivisions: the most examples a device computes at once (what fits); "
        "k = ceil(batch_size / micro_batch_size) per device, and again at each batch_schedule change",
    )
    batch_schedule: tuple[BatchChange, ...] | BatchRule = _spec(
        choices="schedule",
        help="batch sizes that change during the run, keyed by epoch or by step: "
        "[{epoch: 1, batch_size: 500}, {epoch: 6, batch_size: 2000}]; or a rule that grows the batch as "
        "training goes: {rule: noise_scale, max_batch_size: 16000} (needs micro_batch_size)",
    )
    epochs: int = _spec(minimum=1, maximum=MAX_EPOCHS, help="passes over the training set")
    seed: int = _spec(minimum=0, maximum=2**31 - 1, help="weights and data order")
    optimizer: OptimizerConfig = _spec(default_factory=OptimizerConfig, help="the optimizer")
    data: DataConfig = _spec(default_factory=DataConfig, help="the dataset")
    baseline: bool = _spec(help="true: plain optimizer on the whole batch, no cache")
    log_every: int = _spec(minimum=1, help="updates between progress and TensorBoard writes")
    checkpoint: CheckpointConfig = _spec(default_factory=CheckpointConfig, help="checkpointing")
    strategy: StrategyConfig = _spec(default_factory=StrategyConfig, help="tf.distribute strategy")
    max_bad_steps: int = _spec(
        minimum=1, help="stop after this many updates in a row skipped for a non-finite loss or gradient"
    )
    precision: str = _spec(
        choices=PRECISIONS,
        help="float32 | mixed_bfloat16 | mixed_float16: compute in 16 bits, with weights, "
        "gradient cache and optimizer state in float32",
    )
    loss_scale: LossScaleConfig = _spec(
        default_factory=LossScaleConfig, help="mixed_float16 only: one dynamic loss scale per update"
    )
    parallel_micro_steps: int | str = _spec(
        minimum=1,
        maximum=64,
        choices="auto",
        help="micro-batches computed at once, each on its share of the CPU cores (memory then holds this "
        f"many); auto: {AUTO_PARALLEL} on a machine without a GPU when subdivisions > 1 and no memory_limit is set "
        "(measured faster there), else 1",
    )
    loss: str | dict | None = _spec(
        choices="loss",
        help="keras_file only: the loss, as Keras names it (mse, huber, binary_crossentropy, ...) or "
        "package.module:function; per output a mapping {output name: loss}; null: the file's compile() loss, "
        "else sparse cross-entropy on class labels (the built-in nets always train with that)",
    )
    metrics: tuple[str, ...] | dict | None = _spec(
        choices="metrics",
        help="keras_file only: metrics as Keras names them ([mae], [accuracy, auc]); per output a mapping "
        "{output name: [metric, ...]}; null: the file's compile() metrics",
    )
    memory_limit: str | None = _spec(
        choices="size",
        help="stop a run whose TensorFlow allocator peak exceeds this (e.g. 2GiB): a smaller device, simulated",
    )

    @property
    def memory_limit_bytes(self) -> int | None:
        return None if self.memory_limit is None else parse_size(self.memory_limit, "memory_limit")

    def subdivisions_for(self, batch_size: int, replicas: int = 1) -> int | str:
        """k for a batch of ``batch_size`` on ``replicas``: each replica cuts its share into this many micro-batches
        (micro_batch_size: the fewest that keep each within it; subdivisions: as given; auto: "auto")."""
        if self.micro_batch_size is None:
            return self.subdivisions
        return k_for_micro_batch(batch_size, self.micro_batch_size, replicas)

    @property
    def largest_micro_batch(self) -> int:
        """The largest micro-batch of the first batch on one device: what memory has to hold."""
        if self.auto_subdivisions:
            raise ValueError("subdivisions=auto has no micro-batch size until the run measures one")
        return largest_micro_batch(self.batch_size, 1, self.subdivisions_for(self.batch_size))

    @property
    def auto_subdivisions(self) -> bool:
        return self.subdivisions == "auto"

    @property
    def whole_set(self) -> bool:
        """batch_size: all, before the data are loaded (``for_data``)."""
        return self.batch_size == ALL

    def for_data(self, train_examples: int) -> Config:
        """batch_size: all made the training set's size (everything else as it is); every batch size checked
        against it (0: a run rebuilt without its training set, nothing to check)."""
        if self.whole_set:
            return dataclasses.replace(self, batch_size=train_examples)
        n = train_examples
        if self.batch_size > n > 0:
            raise ConfigError(
                f"batch_size={self.batch_size} is more than the {n} training examples: lower it, or set "
                f"batch_size: all to train on the whole training set as one batch"
            )
        rule = self.batch_rule
        if rule is not None and rule.max_batch_size > n > 0:
            raise ConfigError(
                f"batch_schedule: max_batch_size={rule.max_batch_size} is more than the {n} training examples: lower it"
            )
        for change in self.batch_changes:
            if change.batch_size > n > 0:
                start = f"epoch {change.epoch}" if change.epoch is not None else f"step {change.step}"
                raise ConfigError(
                    f"batch_schedule: batch_size={change.batch_size} (from {start}) is more than the {n} training "
                    f"examples: lower it"
                )
        return self

    @property
    def batch_rule(self) -> BatchRule | None:
        """batch_schedule given as a rule ({rule: noise_scale, ...}), else None."""
        return self.batch_schedule if isinstance(self.batch_schedule, BatchRule) else None

    @property
    def batch_changes(self) -> tuple[BatchChange, ...]:
        """batch_schedule given as a list of changes; () for none or a rule."""
        return () if self.batch_rule is not None else self.batch_schedule

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Every batch size the run uses: batch_size, then batch_schedule's (a rule's: the largest it may reach)."""
        if self.batch_rule is not None:
            return (self.batch_size, self.batch_rule.max_batch_size or self.batch_size)
        return (self.batch_size, *(change.batch_size for change in self.batch_schedule))

    def with_decay_steps(self, decay_steps: int | None) -> Config:
        schedule = dataclasses.replace(self.optimizer.schedule, decay_steps=decay_steps)
        return dataclasses.replace(self, optimizer=dataclasses.replace(self.optimizer, schedule=schedule))

    def resolved(self, total_steps: int) -> Config:
        """Fix what is computed from the run's length when the run starts.

        A decaying schedule with decay_steps null decays over the whole run
        (after warm-up). The length is resolved here and written into the
        run's config.yaml, so a run resumed with more epochs keeps the curve
        it started on instead of silently bending it."""
        schedule = self.optimizer.schedule
        if schedule.name == "constant" or schedule.decay_steps is not None:
            return self
        return self.with_decay_steps(max(1, total_steps - schedule.warmup_steps))

    def to_dict(self) -> dict:
        # YAML's safe dumper has no tuples (data.image_size): write them as lists.
        return dataclasses.asdict(
            self,
            dict_factory=lambda items: {
                key: list(value) if isinstance(value, tuple) else value for key, value in items
            },
        )

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
