"""accum_train.fit with model.fit's conventions: callbacks, data in every form model.fit takes, an uncompiled
model's keywords, and bad input in one line. (Exactness for every kind of loss: test_fit_exact.py.)"""

import contextlib
import csv
import gc
import importlib
import io
import itertools
import os
import threading
import warnings

import accum_train
import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train import UserError
from accum_train.backends import active
from helpers import iterated_autotuning, max_difference

N, BATCH = 50, 16
RNG = np.random.default_rng(3)
X = RNG.random((N, 6), dtype=np.float32)
Y = RNG.random((N, 1), dtype=np.float32)
LABELS = RNG.integers(0, 4, N)


def regression(rate=0.1, optimizer=None):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)], name="regression"
    )
    model.compile(optimizer=optimizer or keras.optimizers.SGD(rate), loss="mse", metrics=["mae"])
    return model


class Steps(keras.callbacks.Callback):
    """What model.fit's callbacks are told: every event, the batch indexes and the rate before each update."""

    def __init__(self, stop_at=None):
        super().__init__()
        self.events, self.rates, self.stop_at = [], [], stop_at

    def on_train_begin(self, logs=None):
        self.events.append("train_begin")

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(f"epoch_begin {epoch}")

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(self.model.optimizer.learning_rate))

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(f"batch {batch} {sorted(logs)}")
        if self.stop_at is not None and len(self.rates) == self.stop_at:
            self.model.stop_training = True

    def on_test_end(self, logs=None):
        self.events.append(f"validation {sorted(logs)}")

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(f"epoch_end {epoch} {sorted(logs)}")

    def on_train_end(self, logs=None):
        self.events.append("train_end")


def test_callbacks_see_one_step_per_update_and_model_fit_logs():
    steps = Steps()
    history = accum_train.fit(
        regression(),
        X,
        Y,
        batch_size=BATCH,
        subdivisions=3,
        epochs=2,
        callbacks=[steps],
        verbose=0,
        validation_data=(X[:10], Y[:10]),
    )
    batch = ["loss", "mae", "noise_scale"]  # model.fit's, and the gradient noise scale (k=3: measured)
    epoch = ["loss", "mae", "val_loss", "val_mae"]  # model.fit's: the noise scale is an update's (History has it)
    expected = ["train_begin"]
    for e in range(2):
        expected += [f"epoch_begin {e}", *[f"batch {b} {batch}" for b in range(4)]]
        expected += [f"validation {['loss', 'mae']}", f"epoch_end {e} {epoch}"]
    assert steps.events == [*expected, "train_end"]
    assert isinstance(history, keras.callbacks.History) and history.epoch == [0, 1]
    assert history.params == {"verbose": 0, "epochs": 2, "steps": 4}
    assert history["loss"] == history.history["loss"]  # also reads as the dict accum_train.fit used to return


def test_the_epochs_and_the_validation_are_iterated_with_autotuning_off(monkeypatch):
    # autotuning's thread can hold an iterator's teardown until its next wake-up (datasets.base.untuned)
    seen = iterated_autotuning(monkeypatch)
    model = regression()
    accum_train.fit(
        model, X, Y, batch_size=BATCH, subdivisions=3, epochs=2, verbose=0, validation_data=(X[:10], Y[:10])
    )
    assert int(model.optimizer.iterations.numpy()) == 8
    assert seen == [False] * 4  # per epoch: its stream, then the validation's


def test_stop_training_is_honoured_after_the_update_in_hand():
    model = regression()
    history = accum_train.fit(model, X, Y, batch_size=BATCH, subdivisions=2, epochs=3, callbacks=[Steps(6)], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 6
    assert history.epoch == [0, 1]


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.5),
        lambda: keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, factor=0.5, min_delta=10.0),
    ],
    ids=["LearningRateScheduler", "ReduceLROnPlateau"],
)
def test_rate_callbacks_change_the_rate_between_updates_as_in_model_fit(make):
    oracle, ours = regression(0.3), regression(0.3)
    seen, steps = Steps(), Steps()
    expected = oracle.fit(X, Y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0, callbacks=[make(), seen])
    history = accum_train.fit(
        ours, X, Y, batch_size=BATCH, subdivisions=3, epochs=3, shuffle=False, verbose=0, callbacks=[make(), steps]
    )
    assert max_difference(ours.get_weights(), oracle.get_weights()) < 1e-5
    assert history.history["learning_rate"] == pytest.approx(expected.history["learning_rate"])
    assert steps.rates == pytest.approx(seen.rates) and len(steps.rates) == 12 and len(set(steps.rates)) > 1


