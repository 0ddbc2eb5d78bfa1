"""accum_train.fit(batch_schedule=...): the CLI's key through fit's door. Each epoch is one pass over the arrays at the
batch in force; the update is still the whole batch's, so the call ends where model.fit ends when it is called once per
batch size with initial_epoch, and micro_batch_size keeps the micro-batch as the batch grows."""

import accum_train
import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train import UserError
from accum_train.errors import Interrupted
from accum_train.trainer.store.metrics_log import is_epoch_record, read_metrics
from helpers import max_difference, signal_after

N = 48  # batches of 8: 6 updates an epoch; of 16: 3; of 20: 2 full and a short one of 8
RNG = np.random.default_rng(11)
X = RNG.random((N, 5), dtype=np.float32)
Y = RNG.random((N, 1), dtype=np.float32)
SCHEDULE = [{"epoch": 1, "batch_size": 8}, {"epoch": 3, "batch_size": 20}]
EPOCHS = 4


def model():
    keras.utils.set_random_seed(5)
    built = keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)])
    built.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return built


class UpdatesPerEpoch(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.counts, self.steps = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.counts.append(0)
        self.steps.append(self.params["steps"])  # what a progress bar counts to

    def on_train_batch_end(self, batch, logs=None):
        self.counts[-1] += 1


def scheduled(built, **keywords):
    keywords = {"shuffle": False, "verbose": 0, "micro_batch_size": 4, "batch_schedule": SCHEDULE, **keywords}
    return accum_train.fit(built, X, Y, epochs=EPOCHS, **keywords)


@pytest.fixture(scope="module")
def model_fit_per_batch_size():
    """model.fit called once per batch size: epochs 1-2 at 8, then 3-4 at 20 (with initial_epoch)."""
    built = model()
    built.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    built.fit(X, Y, batch_size=20, epochs=EPOCHS, initial_epoch=2, shuffle=False, verbose=0)
    return built.get_weights()


@pytest.mark.parametrize(
    "keywords",
    [
        {},
        {"batch_size": 8, "batch_schedule": [{"epoch": 3, "batch_size": 20}]},
        {"batch_size": np.int64(8), "batch_schedule": [{"epoch": np.int64(3), "batch_size": np.int64(20)}]},
    ],
    # the CLI's rule: before a later first entry, batch_size; numpy's integers as model.fit takes them
    ids=["from-epoch-1", "batch_size-then-a-later-entry", "numpy-integers"],
)
def test_a_scheduled_batch_ends_where_model_fit_ends_at_each_batch_size(model_fit_per_batch_size, keywords):
    built, counted = model(), UpdatesPerEpoch()
    history = scheduled(built, callbacks=[counted], **keywords)
    assert max_difference(built.get_weights(), model_fit_per_batch_size) <= 1e-6
    assert counted.counts == counted.steps == [6, 6, 3, 3]
    assert len(history.history["loss"]) == EPOCHS


def test_micro_batch_size_keeps_the_micro_batch_as_the_batch_grows(tmp_path):
    """k follows the batch in force: 2 micro-batches of 4 at batch 8, then 5 at batch 20 (the engine's k, kept
    in the checkpoint); the noise scale, which needs two micro-batches or more, is measured throughout."""
    run_dir = tmp_path / "run"
    history = scheduled(model(), output_dir=run_dir)
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
    assert reader.get_tensor("subdivisions/.ATTRIBUTES/VARIABLE_VALUE") == 5
    assert all(np.isfinite(history.history["noise_scale"][1:]))


def test_a_run_stopped_after_the_batch_grew_resumes_to_the_uninterrupted_weights(tmp_path, model_fit_per_batch_size):
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted):
        scheduled(model(), output_dir=run_dir, callbacks=[signal_after(14)])  # epoch 3's second update
    resumed = model()
    scheduled(resumed, output_dir=run_dir)
    assert max_difference(resumed.get_weights(), model_fit_per_batch_size) <= 1e-6
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if not is_epoch_record(r)] == list(range(1, 19))
    with pytest.raises(UserError) as err:
        scheduled(model(), output_dir=run_dir, batch_schedule=[{"epoch": 1, "batch_size": 8}])
    assert str(err.value) == (
        f"accum_train.fit: output_dir {run_dir} was trained with batch_schedule=[[1, 8], [3, 20]], not [[1, 8]]: a "
        f"resume continues the same batches; pass batch_schedule=[[1, 8], [3, 20]] or choose a new output_dir"
    )


RULE_SCHEDULE = {"rule": "noise_scale", "max_batch_size": 24}
# what the rule decides on this data (micro-batches of 4): the estimate rounded to whole micro-batches, never smaller
RULE_LINES = [
    "noise scale 8 examples: batch_size stays 8",
    "noise scale 11 examples: batch_size 8 -> 12 from epoch 3",
    "noise scale 18 examples: batch_size 12 -> 16 from epoch 4",
]


def said_by_the_rule(capsys) -> list:
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("noise scale")]


@pytest.fixture(scope="module")
def model_fit_at_the_rule_s_sizes():
    built = model()
    for first, end, size in ((0, 2, 8), (2, 3, 12), (3, 4, 16)):
        built.fit(X, Y, batch_size=size, epochs=end, initial_epoch=first, shuffle=False, verbose=0)
    return built.get_weights()


def test_the_noise_rule_grows_the_batch_and_each_epoch_is_model_fit_s_at_its_size(
    capsys, model_fit_at_the_rule_s_sizes
):
    built = model()
    scheduled(built, batch_size=8, batch_schedule=RULE_SCHEDULE, verbose=2)
    assert said_by_the_rule(capsys) == RULE_LINES
    assert max_difference(built.get_weights(), model_fit_at_the_rule_s_sizes) <= 1e-6


