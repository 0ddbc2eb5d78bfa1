"""accum_train.fit's max_bad_steps and memory_limit: the CLI's keys of the same names, through fit's door.

A run of non-finite updates stops at the one that reaches max_bad_steps, with the weights of the last good update
(checkpointed with an output_dir); a memory_limit measures the first update before applying it, ends a fixed k's
call over it, and micro_batch_size="auto" measures one micro-step per candidate before training, as the CLI's
subdivisions: auto does."""

import re

import accum_train
import accum_train.backends.tensorflow.backend as tf_backend
import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train import UserError, keras_private
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.errors import OutOfMemory, TrainingStopped
from accum_train.trainer.store.metrics_log import read_metrics
from helpers import max_difference

N, BATCH, K = 48, 8, 3  # six updates an epoch, each of micro-batches of 3, 3 and 2
RNG = np.random.default_rng(3)
X = RNG.random((N, 5), dtype=np.float32)
Y = RNG.random((N, 1), dtype=np.float32)
POISONED = X.copy()
POISONED[[9, 20, 31], 2] = np.nan  # one row in each of updates 2, 3 and 4 (unshuffled): three bad in a row


def model():
    keras.utils.set_random_seed(4)
    built = keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)])
    built.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return built


def fit(built, x=POISONED, y=Y, **keywords):
    keywords = {"batch_size": BATCH, "subdivisions": K, "epochs": 1, "shuffle": False, "verbose": 0, **keywords}
    return accum_train.fit(built, x, y, **keywords)


@pytest.fixture(scope="module")
def after_first_update():
    """The weights after update 1 alone: what the stop must leave."""
    built = model()
    fit(built, X[:BATCH], Y[:BATCH])
    return built.get_weights()


def test_the_update_that_reaches_max_bad_steps_stops_the_call_at_the_last_good_weights(after_first_update):
    built = model()
    with pytest.raises(TrainingStopped) as err:
        fit(built, max_bad_steps=3)
    assert str(err.value) == (
        "3 updates in a row had a non-finite loss or gradient (max_bad_steps=3), the last at update 4; the weights "
        "are those of the last good update: lower the optimizer's learning rate or compile it with an optimizer "
        "that clips (clipnorm)"
    )
    assert max_difference(built.get_weights(), after_first_update) == 0.0


def test_with_an_output_dir_the_stop_is_checkpointed_and_logged(tmp_path, after_first_update):
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingStopped) as err:
        fit(model(), max_bad_steps=3, output_dir=run_dir)
    assert str(err.value).endswith(
        "the last at update 4; weights are checkpointed as of the last good update: lower the optimizer's learning "
        "rate or compile it with an optimizer that clips (clipnorm), then call accum_train.fit again with "
        f"output_dir={str(run_dir)!r}"
    )
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 4
    assert reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 1  # one applied update
    saved = [reader.get_tensor(f"weights/{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in range(4)]
    assert max_difference(saved, after_first_update) == 0.0
    records = read_metrics(run_dir / "metrics.jsonl")
    # as the CLI's records: a skipped update applied no rate and has no gradient norm
    assert [(r["step"], r["skipped"], r["learning_rate"] is None, r["grad_norm"] is None) for r in records] == [
        (1, False, False, False),
        (2, True, True, True),
        (3, True, True, True),
        (4, True, True, True),
    ]


def test_without_max_bad_steps_each_bad_update_is_skipped_and_training_goes_on():
    built, good_batches_only = model(), model()
    fit(built, epochs=2)
    kept = np.r_[0:8, 32:48]  # updates 1, 5 and 6: plain SGD over them alone is the skipping run's
    fit(good_batches_only, X[kept], Y[kept], epochs=2)
    assert max_difference(built.get_weights(), good_batches_only.get_weights()) <= 1e-7


def test_a_fixed_k_over_memory_limit_ends_the_call_before_anything_is_applied():
    built = model()
    before = built.get_weights()
    with pytest.raises(OutOfMemory) as err:
        fit(built, X, memory_limit="1KiB")
    assert re.fullmatch(
        r"update 1 peaked at [0-9.]+ (KiB|MiB) of TensorFlow memory with subdivisions=3, over "
        r"memory_limit=1KiB: raise memory_limit or use more subdivisions",
        str(err.value),
    ), str(err.value)
    assert max_difference(built.get_weights(), before) == 0.0


MiB = 2**20


@pytest.fixture()
def fake_peak(monkeypatch):
    """Allocator peak = 1 MiB per example of the last micro-step probed (as the CLI's tests force it)."""
    peak = [0]
    original = Accumulator.accumulate

    def accumulate(self, x, y, n):
        peak[0] = int(tf.nest.flatten(x)[0].shape[0]) * MiB
        return original(self, x, y, n)

    monkeypatch.setattr(Accumulator, "accumulate", accumulate)
    monkeypatch.setattr(tf_backend, "allocator_peak_bytes", lambda: peak[0])
    return peak


def test_auto_under_a_limit_measures_before_training_as_the_cli_does(capsys, fake_peak):
    """One policy in both doors: one micro-step per candidate k (1, 2, 4, ...) is measured before the first
    update, and training runs at the fewest micro-batches that fit; here micro-batches of 8 do not fit 5 MiB and
    of 4 do, so k=2: the weights of subdivisions=2, exactly."""
    probed, fixed = model(), model()
    fit(probed, X, subdivisions=None, micro_batch_size="auto", memory_limit="5MiB", verbose=1)
    fit(fixed, X, subdivisions=2)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith('micro_batch_size="auto"')]
    assert said == [
        'micro_batch_size="auto": micro-batch of 8 -> 8 MiB (memory_limit=5MiB), too much',
        'micro_batch_size="auto": micro-batch of 4 -> 4 MiB (memory_limit=5MiB)',
        'micro_batch_size="auto" chose 2 micro-batches of up to 4 examples',
    ]
    assert max_difference(probed.get_weights(), fixed.get_weights()) == 0.0


def test_auto_under_a_limit_that_nothing_fits_ends_before_anything_is_applied(fake_peak):
    built = model()
    before = built.get_weights()
    with pytest.raises(OutOfMemory) as err:
        fit(built, X, subdivisions=None, micro_batch_size="auto", memory_limit="512KiB")
    assert str(err.value) == (
        "even one example per micro-batch needs 1 MiB of TensorFlow memory, over memory_limit=512KiB: raise "
        "memory_limit or use a smaller model"
    )
    assert max_difference(built.get_weights(), before) == 0.0


def test_auto_without_a_limit_says_it_measures_nothing_and_starts_at_one_micro_batch(capsys):
    built, whole = model(), model()
    fit(built, X, subdivisions=None, micro_batch_size="auto", verbose=1)
    fit(whole, X, subdivisions=1)
    assert (
        'micro_batch_size="auto": no memory_limit, so nothing is measured before training: the first update runs as '
        "one micro-batch per replica, and an update that runs out of memory is retried at twice the micro-batches "
        "(a GPU reports running out; a CPU's memory is the machine's: set memory_limit there)"
    ) in capsys.readouterr().out.splitlines()
    assert max_difference(built.get_weights(), whole.get_weights()) == 0.0


def test_a_limit_that_holds_changes_nothing():
    limited, free = model(), model()
    fit(limited, X, memory_limit="4GiB")
    fit(free, X)
    assert max_difference(limited.get_weights(), free.get_weights()) <= 1e-7


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"max_bad_steps": 0}, "accum_train.fit: max_bad_steps=0 must be an integer >= 1"),
        ({"max_bad_steps": 2.5}, "accum_train.fit: max_bad_steps=2.5 must be an integer >= 1"),
        (
            {"memory_limit": "lots"},
            "accum_train.fit: memory_limit='lots' must be a size such as 2GiB, 512MB or 1073741824",
        ),
        ({"memory_limit": 0}, "accum_train.fit: memory_limit=0 must be > 0 bytes"),
    ],
    ids=["max_bad_steps-0", "max_bad_steps-float", "memory_limit-text", "memory_limit-0"],
)
def test_bad_values_are_one_line(keywords, message):
    with pytest.raises(UserError) as err:
        fit(model(), X, **keywords)
    assert str(err.value) == message