def test_early_stopping_checkpoint_csv_and_tensorboard(tmp_path):
    model = regression()
    callbacks = [
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0),
        keras.callbacks.ModelCheckpoint(tmp_path / "epoch-{epoch}.keras"),
        keras.callbacks.CSVLogger(tmp_path / "log.csv"),
        keras.callbacks.TensorBoard(tmp_path / "tensorboard"),
    ]
    history = accum_train.fit(
        model,
        X,
        Y,
        batch_size=BATCH,
        subdivisions=2,
        epochs=5,
        callbacks=callbacks,
        verbose=0,
        validation_data=(X[:10], Y[:10]),
    )
    assert history.epoch == [0, 1]  # no 10.0 improvement after the first epoch: stopped after the second
    saved = keras.models.load_model(tmp_path / "epoch-2.keras")
    assert max_difference(saved.get_weights(), model.get_weights()) == 0.0
    assert keras.models.load_model(tmp_path / "epoch-1.keras").optimizer.iterations.numpy() == 4
    rows = list(csv.DictReader(io.StringIO((tmp_path / "log.csv").read_text())))
    assert [float(r["val_loss"]) for r in rows] == pytest.approx(history.history["val_loss"])
    logged = {}
    for path in (tmp_path / "tensorboard" / "train").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "epoch_loss":
                    logged[event.step] = float(tf.make_ndarray(value.tensor))
    assert [logged[e] for e in sorted(logged)] == pytest.approx(history.history["loss"])


def test_verbose_1_shows_keras_progress_bar_one_step_per_update_after_one_line_on_the_gradient_cache():
    """The cache line: the last layer's 8*1 + 1 trainable floats, 36 bytes in float32 (the frozen first layer's
    kernel and bias are not held), for the one normaliser of a mean squared error; said once, as the engine is built."""
    model = regression()
    model.layers[0].trainable = False
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        accum_train.fit(model, X, Y, batch_size=BATCH, subdivisions=3, epochs=2, verbose=1)
    text = out.getvalue()
    assert "Epoch 2/2" in text and "4/4" in text and "12/" not in text
    assert [line for line in text.splitlines() if "gradient cache" in line] == [
        "accum_train.fit: gradient cache: 36 bytes in float32, 2 trainable variables x 1 loss normaliser(s); "
        "2 frozen variables not held"
    ]


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return X[i * BATCH : (i + 1) * BATCH], Y[i * BATCH : (i + 1) * BATCH]


PAIRS = tf.data.Dataset.from_tensor_slices((X, Y))
# name: (x, fit keywords); every source gives the batches of the arrays in their order: the same weights
SOURCES = {
    "arrays": (X, {"y": Y, "batch_size": BATCH, "shuffle": False}),
    "dataset of batches": (PAIRS.batch(BATCH), {}),
    "dataset of examples": (PAIRS, {"batch_size": BATCH}),
    "dataset of unknown length": (PAIRS.filter(lambda x, y: True).batch(BATCH), {}),
    "generator": (
        tf.data.Dataset.from_generator(
            lambda: ((X[i : i + BATCH], Y[i : i + BATCH]) for i in range(0, N, BATCH)),
            output_signature=(tf.TensorSpec([None, 6], tf.float32), tf.TensorSpec([None, 1], tf.float32)),
        ),
        {},
    ),
    "PyDataset": (Batches(), {"shuffle": False}),
    # a plain Python generator and iterator: one stream, each epoch reading on (model.fit's way)
    "Python generator": (
        ((X[i : i + BATCH], Y[i : i + BATCH]) for _ in range(2) for i in range(0, N, BATCH)),
        {"steps_per_epoch": 4},
    ),
    "iterator": (
        iter([(X[i : i + BATCH], Y[i : i + BATCH]) for _ in range(2) for i in range(0, N, BATCH)]),
        {"steps_per_epoch": 4},
    ),
    # a trailing None is no sample weight, as in model.fit (not a weight taken for y)
    "iterator of (x, y, None)": (
        iter([(X[i : i + BATCH], Y[i : i + BATCH], None) for _ in range(2) for i in range(0, N, BATCH)]),
        {"steps_per_epoch": 4},
    ),
    "repeat with steps_per_epoch": (PAIRS.batch(BATCH).repeat(), {"steps_per_epoch": 4}),
}


@pytest.fixture(scope="module")
def from_arrays():
    model = regression()
    accum_train.fit(model, X, Y, batch_size=BATCH, subdivisions=3, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


@pytest.mark.parametrize("source", list(SOURCES)[1:])
def test_every_data_source_gives_the_weights_of_the_arrays(source, from_arrays):
    x, keywords = SOURCES[source]
    model = regression()
    accum_train.fit(model, x, subdivisions=3, epochs=2, verbose=0, **keywords)
    assert int(model.optimizer.iterations.numpy()) == 8
    assert max_difference(model.get_weights(), from_arrays) < 1e-6


def test_a_py_dataset_read_by_worker_threads_gives_the_weights_of_the_arrays(from_arrays):
    """Its workers' queue was left half read by the look at the first batch, and the epoch's own reading waited
    for the rest forever: the call runs in a thread here so that such a wait fails the test instead of hanging."""
    model, returned = regression(), []

    def call():
        accum_train.fit(model, Batches(workers=2), subdivisions=3, epochs=2, shuffle=False, verbose=0)
        returned.append(True)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(120)
    assert returned, "accum_train.fit did not return within 120 s"
    assert max_difference(model.get_weights(), from_arrays) < 1e-6


@pytest.mark.parametrize(
    "source",
    [
        {"x": X, "y": Y, "batch_size": BATCH},
        {"x": tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH), "validation_data": (X[:20], Y[:20])},
    ],
    ids=["arrays", "dataset with validation"],
)
def test_a_call_lets_its_pipelines_go_as_it_returns(source):
    """No tf.data iterator of the call outlives it, garbage included: a pipeline's threads stop as fit returns,
    not at Python's next full collection (whose timing no one controls)."""
    iterator_type = type(iter(tf.data.Dataset.range(1)))
    gc.collect()
    gc.disable()  # what a cycle holds stays among gc.get_objects() until a collection
    try:
        accum_train.fit(regression(), subdivisions=2, epochs=2, verbose=0, **source)
        left = [o for o in gc.get_objects() if type(o) is iterator_type]  # isinstance would load lazy modules
    finally:
        gc.enable()
    assert left == []