def test_a_rule_run_stopped_after_a_change_resumes_with_it(tmp_path, capsys, model_fit_at_the_rule_s_sizes):
    """The change at epoch 2's end is checkpointed: the call again goes on at 12 and decides only epoch 3's."""
    run_dir = tmp_path / "run"
    keywords = {"batch_size": 8, "batch_schedule": RULE_SCHEDULE, "verbose": 2, "output_dir": run_dir}
    with pytest.raises(Interrupted):
        scheduled(model(), callbacks=[signal_after(14)], **keywords)  # epoch 3's second update
    assert said_by_the_rule(capsys) == RULE_LINES[:2]
    resumed = model()
    scheduled(resumed, **keywords)
    assert said_by_the_rule(capsys) == RULE_LINES[2:]
    assert max_difference(resumed.get_weights(), model_fit_at_the_rule_s_sizes) <= 1e-6
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
    assert reader.get_tensor("rule_changes/.ATTRIBUTES/VARIABLE_VALUE") == b"[[3, 12], [4, 16]]"


FORM = '[{"epoch": 1, "batch_size": 32}, {"epoch": 4, "batch_size": 128}]'


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        (
            {"batch_schedule": {1: 8}},
            "unknown key 'batch_schedule.1' (valid keys: rule, max_batch_size, every_epochs)",
        ),
        (
            {"batch_schedule": [{"epoch": 1, "batch": 8}]},
            "unknown key 'batch_schedule[0].batch' (did you mean 'batch_schedule[0].batch_size'?)",
        ),
        (
            {"batch_schedule": {"rule": "noise", "max_batch_size": 24}},
            "batch_schedule.rule='noise' is not one of noise_scale; did you mean 'noise_scale'?",
        ),
        (
            {"batch_schedule": {"rule": "noise_scale", "max_batch_size": 24, "every_epochs": 4}, "batch_size": 8},
            "batch_schedule every_epochs=4 leaves no epoch for the batch to change at (epochs=4): lower every_epochs "
            "or raise epochs",
        ),
        (
            {"batch_schedule": {"rule": "noise_scale", "max_batch_size": 24}, "micro_batch_size": None},
            "batch_schedule rule noise_scale grows the batch in whole micro-batches: give micro_batch_size (what fits "
            "in memory) instead of subdivisions",
        ),
        (
            {"batch_schedule": {"rule": "noise_scale", "max_batch_size": 6}},
            "batch_schedule max_batch_size=6 is smaller than batch_size=32 (the rule never shrinks the batch): raise "
            "max_batch_size",
        ),
        (
            {"batch_schedule": [{"epoch": 1, "batch_size": 0}]},
            "batch_schedule[0].batch_size=0 must be >= 1 and <= 1000000",
        ),
        (
            {"batch_schedule": [{"epoch": 3, "batch_size": 8}, {"epoch": 2, "batch_size": 16}]},
            "batch_schedule[1] (epoch 2) must come after batch_schedule[0] (epoch 3): list the changes in increasing "
            "epochs",
        ),
        (
            {"batch_schedule": [{"step": 0, "batch_size": 8}]},
            f"batch_schedule keyed by step is the CLI's: key fit's entries by epoch, such as {FORM}",
        ),
        (
            {"batch_schedule": [{"epoch": 1, "batch_size": 8}, {"epoch": 9, "batch_size": 16}]},
            "batch_schedule starts batch_size=16 at epoch 9, after the last epoch (epochs=4): raise epochs or remove "
            "the entry",
        ),
        (
            {"batch_size": 16},
            "batch_size=16 and batch_schedule[0] (epoch 1, batch_size=8) both set the first batch size: remove one",
        ),
        (
            {"steps_per_epoch": 3},
            "batch_schedule makes each epoch one pass over the arrays at the batch in force, which steps_per_epoch=3 "
            "would change: leave steps_per_epoch out",
        ),
        (
            {"shuffle": "batch"},
            "batch_schedule makes each epoch one pass over the arrays at the batch in force, which shuffle='batch' "
            "would change: leave shuffle out",
        ),
        (
            {"micro_batch_size": "auto"},
            "batch_schedule needs micro_batch_size or a fixed subdivisions (auto probes one batch size): set "
            "micro_batch_size to what fits",
        ),
        (
            {"micro_batch_size": None, "subdivisions": 10},
            "subdivisions=10 must be <= batch_size=8 (a micro-batch holds at least one example)",
        ),
    ],
    ids=[
        "dict",
        "key",
        "rule",
        "every",
        "rule-k",
        "rule-max",
        "zero",
        "order",
        "by-step",
        "after-last",
        "disagree",
        "steps",
        "shuffle-batch",
        "auto",
        "k",
    ],
)
def test_bad_schedules_are_one_line(keywords, message):
    with pytest.raises(UserError) as err:
        scheduled(model(), **keywords)
    assert str(err.value) == f"accum_train.fit: {message}"


def test_a_dataset_gives_its_own_batches():
    dataset = tf.data.Dataset.from_tensor_slices((X, Y))
    with pytest.raises(UserError) as err:
        accum_train.fit(model(), dataset, batch_schedule=SCHEDULE, epochs=EPOCHS, verbose=0)
    assert str(err.value) == (
        "accum_train.fit: batch_schedule cuts arrays into batches, and x is a _TensorSliceDataset that gives its own: "
        "pass arrays, or call accum_train.fit once per batch size with initial_epoch"
    )
