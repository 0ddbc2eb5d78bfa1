"""Every default of both front doors, in one place: ``CLI``, what ``accum-train run`` does with a config key left
out (each key's default, as the schema's fields take it); ``FIT``, what ``accum_train.fit`` does with an argument
left out (its signature's defaults: model.fit's own for model.fit's arguments); the constants the doors and the
trainer behind them share (the precisions, checkpoints kept and how often, micro-steps in flight under auto,
trim_padding's multiple, ...); and ``SETTINGS``, the settings both doors have, side by side, from which
scripts/defaults_table.py writes docs/doors.md's Defaults table. A leaf: it imports nothing of the package and no
TensorFlow, so the config layer, the CLI and the scripts read it at no cost."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")

# Micro-batches per update when neither subdivisions nor micro_batch_size is given: the CLI cuts its default batch
# of 500 into micro-batches of 100; fit keeps model.fit's one pass per batch, so that it is model.fit by default.
CLI_SUBDIVISIONS = 5
FIT_SUBDIVISIONS = 1
ARRAY_BATCH_SIZE = 32  # model.fit's batch_size for arrays when none is given

CHECKPOINT_KEEP = 3  # both doors: the config's checkpoint.keep, and fit's output_dir, which has no key for it
CHECKPOINT_SECONDS = 300.0  # fit: at most this much training is lost to a kill -9 between epochs
FLUSH_SECONDS = 2.0  # fit: metrics.jsonl is written at least this often (and before every checkpoint)

AUTO_PARALLEL = 2  # micro-steps in flight under auto on a CPU: the most measured to help (2 cores)
TRIM_MULTIPLE = 16  # trim_padding=True: each micro-batch's length rounded up to a multiple of this

# BatchNorm's statistics over fewer examples than this are noisy enough to hurt (the Group Normalization paper,
# Wu and He 2018, shows BatchNorm's error rising quickly below about 8 examples per batch): both doors warn.
MIN_BATCHNORM_MICRO_BATCH = 8

# Each update's noise-scale estimate weighs 1 - NOISE_DECAY in the average: about the last 1 / (1 - NOISE_DECAY)
# = 20 updates count.
NOISE_DECAY = 0.95

PREDICT_BATCH_SIZE = 256  # examples per forward pass of `accum-train predict`

SHUFFLE_BUFFER = 10_000  # data.shuffle_buffer null: a python factory's examples shuffled at once
IMAGE_CHANNELS = 3  # data.channels null: RGB, the default of keras.utils.image_dataset_from_directory
KEEP_DECODED_SHARE = 0.25  # data.keep_decoded null: decoded images kept when they take at most this share of memory

# Keras' LossScaleOptimizer's own defaults: the config's loss_scale, and fit's for a float16 model compiled
# without a LossScaleOptimizer.
LOSS_SCALE_INITIAL = 32768.0
LOSS_SCALE_GROWTH_STEPS = 2000

# The CLI's column: every config key (dotted as --set takes it) and its default. batch_schedule's entries are
# keyed batch_schedule[i].KEY, its rule's batch_schedule.KEY.
CLI = MappingProxyType(
    {
        "model.name": "seed_convnet",
        "model.width": 0.25,
        "model.norm": "batchnorm",
        "model.hidden": 256,
        "model.bn_momentum": 0.9,
        "model.groups": 8,
        "model.path": None,
        "model.from_logits": True,
        "batch_size": 500,
        "subdivisions": None,  # CLI_SUBDIVISIONS when micro_batch_size is null too
        "micro_batch_size": None,
        "batch_schedule": (),
        "batch_schedule[i].epoch": None,
        "batch_schedule[i].step": None,
        "batch_schedule[i].batch_size": None,
        "batch_schedule.rule": None,
        "batch_schedule.max_batch_size": None,
        "batch_schedule.every_epochs": 1,
        "epochs": 10,
        "seed": 0,
        "optimizer.name": "adam",
        "optimizer.learning_rate": 0.001,
        "optimizer.momentum": 0.9,
        "optimizer.clip_norm": None,
        "optimizer.schedule.name": "constant",
        "optimizer.schedule.warmup_steps": 0,
        "optimizer.schedule.decay_steps": None,
        "optimizer.schedule.decay_rate": 0.5,
        "optimizer.schedule.min_ratio": 0.0,
        "optimizer.scale_learning_rate.rule": "none",
        "optimizer.scale_learning_rate.base_batch_size": 256,
        "optimizer.weight_decay": 0.0,
        "optimizer.exclude_from_adaptation": None,
        "optimizer.trust_coefficient": 0.001,
        "data.name": "fashion_mnist",
        "data.dir": None,
        "data.path": None,
        "data.image_size": None,
        "data.channels": None,  # IMAGE_CHANNELS
        "data.keep_decoded": None,  # KEEP_DECODED_SHARE
        "data.num_classes": None,
        "data.shuffle": True,
        "data.train_limit": None,
        "data.test_limit": None,
        "data.validation": 0,
        "data.augment.flip": False,
        "data.augment.crop": 0,
        "data.trim_padding": None,
        "data.factory": None,
        "data.shuffle_buffer": None,  # SHUFFLE_BUFFER
        "data.options": None,
        "baseline": False,
        "log_every": 10,
        "checkpoint.every_steps": 0,
        "checkpoint.keep": CHECKPOINT_KEEP,
        "strategy.name": "default",
        "strategy.cpu_devices": None,
        "strategy.worker_timeout_s": 60.0,
        "max_bad_steps": 10,
        "precision": "float32",
        "loss_scale.initial": LOSS_SCALE_INITIAL,
        "loss_scale.growth_steps": LOSS_SCALE_GROWTH_STEPS,
        "parallel_micro_steps": "auto",
        "loss": None,
        "metrics": None,
        "memory_limit": None,
    }
)

# model.fit's arguments, in its order, with its defaults: fit takes them with their meaning (tests/test_defaults.py
# holds them to keras.Model.fit's signature).
MODEL_FIT = MappingProxyType(
    {
        "x": None,
        "y": None,
        "batch_size": None,  # ARRAY_BATCH_SIZE for arrays; a dataset's own batches
        "epochs": 1,
        "verbose": "auto",
        "callbacks": None,
        "validation_split": 0.0,
        "validation_data": None,
        "shuffle": True,
        "class_weight": None,
        "sample_weight": None,
        "initial_epoch": 0,
        "steps_per_epoch": None,
        "validation_steps": None,
        "validation_batch_size": None,
        "validation_freq": 1,
    }
)

# fit's column: model.fit's arguments, then its own keyword-only ones. Where model.fit has a way, these keep it:
# seed None draws the order afresh, max_bad_steps None never stops (model.fit skips nothing and never stops).
FIT = MappingProxyType(
    {
        **MODEL_FIT,
        "subdivisions": None,  # FIT_SUBDIVISIONS when micro_batch_size is None too
        "micro_batch_size": None,
        "trim_padding": False,
        "seed": None,
        "precision": None,  # the model's own dtype policy
        "strategy": None,  # the model's own
        "output_dir": None,
        "max_bad_steps": None,
        "memory_limit": None,
        "batch_schedule": None,
        "optimizer": None,  # an uncompiled model: the config's optimizer.name
        "learning_rate": None,  # an uncompiled model: the config's optimizer.learning_rate
    }
)


@dataclass(frozen=True)
class Setting:
    """A setting both doors have, as docs/doors.md's Defaults table shows it: the config key and fit's argument
    that set it (None: the door has neither, and the text alone says what it does), and what each door does when
    it is left out, said after its value. ``model_fit``: fit's default is model.fit's convention."""

    setting: str
    key: str | None
    cli: str
    argument: str | None
    fit: str
    model_fit: bool = False


SETTINGS = (
    Setting(
        "batch size", "batch_size", "", "batch_size", f"{ARRAY_BATCH_SIZE} for arrays; a dataset's own batches", True
    ),
    Setting(
        "micro-batches per update",
        "subdivisions",
        f"{CLI_SUBDIVISIONS} (when `micro_batch_size` is null too)",
        "subdivisions",
        "one pass per update (when `micro_batch_size` is None too)",
        True,
    ),
    Setting("epochs", "epochs", "", "epochs", "", True),
    Setting(
        "seed",
        "seed",
        "the same weights and order every run",
        "seed",
        "the order drawn afresh, no global random state touched",
        True,
    ),
    Setting("shuffle", "data.shuffle", "", "shuffle", "", True),
    Setting("validation", "data.validation", "no examples held out", "validation_split", "none held out", True),
    Setting(
        "stop after non-finite updates in a row",
        "max_bad_steps",
        "",
        "max_bad_steps",
        "never stops, each such update skipped",
        True,
    ),
    Setting(
        "micro-steps at once",
        "parallel_micro_steps",
        f"{AUTO_PARALLEL} on a CPU without a GPU when k > 1 and no memory_limit is set, else 1",
        None,
        "the same rule; always one under XLA",
    ),
    Setting("precision", "precision", "", "precision", "the model's own dtype policy"),
    Setting(
        "first loss scale (mixed_float16)",
        "loss_scale.initial",
        f"growing every {LOSS_SCALE_GROWTH_STEPS} applied updates",
        None,
        f"a compiled LossScaleOptimizer's own, else {LOSS_SCALE_INITIAL:g}, growing every {LOSS_SCALE_GROWTH_STEPS}",
    ),
    Setting("memory limit", "memory_limit", "none", "memory_limit", "none"),
    Setting(
        "trim_padding",
        "data.trim_padding",
        "off (a number: the multiple lengths are rounded up to)",
        "trim_padding",
        f"off (True: lengths rounded up to a multiple of {TRIM_MULTIPLE})",
    ),
    Setting("batch schedule", "batch_schedule", "batch_size throughout", "batch_schedule", "batch_size throughout"),
    Setting(
        "optimizer",
        "optimizer.name",
        "",
        "optimizer",
        f"the compiled one (an uncompiled model: {CLI['optimizer.name']})",
    ),
    Setting(
        "learning rate",
        "optimizer.learning_rate",
        "",
        "learning_rate",
        f"the compiled optimizer's (an uncompiled model: {CLI['optimizer.learning_rate']:g})",
    ),
    Setting("distribution", "strategy.name", "one device", "strategy", "the model's own", True),
    Setting("run directory", None, "`--output-dir`: runs/CONFIG-DATE-TIME", "output_dir", "nothing kept on disk"),
    Setting("checkpoints kept", "checkpoint.keep", "", None, f"{CHECKPOINT_KEEP} (with `output_dir`)"),
    Setting(
        "checkpoint every",
        "checkpoint.every_steps",
        "epoch ends only",
        None,
        f"each epoch's end and every {CHECKPOINT_SECONDS:g} s of training (with `output_dir`)",
    ),
    Setting(
        "metrics.jsonl written",
        "log_every",
        "every that many updates, and before each checkpoint",
        None,
        f"at least every {FLUSH_SECONDS:g} s, and before each checkpoint (with `output_dir`)",
    ),
)