def test_a_stream_is_pulled_as_the_updates_need_it_never_read_whole():
    pulled = []

    def examples():
        for i in range(10**9):  # far more than memory holds
            pulled.append(i)
            yield X[i % N], Y[i % N]

    stream = tf.data.Dataset.from_generator(
        examples, output_signature=(tf.TensorSpec([6], tf.float32), tf.TensorSpec([1], tf.float32))
    )
    model = regression()
    accum_train.fit(model, stream, batch_size=BATCH, subdivisions=4, steps_per_epoch=3, epochs=2, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 6
    assert 6 * BATCH <= len(pulled) < 6 * BATCH + 10 * BATCH  # what six updates and the pipeline's prefetch hold


def test_two_inputs_and_two_outputs_as_dicts_and_as_lists_end_at_model_fit_s_weights():
    def model(structure):
        keras.utils.set_random_seed(1)
        a, b = keras.Input((3,), name="a"), keras.Input((3,), name="b")
        hidden = keras.layers.Dense(4, activation="relu", name="hidden")(keras.layers.Concatenate()([a, b]))
        outputs = [keras.layers.Dense(1, name="value")(hidden), keras.layers.Dense(4, name="label")(hidden)]
        inputs = {"a": a, "b": b} if structure == "dict" else [a, b]
        built = keras.Model(inputs, dict(zip(["value", "label"], outputs)) if structure == "dict" else outputs)
        losses = ["mse", keras.losses.SparseCategoricalCrossentropy(from_logits=True)]
        built.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=dict(zip(["value", "label"], losses)) if structure == "dict" else losses,
            loss_weights={"value": 1.0, "label": 0.5} if structure == "dict" else [1.0, 0.5],
        )
        return built

    as_dict, as_list, oracle = model("dict"), model("list"), model("dict")  # compared layer by layer
    oracle.fit(
        {"a": X[:, :3], "b": X[:, 3:]}, {"value": Y, "label": LABELS}, batch_size=BATCH, shuffle=False, verbose=0
    )
    accum_train.fit(
        as_dict,
        {"a": X[:, :3], "b": X[:, 3:]},
        {"value": Y, "label": LABELS},
        batch_size=BATCH,
        subdivisions=3,
        shuffle=False,
        verbose=0,
    )
    accum_train.fit(
        as_list, [X[:, :3], X[:, 3:]], [Y, LABELS], batch_size=BATCH, subdivisions=3, shuffle=False, verbose=0
    )
    for name in ("hidden", "value", "label"):
        expected = oracle.get_layer(name).get_weights()
        assert max_difference(as_dict.get_layer(name).get_weights(), expected) < 1e-5
        assert max_difference(as_list.get_layer(name).get_weights(), expected) < 1e-5


def classifier(softmax):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(4, activation="softmax" if softmax else None)(keras.layers.Dense(8)(inputs))
    return keras.Model(inputs, outputs)


