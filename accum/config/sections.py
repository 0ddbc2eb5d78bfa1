"""The config's sections: the registries of names its choices may take, the limits of its sizes and counts, and
``_spec``, the field that carries a key's range, choices and help text, and ``section``, which gives each key its
default from accum/defaults.py's ``CLI``; with them the keys of each nested section (model, optimizer and its
schedule, batch_schedule's changes and rule, data and its augmentation, strategy, loss_scale, checkpoint) as frozen
dataclasses, which schema.py's ``Config`` holds.

The registries name what each choice may be, and their implementations check at import that they implement
exactly these."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..defaults import CLI, IMAGE_CHANNELS, SHUFFLE_BUFFER

# Registries. The implementations live in models/, optim.py and the datasets
# package; each checks at import that it implements exactly these names, so a
# config that validates here always finds its implementation.
MODEL_NAMES = ("seed_convnet", "mlp", "keras_file")
NORM_NAMES = ("batchnorm", "groupnorm", "none")
OPTIMIZER_NAMES = ("adam", "sgd", "momentum", "rmsprop", "lars", "lamb")
SCALE_RULES = ("none", "linear", "sqrt")
SCHEDULE_NAMES = ("constant", "cosine", "exponential")
DATASET_NAMES = ("fashion_mnist", "npz", "image_folder", "python")
STRATEGY_NAMES = ("default", "mirrored", "multi_worker")
BATCH_RULES = ("noise_scale",)

# Large enough for any real run, small enough that a typo like 5e9 is caught
# before it allocates anything.
MAX_BATCH_SIZE = 1_000_000
ALL = "all"  # batch_size: all, the whole training set as one batch
MAX_EPOCHS = 100_000


def _spec(
    *,
    help: str,
    minimum=None,
    maximum=None,
    choices=None,
    exclusive_min=False,
    default_factory=dataclasses.MISSING,
):
    meta = {"help": help, "min": minimum, "max": maximum, "choices": choices, "exclusive_min": exclusive_min}
    return field(default_factory=default_factory, metadata=meta)  # a key's default: ``section`` sets it


def section(prefix: str):
    """A frozen dataclass of the config's keys under ``prefix`` (``model.``; "" for the top level): each field that
    is not a nested section takes its default from accum/defaults.py's ``CLI`` by its dotted key, so that the table
    holds every default and no field spells one."""

    def make(cls):
        for name in cls.__annotations__:
            spec = vars(cls)[name]
            if spec.default_factory is dataclasses.MISSING:
                spec.default = CLI[prefix + name]
        return dataclass(frozen=True)(cls)

    return make


# seed_convnet's channels at width 1.0 (the TensorFlow backend's builtin.py builds from them; groupnorm's groups
# are checked against them).
SEED_CHANNELS = (128, 256, 384, 512, 640)


@section("model.")
class ModelConfig:
    name: str = _spec(
        choices=MODEL_NAMES,
        help="seed_convnet: the seed's 5-conv net; mlp: a small dense net; "
        "keras_file: your own Keras 3 model from model.path",
    )
    width: float = _spec(
        minimum=0.0,
        exclusive_min=True,
        maximum=8.0,
        help="channel multiplier of seed_convnet (1.0 = 128..640 channels)",
    )
    norm: str = _spec(
        choices=NORM_NAMES,
        help="seed_convnet and mlp: batchnorm after each conv (hidden layer), groupnorm "
        "(per example: micro-batch independent), or none",
    )
    hidden: int = _spec(minimum=1, maximum=65536, help="hidden units of mlp")
    bn_momentum: float = _spec(
        minimum=0.0,
        maximum=1.0,
        help="norm=batchnorm: share of the moving statistics kept at each update (moving = moving * m + "
        "batch * (1 - m)); they move once per update, so with few updates (a large batch) lower it, "
        "e.g. 0.9 ** (batch_size / 500) keeps the horizon of 0.9 at batch 500",
    )
    groups: int = _spec(
        minimum=1, maximum=65536, help="norm=groupnorm: channel groups; must divide every normalised layer's channels"
    )
    path: str | None = _spec(
        help="keras_file: a .keras file written by model.save() (loaded with "
        "safe_mode=True: no Lambda layers or custom code); a relative path is read from the working directory, "
        "else from the config file's folder"
    )
    from_logits: bool = _spec(
        help="keras_file with the built-in loss: true if the model outputs logits, false if it ends "
        "in a softmax (trained on the logits under it; export keeps it)"
    )

    @property
    def norm_channels(self) -> tuple[int, ...]:
        """Channels of each layer the built-in model normalises (groupnorm's groups must divide them)."""
        if self.name == "seed_convnet":
            return tuple(max(1, round(c * self.width)) for c in SEED_CHANNELS)
        if self.name == "mlp":
            return (self.hidden,)
        return ()


@section("optimizer.schedule.")
class ScheduleConfig:
    name: str = _spec(choices=SCHEDULE_NAMES, help="learning-rate schedule, counted in updates (steps)")
    warmup_steps: int = _spec(minimum=0, help="linear warm-up from 0, in updates")
    decay_steps: int | None = _spec(
        minimum=1, help="cosine: length (default: the whole run); exponential: updates per factor decay_rate"
    )
    decay_rate: float = _spec(minimum=0.0, exclusive_min=True, maximum=1.0, help="exponential: factor per decay_steps")
    min_ratio: float = _spec(minimum=0.0, maximum=1.0, help="cosine: final learning rate as a fraction of the peak")


@section("optimizer.scale_learning_rate.")
class ScaleConfig:
    rule: str = _spec(
        choices=SCALE_RULES,
        help="none: the rate as given; linear: rate x batch_size / base_batch_size (Goyal et al. 2017); "
        "sqrt: rate x (batch_size / base_batch_size) ** 0.5; with batch_schedule, the batch in force",
    )
    base_batch_size: int = _spec(
        minimum=1, maximum=MAX_BATCH_SIZE, help="the batch size optimizer.learning_rate is meant for"
    )

    def factor(self, batch_size: int) -> float:
        """What the configured rate is multiplied by at ``batch_size``."""
        power = {"none": 0.0, "linear": 1.0, "sqrt": 0.5}[self.rule]
        return 1.0 if power == 0.0 else (batch_size / self.base_batch_size) ** power


# Keys only the layer-wise adaptive optimizers read (lars, lamb): refused for the others, whose
# update they would not change.
ADAPTIVE_KEYS = ("weight_decay", "exclude_from_adaptation", "trust_coefficient")


@section("optimizer.")
class OptimizerConfig:
    name: str = _spec(
        choices=OPTIMIZER_NAMES,
        help="adam | sgd | momentum | rmsprop; lars: momentum SGD with a layer-wise trust ratio (You et al. "
        "2017); lamb: Adam with a layer-wise trust ratio (You et al. 2019)",
    )
    learning_rate: float = _spec(
        minimum=0.0,
        exclusive_min=True,
        maximum=100.0,
        help="peak learning rate (for scale_learning_rate.base_batch_size when scale_learning_rate.rule is set)",
    )
    momentum: float = _spec(minimum=0.0, maximum=1.0, help="momentum (momentum, lars) or rho (rmsprop)")
    clip_norm: float | None = _spec(
        minimum=0.0, exclusive_min=True, help="clip the accumulated gradient to this global norm"
    )
    schedule: ScheduleConfig = _spec(default_factory=ScheduleConfig, help="learning-rate schedule")
    scale_learning_rate: ScaleConfig = _spec(
        default_factory=ScaleConfig, help="scale learning_rate with the batch size (linear or sqrt rule)"
    )
    weight_decay: float = _spec(
        minimum=0.0,
        maximum=1.0,
        help="lars, lamb: weight decay added to the gradient (lars) or the update (lamb) before the trust "
        "ratio, as the papers do; not applied to the variables excluded from adaptation",
    )
    exclude_from_adaptation: tuple[str, ...] | None = _spec(
        help="lars, lamb: variables that get neither the trust ratio nor weight decay, as regular expressions "
        "searched in each variable's path; null: every variable with one axis (biases, normalisation scales "
        "and offsets), as both papers exclude them; []: none"
    )
    trust_coefficient: float = _spec(
        minimum=0.0, exclusive_min=True, maximum=1.0, help="lars: eta, the trust coefficient"
    )


@section("batch_schedule[i].")
class BatchChange:
    epoch: int | None = _spec(minimum=1, maximum=MAX_EPOCHS, help="the 1-based epoch it starts at")
    step: int | None = _spec(minimum=0, help="or: the updates done before it starts (0: from the first)")
    batch_size: int | None = _spec(minimum=1, maximum=MAX_BATCH_SIZE, help="the batch size from then on")


@section("batch_schedule.")
class BatchRule:
    rule: str | None = _spec(
        choices=BATCH_RULES,
        help="noise_scale: at each change the batch becomes the measured gradient noise scale "
        "(accum/trainer/noise.py), rounded to whole micro-batches, never smaller than the batch in force",
    )
    max_batch_size: int | None = _spec(minimum=1, maximum=MAX_BATCH_SIZE, help="the largest batch the rule may grow to")
    every_epochs: int = _spec(
        minimum=1, maximum=MAX_EPOCHS, help="epochs between changes; each change comes at an epoch's end"
    )


@section("data.augment.")
class AugmentConfig:
    flip: bool = _spec(
        help="mirror each training image left-right with probability 1/2 (only for "
        "data whose mirror image keeps its class: clothes, not digits or text)"
    )
    crop: int = _spec(
        minimum=0,
        maximum=4096,
        help="pad each training image with this many zero pixels per side and cut a random "
        "window of its own size: shifts of up to crop pixels",
    )


@section("data.")
class DataConfig:
    name: str = _spec(
        choices=DATASET_NAMES,
        help="fashion_mnist: the built-in set; npz: your arrays in one .npz file; "
        "image_folder: your PNG/JPEG files in class folders; python: your own tf.data pipeline (data.factory)",
    )
    dir: str | None = _spec(
        help="fashion_mnist: folder with the IDX .gz files (default: $ACCUM_TRAIN_DATA, Debian's, the cache)",
    )
    path: str | None = _spec(
        help="npz: the .npz file (x_train, y_train, x_test, y_test, optional "
        "class_names); image_folder: the folder holding train/CLASS/*.png "
        "and test/CLASS/*.png (also .jpg, .jpeg); a relative path is read from the working directory, else from "
        "the config file's folder"
    )
    image_size: tuple[int, int] | None = _spec(
        minimum=1,
        help="image_folder: resize every image to [H, W] (bilinear); null: every image must already have one size",
    )
    channels: int | None = _spec(  # 1 or 3: checked with the other data keys
        help="image_folder: decode every image to 1 (grayscale) or 3 (RGB) "
        f"channels; null: {IMAGE_CHANNELS}, as keras.utils.image_dataset_from_directory"
    )
    keep_decoded: bool | None = _spec(
        help="image_folder: decode every image once when the data loads and train from memory; false: decode "
        "each batch's files as it comes; null: keep them when they take at most a quarter of the memory available"
    )
    num_classes: int | None = _spec(
        minimum=2,
        maximum=1_000_000,
        help="npz: the class count (null: the largest label + 1, or the "
        "length of class_names); a label >= num_classes is an error",
    )
    shuffle: bool = _spec(
        help="false: every epoch reads the training examples in their stored order (as model.fit(shuffle=False))",
    )
    train_limit: int | None = _spec(minimum=1, help="use only the first N training examples")
    test_limit: int | None = _spec(minimum=1, help="use only the first N test examples")
    validation: int = _spec(
        minimum=0,
        help="hold out this many training examples (the same random choice in every run) "
        "as a validation split, evaluated every epoch: choose settings on it and "
        "keep the test split for the final figure",
    )
    augment: AugmentConfig = _spec(
        default_factory=AugmentConfig, help="random changes to each training image, drawn from (seed, update)"
    )
    trim_padding: int | None = _spec(
        minimum=1,
        help="npz, for a keras_file model of sequences padded with zeros: each batch's examples ordered by length "
        "and each micro-batch's time axis cut after its longest sequence, rounded up to a multiple of this; the "
        "update stays the whole batch's (checked on the first batch, refused where the padding counts)",
    )
    factory: str | None = _spec(
        help="python: module:function (a module in the working directory or the config file's folder, or "
        "installed); function(split, epoch, seed, **options) returns an unbatched tf.data.Dataset of (x, y) or "
        "(x, y, sample_weight) for split 'train' and 'test', the same examples for the same arguments"
    )
    shuffle_buffer: int | None = _spec(
        minimum=1,
        help=f"python: with data.shuffle, the examples shuffled at once (tf.data's buffer; null: {SHUFFLE_BUFFER})",
    )
    options: dict | None = _spec(
        choices="options", help="python: keyword arguments for the factory (every other key under data: goes here)"
    )


@section("strategy.")
class StrategyConfig:
    name: str = _spec(
        choices=STRATEGY_NAMES,
        help="default: one device; mirrored: the visible devices of this machine; "
        "multi_worker: one process per machine, from TF_CONFIG or --workers",
    )
    cpu_devices: int | None = _spec(
        minimum=1, maximum=64, help="mirrored: split the CPU into this many logical devices"
    )
    worker_timeout_s: float = _spec(
        minimum=0.0,
        exclusive_min=True,
        help="--workers: how long a worker may take to start, and how long the others get to stop when one fails",
    )


@section("loss_scale.")
class LossScaleConfig:
    # Keras' LossScaleOptimizer's own defaults (defaults.LOSS_SCALE_INITIAL and _GROWTH_STEPS)
    initial: float = _spec(minimum=1.0, maximum=2.0**64, help="mixed_float16: the loss scale of the first update")
    growth_steps: int = _spec(
        minimum=1, help="mixed_float16: double the scale after this many applied updates in a row"
    )


@section("checkpoint.")
class CheckpointConfig:
    every_steps: int = _spec(minimum=0, help="also checkpoint every N updates (0: epoch ends only)")
    keep: int = _spec(minimum=1, maximum=1000, help="checkpoints kept")