def test_auto_tries_rematerialisation_before_giving_up_at_one_example_per_micro_batch(capsys, monkeypatch):
    """The memory ladder's last rung: one example per micro-batch is over the limit, so each layer's activation is
    recomputed in the backward pass (keras.RematScope(mode="activations") set on the model's layers), said in one
    line, and the probe runs again; the weights are those of the same micro-batches without it. The peak is forced:
    1 MiB per example, half that once the model is rematerialised (a real one: docs/results/memory.md)."""
    built, fixed = model(), model()
    peak, original = [0], Accumulator.accumulate

    def accumulate(self, x, y, n):
        rematerialised = any(getattr(layer, "_remat_mode", None) for layer in built.layers)
        peak[0] = int(tf.nest.flatten(x)[0].shape[0]) * MiB // (2 if rematerialised else 1)
        return original(self, x, y, n)

    monkeypatch.setattr(Accumulator, "accumulate", accumulate)
    monkeypatch.setattr(tf_backend, "allocator_peak_bytes", lambda: peak[0])
    fit(built, X, batch_size=2, subdivisions=None, micro_batch_size="auto", memory_limit="512KiB", verbose=1)
    fit(fixed, X, batch_size=2, subdivisions=2)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith('micro_batch_size="auto"')]
    assert said == [
        'micro_batch_size="auto": micro-batch of 2 -> 2 MiB (memory_limit=512KiB), too much',
        'micro_batch_size="auto": micro-batch of 1 -> 1 MiB (memory_limit=512KiB), too much',
        'micro_batch_size="auto": one example per micro-batch does not fit: retrying with each layer\'s activation '
        'recomputed in the backward pass (keras.RematScope(mode="activations"))',
        'micro_batch_size="auto": micro-batch of 1 -> 512 KiB (memory_limit=512KiB)',
        'micro_batch_size="auto" chose 2 micro-batches of up to 1 example',
    ]
    assert max_difference(built.get_weights(), fixed.get_weights()) < 1e-6
    assert keras_private.rematerialise_activations(built) == 0  # on already: the rung is tried once per model


def test_an_update_that_runs_out_of_memory_at_one_example_per_micro_batch_is_retried_rematerialised(
    monkeypatch, capsys
):
    """During training (no memory_limit: only running out says), the guard's last rung: the update is retried from
    the same batch once the model's activations are recomputed; here the device "runs out" until they are."""
    built, whole = model(), model()
    original = Accumulator.update_from

    def update_from(self, *args, **kwargs):
        if not any(getattr(layer, "_remat_mode", None) for layer in built.layers):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Accumulator, "update_from", update_from)
    fit(built, X, batch_size=2, subdivisions=None, micro_batch_size="auto", verbose=1)
    fit(whole, X, batch_size=2, subdivisions=1)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("update 1")]
    assert said == [
        "update 1 ran out of memory with subdivisions=1: retrying the same batch with subdivisions=2",
        "update 1 ran out of memory with subdivisions=2: one example per micro-batch does not fit: retrying with each "
        'layer\'s activation recomputed in the backward pass (keras.RematScope(mode="activations"))',
    ]
    assert max_difference(built.get_weights(), whole.get_weights()) < 1e-6