@pytest.mark.parametrize("softmax", [False, True], ids=["logits", "softmax"])
def test_an_uncompiled_model_keeps_the_keywords_it_had(softmax):
    """Sparse categorical cross-entropy on logits or on a softmax layer's output, and the named optimizer."""
    oracle, ours = classifier(softmax), classifier(softmax)
    oracle.compile(
        optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=not softmax)
    )
    oracle.fit(X, LABELS, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    history = accum_train.fit(
        ours,
        X,
        LABELS,
        batch_size=BATCH,
        subdivisions=3,
        epochs=2,
        optimizer="adam",
        learning_rate=0.01,
        shuffle=False,
        validation_data=(X[:10], LABELS[:10]),
        verbose=0,
    )
    assert max_difference(ours.get_weights(), oracle.get_weights()) < 1e-5
    assert set(history) == {"loss", "accuracy", "noise_scale", "val_loss", "val_accuracy"}
    predicted = np.argmax(ours.predict(X[:10], verbose=0), axis=1)
    assert history["val_accuracy"][-1] == pytest.approx(np.mean(predicted == LABELS[:10]))


@pytest.mark.parametrize(
    ("keywords", "name", "rate"),
    [({}, "adam", 0.001), ({"optimizer": "sgd"}, "sgd", 0.001), ({"learning_rate": 0.05}, "adam", 0.05)],
    ids=["neither", "optimizer", "learning_rate"],
)
def test_an_uncompiled_model_s_left_out_keywords_are_the_config_s_defaults(keywords, name, rate):
    """One place for the defaults: what the CLI's optimizer section defaults to (config/sections.py)."""
    from accum_train.config import OptimizerConfig

    model = classifier(False)
    accum_train.fit(model, X[:8], LABELS[:8], batch_size=8, epochs=0, verbose=0, **keywords)
    assert type(model.optimizer).__name__.lower() == name
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(rate)
    assert (OptimizerConfig().name, OptimizerConfig().learning_rate) == ("adam", 0.001)


def test_an_optimizer_object_for_an_uncompiled_model():
    oracle, model = classifier(False), classifier(False)
    oracle.compile(optimizer=keras.optimizers.SGD(0.2), loss=keras.losses.SparseCategoricalCrossentropy(True))
    oracle.fit(X, LABELS, batch_size=BATCH, shuffle=False, verbose=0)
    given = keras.optimizers.SGD(0.2)
    accum_train.fit(model, X, LABELS, batch_size=BATCH, subdivisions=2, optimizer=given, shuffle=False, verbose=0)
    assert model.optimizer is given
    assert int(model.optimizer.iterations.numpy()) == 4
    assert max_difference(model.get_weights(), oracle.get_weights()) < 1e-5


class NanAt(keras.callbacks.Callback):
    """Makes the model's weights NaN after update ``at`` (1-based), so the next update's loss is NaN."""

    def __init__(self, at):
        super().__init__()
        self.at, self.seen = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            self.model.layers[-1].kernel.assign(np.full(self.model.layers[-1].kernel.shape, np.nan, np.float32))


class Count(keras.callbacks.Callback):
    """The updates each epoch ran."""

    def __init__(self):
        super().__init__()
        self.per_epoch = []

    def on_epoch_begin(self, epoch, logs=None):
        self.per_epoch.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.per_epoch[-1] += 1


# model.fit's keywords, a case each: accum_train.fit at k=3 against model.fit, the same updates, weights and logs
# (k=3 cuts a batch of 16 as 5, 5, 6 and the short one of 2 as 0, 1, 1: uneven, where averaging means would show).
# ("oracle": model.fit's x where the same batches come another way; "weights": False where they differ by design.)
REPEATED = tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH).repeat()
KEYWORDS = {
    "validation_freq": {"epochs": 4, "validation_data": (X[:10], Y[:10]), "validation_freq": 2},
    "validation_freq list": {"epochs": 3, "validation_data": (X[:10], Y[:10]), "validation_freq": [1, 3]},
    "validation_batch_size": {"epochs": 2, "validation_split": 0.2, "validation_batch_size": 3},
    "validation_steps": {
        "epochs": 2,
        "validation_data": (X[:10], Y[:10]),
        "validation_batch_size": 3,
        "validation_steps": 2,
    },
    "initial_epoch": {"epochs": 3, "initial_epoch": 1},
    # 50 examples are 4 batches a pass, the last of 2: 3 updates an epoch read on through the passes, as model.fit
    # reads one repeated stream
    "steps_per_epoch pass after pass": {"epochs": 3, "steps_per_epoch": 3, "oracle": REPEATED},
    # update 4's loss is NaN: both stop after it; model.fit applies it, accum_train.fit skips it
    "TerminateOnNaN": {
        "epochs": 2,
        "callbacks": lambda: [NanAt(3), keras.callbacks.TerminateOnNaN()],
        "weights": False,
    },
}


@pytest.mark.parametrize("case", list(KEYWORDS))
def test_model_fit_s_keywords_give_model_fit_s_weights_and_logs(case):
    keywords = dict(KEYWORDS[case])
    make_callbacks, oracle_x = keywords.pop("callbacks", list), keywords.pop("oracle", None)
    compare_weights = keywords.pop("weights", True)
    oracle, ours = regression(), regression()
    counted, oracle_counted = Count(), Count()
    expected = oracle.fit(
        *((X, Y) if oracle_x is None else (oracle_x,)),
        batch_size=None if oracle_x is not None else BATCH,
        shuffle=False,
        verbose=0,
        callbacks=[*make_callbacks(), oracle_counted],
        **keywords,
    )
    history = accum_train.fit(
        ours,
        X,
        Y,
        batch_size=BATCH,
        subdivisions=3,
        shuffle=False,
        verbose=0,
        callbacks=[*make_callbacks(), counted],
        **keywords,
    )
    assert history.epoch == expected.epoch
    assert counted.per_epoch == oracle_counted.per_epoch
    if compare_weights:
        assert max_difference(ours.get_weights(), oracle.get_weights()) < 1e-5
    assert [key for key in history.history if key != "noise_scale"] == list(expected.history)
    for name, values in expected.history.items():
        assert history.history[name] == pytest.approx(values, rel=1e-5, abs=1e-6, nan_ok=True), name


def batches(passes=1, start=0):
    """A Python generator of the arrays' batches, ``passes`` times over (pass p's targets moved by p), from batch
    ``start`` on."""
    every = [(X[i : i + BATCH], Y[i : i + BATCH] + p) for p in range(passes) for i in range(0, N, BATCH)]
    yield from every[start:]


def test_a_generator_without_steps_per_epoch_is_read_to_its_end_once_then_training_stops():
    model = regression()
    with pytest.warns(UserWarning, match="Your input ran out of data; interrupting training"):
        history = accum_train.fit(model, batches(), subdivisions=2, epochs=3, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 4
    assert history.epoch == [0]


def test_a_generator_resumed_from_its_run_directory_reads_on_from_the_update_it_stopped_at(tmp_path):
    whole = regression()
    accum_train.fit(whole, batches(2), subdivisions=2, steps_per_epoch=4, epochs=2, verbose=0)
    model = regression()
    accum_train.fit(model, batches(2), subdivisions=2, steps_per_epoch=4, epochs=1, verbose=0, output_dir=tmp_path)
    # the next call gets a generator as the first one got it: it passes over the epoch already trained
    accum_train.fit(model, batches(2), subdivisions=2, steps_per_epoch=4, epochs=2, verbose=0, output_dir=tmp_path)
    assert int(model.optimizer.iterations.numpy()) == 8
    assert max_difference(model.get_weights(), whole.get_weights()) == 0.0


def test_model_fit_s_positional_order(from_arrays):
    model = regression()
    accum_train.fit(model, X, Y, BATCH, 2, 0, None, 0.0, None, False, subdivisions=3)  # ... verbose, callbacks, ...
    assert max_difference(model.get_weights(), from_arrays) == 0.0


def test_no_seed_leaves_every_global_random_state_as_it_was_and_a_seed_repeats_the_call():
    import random

    def draws():
        return random.random(), float(np.random.random())

    random.seed(5)
    np.random.seed(5)
    expected = draws()
    orders = []
    for _ in range(2):
        model = regression()
        random.seed(5)
        np.random.seed(5)
        accum_train.fit(model, X, Y, batch_size=BATCH, subdivisions=2, verbose=0)
        assert draws() == expected  # model.fit's way: nothing global reset
        orders.append(model.get_weights())
    assert max_difference(*orders) > 0.0  # each call shuffled afresh
    seeded = []
    for _ in range(2):
        model = regression()
        accum_train.fit(model, X, Y, batch_size=BATCH, subdivisions=2, verbose=0, seed=3)
        seeded.append(model.get_weights())
    assert max_difference(*seeded) == 0.0


class TwoWorkers:
    num_replicas_in_sync = 2  # with one local replica (local_replica_ids patched): another process holds one


@pytest.mark.parametrize(
    "seed, shuffled, drawn",
    [(7, True, 7), (None, False, 0), (None, True, "refused")],
    ids=["given", "nothing-to-shuffle", "refused"],
)
def test_several_workers_need_a_seed_only_to_shuffle_arrays(seed, shuffled, drawn, monkeypatch):
    inputs = importlib.import_module("accum_train.keras_fit.inputs")
    monkeypatch.setattr(active(), "local_replica_ids", lambda strategy: [0])  # what inputs asks the backend
    if drawn != "refused":
        assert inputs.order_seed(seed, None, TwoWorkers(), shuffled) == drawn
        return
    with pytest.raises(UserError) as caught:
        inputs.order_seed(seed, None, TwoWorkers(), shuffled)
    assert str(caught.value) == (
        "accum_train.fit: seed=None on several workers, which would each shuffle the data their own way: pass "
        "seed=<int>, the same on every worker"
    )


class EagerProbe(keras.layers.Layer):
    """Records whether each call ran eagerly."""

    def __init__(self):
        super().__init__()
        self.eager = []

    def call(self, inputs):
        self.eager.append(tf.executing_eagerly())
        return inputs


def test_run_eagerly_runs_the_micro_steps_eagerly_to_the_weights_of_the_graph():
    graphed = regression()
    accum_train.fit(graphed, X, Y, batch_size=BATCH, subdivisions=3, shuffle=False, verbose=0)
    keras.utils.set_random_seed(1)
    probe = EagerProbe()
    model = keras.Sequential(
        [keras.Input((6,)), probe, keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)], name="eager"
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"], run_eagerly=True)
    accum_train.fit(model, X, Y, batch_size=BATCH, subdivisions=3, shuffle=False, verbose=0)
    # each micro-step, op by op (the rest: building): 3 in each of the 3 full batches, 2 in the last one of 2
    # examples (batching.Cut.pulls: no empty micro-step for a short batch of arrays, as in the CLI)
    assert probe.eager.count(True) == 11
    assert max_difference(model.get_weights(), graphed.get_weights()) < 1e-6
    assert not tf.config.functions_run_eagerly()  # as it was before the call


def jit_classifier(jit_compile, norm):
    keras.utils.set_random_seed(1)
    layers = [keras.Input((6,)), keras.layers.Dense(8, activation="relu")]
    layers += [keras.layers.BatchNormalization()] if norm else []
    model = keras.Sequential([*layers, keras.layers.Dense(4)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss, metrics=["accuracy"], jit_compile=jit_compile)
    return model


@pytest.mark.parametrize(
    "norm, k, twin",
    [
        (False, 2, "model.fit"),  # a dense net: the whole batch's update at k=2
        (True, 1, "model.fit"),  # BatchNorm at k=1 is the whole batch
        (True, 2, "no XLA"),  # BatchNorm at k=2 (one micro-step at a time under XLA; two in flight without)
    ],
)
def test_jit_compile_trains_each_micro_step_and_validation_with_xla_to_the_weights_without(norm, k, twin):
    """Validation too runs under XLA, as model.fit's test step does."""
    model, other = jit_classifier(True, norm), jit_classifier(twin == "model.fit", norm)
    common = dict(verbose=0, shuffle=False, validation_data=(X[:20], LABELS[:20]), validation_batch_size=8)
    history = accum_train.fit(model, X, LABELS, BATCH, 2, subdivisions=k, **common)
    if twin == "model.fit":
        expected = other.fit(X, LABELS, BATCH, 2, **common)
    else:
        expected = accum_train.fit(other, X, LABELS, BATCH, 2, subdivisions=k, **common)
    assert max_difference(model.get_weights(), other.get_weights()) < 1e-5
    for key in ("loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(history.history[key], expected.history[key], rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_under_xla_the_micro_steps_run_one_at_a_time(jit_compile, monkeypatch):
    """XLA's compiled micro-step uses the cores itself: one in flight (two cost more CPU and wall time, measured).
    Without it, two on a CPU with cores to share out (as auto chooses: threads.auto_parallel)."""
    from accum_train.backends.tensorflow.engine import Accumulator
    from accum_train.trainer.runtime import auto_parallel

    seen, real = [], Accumulator.__init__
    monkeypatch.setattr(
        Accumulator, "__init__", lambda self, *a, **kw: seen.append(kw["parallel"]) or real(self, *a, **kw)
    )
    accum_train.fit(jit_classifier(jit_compile, False), X, LABELS, BATCH, 1, subdivisions=4, verbose=0)
    assert seen == [1 if jit_compile else auto_parallel(2)]


@pytest.mark.parametrize("jit_compile", [False, True])
def test_under_xla_the_optimizers_apply_is_compiled_too(jit_compile):
    """As model.fit's jitted train step applies the optimizer inside its XLA cluster: one compiled apply per set of
    variables the loss reaches, traced once."""
    from accum_train.keras_fit.train import _ENGINES

    model = jit_classifier(jit_compile, False)
    accum_train.fit(model, X, LABELS, BATCH, 2, subdivisions=4, verbose=0)
    ((engine, _),) = _ENGINES[model].values()
    assert engine.jit_apply == jit_compile
    assert [f.experimental_get_tracing_count() for f in engine._applies.values()] == ([1] if jit_compile else [])


class HostOnly(keras.layers.Layer):
    """An op XLA cannot compile (a Python function), in training or only in inference (``when``): under
    jit_compile=True, model.fit fails on it in its train step or in its validation."""

    def __init__(self, when):
        super().__init__()
        self.when = when

    def call(self, x, training=None):
        if (self.when == "validation") == bool(training):
            return x
        return tf.ensure_shape(tf.numpy_function(lambda v: v, [x], tf.float32), x.shape)

    def compute_output_shape(self, shape):
        return shape


@pytest.mark.parametrize("jit_compile, when", [(False, "training"), (True, "training"), (True, "validation")])
def test_jit_compile_is_applied_as_model_fit_applies_it(jit_compile, when):
    def model():
        keras.utils.set_random_seed(1)
        net = keras.Sequential([keras.Input((6,)), HostOnly(when), keras.layers.Dense(1)])
        net.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
        return net

    common = dict(verbose=0, validation_data=(X[:8], Y[:8]))
    fits = (lambda m: m.fit(X, Y, BATCH, **common), lambda m: accum_train.fit(m, X, Y, BATCH, subdivisions=2, **common))
    for fit in fits:
        if not jit_compile:
            fit(model())  # trains and validates: the Python function runs on the host
            continue
        with pytest.raises(tf.errors.InvalidArgumentError, match="Detected unsupported operations when trying to "):
            fit(model())


def test_precision_for_the_call_only(tmp_path, monkeypatch):
    """precision= computes in 16 bits for this call (the result differs from float32's, a little) and gives the
    layers their own policy back; nothing is written without output_dir."""
    monkeypatch.chdir(tmp_path)
    full, half = regression(), regression()
    accum_train.fit(full, X, Y, batch_size=BATCH, subdivisions=2, shuffle=False, verbose=0)
    accum_train.fit(half, X, Y, batch_size=BATCH, subdivisions=2, shuffle=False, verbose=0, precision="mixed_bfloat16")
    assert 1e-4 < max_difference(half.get_weights(), full.get_weights()) < 0.01  # 5.6e-4 measured
    assert {layer.dtype_policy.name for layer in half.layers} == {"float32"}
    assert os.listdir(tmp_path) == []


def test_a_mixed_float16_model_trains_with_one_loss_scale_per_update():
    """compile() wraps a mixed_float16 model's optimizer in a LossScaleOptimizer; accum_train.fit scales every
    micro-batch by one scale per update instead, and ends where model.fit ends on whole batches."""

    def mixed():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(8, activation="tanh", dtype="mixed_float16")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(hidden))
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
        return model

    oracle, ours = mixed(), mixed()
    oracle.fit(X, Y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    accum_train.fit(ours, X, Y, batch_size=BATCH, subdivisions=3, epochs=2, shuffle=False, verbose=0)
    assert int(ours.optimizer.iterations.numpy()) == 8
    # float16 activations round differently when the batch is cut (5e-5 measured); float32 is exact to 1e-7
    assert max_difference(ours.get_weights(), oracle.get_weights()) < 2e-4


def test_a_mixed_float16_update_that_overflows_is_skipped_and_halves_the_scale():
    """Targets 30 times larger: the float16 gradients of the first updates overflow at the starting scale of 2**15.
    Each such update is skipped whole (weights unchanged) and halves the one scale; the rest train, finite."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh", dtype="mixed_float16")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(hidden))
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.001)), loss="mse")
    after = [[w.copy() for w in model.get_weights()]]  # before any update, then after each

    class Watch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            after.append([w.copy() for w in model.get_weights()])

    accum_train.fit(
        model, X, Y * 30, batch_size=BATCH, subdivisions=3, epochs=2, shuffle=False, verbose=0, callbacks=[Watch()]
    )
    engine = next(iter(importlib.import_module("accum_train.keras_fit.train")._ENGINES[model].values()))[0]
    skipped = int(engine.skipped_updates.numpy())
    assert 1 <= skipped < 8 and int(model.optimizer.iterations.numpy()) == 8 - skipped
    assert float(engine.loss_scale.numpy()) == 2.0**15 / 2**skipped
    moved = [max_difference(b, a) > 0 for a, b in itertools.pairwise(after)]
    assert moved.count(False) == skipped and not moved[0]  # each skipped update left the weights as they were
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())


def batch_norm_net():
    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8), keras.layers.BatchNormalization(), keras.layers.Dense(1)],
        name="with_batch_norm",
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


@pytest.mark.parametrize(
    "batch_size, subdivisions, warned",
    [(32, 8, 4), (32, 4, None), (32, 5, 6), (4, 1, None)],  # (4, 1): one pass per update, as model.fit's
)
def test_batchnorm_over_micro_batches_under_8_examples_is_warned_of_as_the_cli_does(batch_size, subdivisions, warned):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        accum_train.fit(batch_norm_net(), X, Y, batch_size=batch_size, subdivisions=subdivisions, verbose=0)
    ours = [str(w.message) for w in said if "BatchNorm" in str(w.message)]
    assert ours == (
        []
        if warned is None
        else [
            f"accum_train.fit: micro-batches of {warned} examples (under 8) give BatchNorm noisy statistics: replace "
            "model 'with_batch_norm''s BatchNormalization layers (e.g. by GroupNormalization), or pass a larger "
            "micro_batch_size"
        ]
    )
    assert all(w.filename == __file__ for w in said if "BatchNorm" in str(w.message))  # the caller's line


def test_a_batchnorm_model_saved_during_fit_is_plain_keras_and_predicts_as_the_model(tmp_path):
    """Its BatchNormalization's ``call`` is replaced on the instance during the call: a file ModelCheckpoint
    writes meanwhile must hold Keras' own layer, the moving statistics pooled so far included."""
    model = batch_norm_net()
    saving = keras.callbacks.ModelCheckpoint(tmp_path / "epoch-{epoch}.keras")
    accum_train.fit(model, X, Y, batch_size=BATCH, subdivisions=3, epochs=2, callbacks=[saving], verbose=0)
    first, last = (keras.models.load_model(tmp_path / f"epoch-{e}.keras") for e in (1, 2))
    norm = next(layer for layer in last.layers if isinstance(layer, keras.layers.BatchNormalization))
    assert type(norm) is keras.layers.BatchNormalization and "call" not in vars(norm)
    assert max_difference(last.get_weights(), model.get_weights()) == 0.0
    assert np.array_equal(last.predict(X, verbose=0), model.predict(X, verbose=0))
    assert max_difference(first.get_weights(), model.get_weights()) > 1e-4  # saved after epoch 1, then trained on
    moving = norm.moving_mean.numpy()
    assert np.max(np.abs(moving)) > 1e-3  # the statistics moved and were saved


class Raise(keras.callbacks.Callback):
    """After update ``at``: raise ``error`` (a KeyboardInterrupt is Ctrl-C without a run directory), or send
    ``signum`` to this process (with one: the run stops after the update in hand)."""

    def __init__(self, at, error=None, signum=None):
        super().__init__()
        self.at, self.error, self.signum, self.seen = at, error, signum, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            if self.error is not None:
                raise self.error
            os.kill(os.getpid(), self.signum)


INTERRUPTS = [
    pytest.param(lambda: Raise(3, error=KeyboardInterrupt()), KeyboardInterrupt, False, id="Ctrl-C, no run directory"),
    pytest.param(lambda: Raise(3, signum=2), accum_train.errors.Interrupted, True, id="SIGINT, a run directory"),
]


@pytest.mark.parametrize(("interrupt", "raised", "keeps_dir"), INTERRUPTS)
def test_an_interrupt_leaves_the_model_at_its_last_update_with_its_own_layers_back(
    interrupt, raised, keeps_dir, tmp_path
):
    """The model object is trained in place: stopped after update 3, it holds what a run told to stop there
    holds (weights and BatchNorm's moving statistics), and its layers are its own again (their dtype policy
    after precision=, BatchNorm's own call after pooling), so model.fit and predict go on with it."""
    shared = dict(batch_size=BATCH, subdivisions=2, epochs=3, shuffle=False, verbose=0, precision="mixed_bfloat16")
    told = batch_norm_net()
    accum_train.fit(told, X, Y, callbacks=[Steps(3)], **shared)
    stopped = batch_norm_net()
    with pytest.raises(raised):
        accum_train.fit(
            stopped, X, Y, callbacks=[interrupt()], output_dir=tmp_path / "run" if keeps_dir else None, **shared
        )
    assert int(stopped.optimizer.iterations.numpy()) == 3
    assert max_difference(stopped.get_weights(), told.get_weights()) == 0.0
    assert {layer.dtype_policy.name for layer in stopped.layers} == {"float32"}
    assert all("call" not in vars(layer) for layer in stopped.layers)  # no pooled call left on BatchNorm
    assert (tmp_path / "run" / "checkpoints").is_dir() is keeps_dir
    before = stopped.predict(X[:4], verbose=0)
    stopped.fit(X, Y, batch_size=BATCH, epochs=1, verbose=0)  # Keras' own fit, on the layers as they were
    assert int(stopped.optimizer.iterations.numpy()) == 7 and before.dtype == np.float32


def test_a_strategy_given_is_the_one_trained_under_and_must_hold_the_model():
    """strategy=: the model created (and compiled) in its scope trains under it, to the weights it has without
    one; a model created outside it is refused in one line before anything trains."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        inside = regression()
    plain = regression()
    shared = dict(batch_size=BATCH, subdivisions=3, epochs=2, shuffle=False, verbose=0)
    under = accum_train.fit(inside, X, Y, strategy=strategy, **shared)
    alone = accum_train.fit(plain, X, Y, **shared)
    assert max_difference(inside.get_weights(), plain.get_weights()) < 1e-6
    assert under.history["loss"] == pytest.approx(alone.history["loss"], rel=1e-6)
    outside = regression()
    with pytest.raises(UserError) as caught:
        accum_train.fit(outside, X, Y, strategy=strategy, **shared)
    assert str(caught.value) == (
        "accum_train.fit: model 'regression' was not created under strategy.scope(): create (and compile) it "
        "inside `with strategy.scope():`, as model.fit needs"
    )
    assert int(outside.optimizer.iterations.numpy()) == 0


class PredictionSummary(keras.metrics.Metric):
    """A metric whose result is a dict, which model.fit logs entry by entry."""

    def __init__(self, name="summary", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(keras.ops.sum(y_pred))
        self.count.assign_add(keras.ops.cast(keras.ops.shape(y_pred)[0], "float32"))

    def result(self):
        # a value of the count, not the variable: model.fit's epoch logs would hold the variable, which its
        # validation then resets and moves
        return {"prediction_mean": self.total / self.count, "predictions": self.count * 1.0}


# name: (metric, the keys its logs add); both once ended the call in a TypeError
RESULTS = {
    "an array of one value (F1Score of one sigmoid unit)": (lambda: keras.metrics.F1Score(threshold=0.5), ["f1_score"]),
    "a dict of results": (PredictionSummary, ["prediction_mean", "predictions"]),
}


@pytest.mark.parametrize("case", RESULTS)
def test_a_metric_s_result_of_any_form_is_logged_as_model_fit_logs_it(case, tmp_path):
    metric, keys = RESULTS[case]
    labels = (Y > 0.5).astype(np.float32)
    histories = []
    for fit in (keras.Model.fit, accum_train.fit):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=[metric()])
        more = {"subdivisions": 2, "output_dir": tmp_path / "run"} if fit is accum_train.fit else {}
        histories.append(
            fit(model, X, labels, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, validation_split=0.2, **more)
        )
    expected, got = (h.history for h in histories)
    assert sorted(expected) == sorted(keys + ["loss"] + [f"val_{key}" for key in keys + ["loss"]])
    for key, values in expected.items():
        np.testing.assert_allclose(np.asarray(got[key], np.float64), np.asarray(values, np.float64), rtol=1e-5)


def test_the_cli_s_route_into_fit_refuses_a_keyword_fit_does_not_take():
    """fit_with_summary (the CLI's run on Keras) takes fit's keywords by name: a misspelt one is refused as Python
    refuses it for fit, not trained with fit's default."""
    from accum_train.keras_fit.fit import fit_with_summary

    with pytest.raises(TypeError) as refused:
        fit_with_summary(None, None, micro_batchsize=3)
    assert str(refused.value) == "fit() got an unexpected keyword argument 'micro_batchsize'"
