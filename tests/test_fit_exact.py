"""accum_train.fit against Keras' own ``model.fit`` on whole batches, the oracle, for every kind of loss.

Both train the same initial weights on the same data in the same order (``shuffle=False``): 50 examples
in batches of 16, so three full batches and a short one of 2; k=3 cuts 16 as 5, 5, 6 (ragged) and 2 as
0, 1, 1 (an empty micro-batch). accum_train.fit must end at model.fit's weights to 1e-5, with the same
logs (loss, per-output losses, compiled metrics, val_ ones). Both run in this process, under its pinned
thread pools (conftest).
"""

import accum_train
import keras
import numpy as np
import pytest
from helpers import max_difference

N, BATCH, K, EPOCHS = 50, 16, 3, 2
RNG = np.random.default_rng(7)
X = RNG.random((N, 6), dtype=np.float32)
Y_VALUE = RNG.random((N, 1), dtype=np.float32)
Y_BINARY = RNG.integers(0, 2, (N, 1)).astype(np.float32)
Y_CLASS = RNG.integers(0, 4, N)
WEIGHTS = RNG.random(N, dtype=np.float32) + 0.5
VOCABULARY, STEPS = 20, 7
# Per batch, the first micro-batch holds long sequences and the last short ones: 35, 25 and 6 valid tokens
# in batch 1, so averaging micro-batch means (Keras' gradient_accumulation_steps) is far off here.
LENGTHS = np.array([[7, 7, 7, 7, 7, 5, 5, 5, 5, 5, 1, 1, 1, 1, 1, 1][i % 16] for i in range(N)])
TOKENS = RNG.integers(1, VOCABULARY, (N, STEPS))
TOKENS[np.arange(STEPS)[None, :] >= LENGTHS[:, None]] = 0
FEATURES = RNG.random((N, STEPS, 3), dtype=np.float32) * (TOKENS[..., None] > 0)
TAGS = RNG.integers(0, 5, (N, STEPS))


def optimizer(name):
    return {
        "sgd": lambda: keras.optimizers.SGD(0.5),
        "sgd-small": lambda: keras.optimizers.SGD(0.01),
        "adam": lambda: keras.optimizers.Adam(0.01),
        "decay": lambda: keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.5, 2, 0.5)),
        "clipnorm": lambda: keras.optimizers.SGD(0.5, clipnorm=0.05),
        "clipvalue": lambda: keras.optimizers.SGD(0.5, clipvalue=0.02),
        "global_clipnorm": lambda: keras.optimizers.SGD(0.5, global_clipnorm=0.05),
    }[name]()


def dense(units, activation=None, loss="mse", metrics=(), **layer):
    def build():
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(8, activation="tanh", **layer)(inputs)
        return keras.Model(inputs, keras.layers.Dense(units, activation=activation)(hidden)), loss, list(metrics)

    return build


def tokens_model(masking):
    """A per-token tagger over padded sequences: Embedding(mask_zero) + Dense, or Masking + LSTM."""

    def build():
        if masking:
            inputs = keras.Input((STEPS, 3))
            hidden = keras.layers.LSTM(8, return_sequences=True)(keras.layers.Masking()(inputs))
        else:
            inputs = keras.Input((STEPS,), dtype="int32")
            hidden = keras.layers.Embedding(VOCABULARY, 8, mask_zero=True)(inputs)
            hidden = keras.layers.Dense(8, activation="tanh")(hidden)
        outputs = keras.layers.Dense(5)(hidden)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return keras.Model(inputs, outputs), loss, [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    return build


def xla(build):
    """``build``'s model compiled with jit_compile=True."""
    return lambda: (*build(), True)


def two_outputs():
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01))(inputs)
    value = keras.layers.Dense(1, name="value")(hidden)
    label = keras.layers.Dense(4, name="label")(hidden)
    loss = {"value": keras.losses.Huber(), "label": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
    return keras.Model(inputs, {"value": value, "label": label}), loss, {"label": ["accuracy"]}


def squared_error(y_true, y_pred):
    """A loss given as a plain function (Keras wraps it, reduction sum_over_batch_size)."""
    return keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)


def four_outputs():
    """Most losses in one model (one trace in the default suite): MSE, binary and one-hot categorical
    cross-entropy, and a sum-reduced MAE, with loss_weights and sample weights."""
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.01))(inputs)
    outputs = {
        "value": keras.layers.Dense(1, name="value")(hidden),
        "binary": keras.layers.Dense(1, activation="sigmoid", name="binary")(hidden),
        "class": keras.layers.Dense(4, activation="softmax", name="class")(hidden),
        "summed": keras.layers.Dense(1, name="summed")(hidden),
    }
    loss = {
        "value": "mse",
        "binary": "binary_crossentropy",
        "class": "categorical_crossentropy",
        "summed": keras.losses.MeanAbsoluteError(reduction="sum"),
    }
    metrics = {"binary": ["accuracy"], "class": ["accuracy"]}
    return keras.Model(inputs, outputs), loss, metrics


class Subclassed(keras.Model):
    """A model written as a class with ``call`` (no functional graph), its Dropout told when it trains."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.dropout = keras.layers.Dropout(0.0)
        self.logits = keras.layers.Dense(4)

    def call(self, x, training=False):
        return self.logits(self.dropout(self.hidden(x), training=training))


def subclassed():
    model = Subclassed()
    model(X[:1])  # built by a call, as a subclassed model is
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, loss, [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


def batchnorm():
    inputs = keras.Input((6,))
    hidden = keras.layers.ReLU()(keras.layers.BatchNormalization()(keras.layers.Dense(8)(inputs)))
    return keras.Model(inputs, keras.layers.Dense(1)(hidden)), "mse", []


# name: (model builder, x, y, fit keywords, optimizer, k)
FOUR = {"value": Y_VALUE, "binary": Y_BINARY, "class": np.eye(4)[Y_CLASS], "summed": Y_VALUE}
CASES = {
    "four-outputs": (four_outputs, X, FOUR, {"sample_weight": WEIGHTS}, "adam", K),
    "mse": (dense(1), X, Y_VALUE, {}, "sgd", K),
    "mse-adam": (dense(1), X, Y_VALUE, {}, "adam", K),
    "loss-function": (dense(1, loss=squared_error), X, Y_VALUE, {"sample_weight": WEIGHTS}, "sgd", K),
    "huber-sample-weight": (
        dense(1, loss=keras.losses.Huber(), metrics=["mae"]),
        X,
        Y_VALUE,
        {"sample_weight": WEIGHTS},
        "adam",
        K,
    ),
    "binary": (
        dense(1, "sigmoid", "binary_crossentropy", ["accuracy", keras.metrics.AUC(name="auc")]),
        X,
        Y_BINARY,
        {},
        "adam",
        K,
    ),
    "one-hot": (dense(4, "softmax", "categorical_crossentropy", ["accuracy"]), X, np.eye(4)[Y_CLASS], {}, "sgd", K),
    "one-hot-adam-class-weight": (
        dense(4, "softmax", "categorical_crossentropy", ["accuracy"]),
        X,
        np.eye(4)[Y_CLASS],
        {"class_weight": {0: 3.0, 2: 0.5}},
        "adam",
        K,
    ),
    "masked-tokens": (tokens_model(masking=False), TOKENS, TAGS, {}, "sgd", K),
    "masked-tokens-lstm-adam": (tokens_model(masking=True), FEATURES, TAGS, {}, "adam", K),
    # XLA: the outputs' masks leave the compiled micro-step beside them (the metrics are masked as model.fit's)
    "masked-tokens-xla": (xla(tokens_model(masking=False)), TOKENS, TAGS, {}, "sgd", K),
    "two-outputs": (two_outputs, X, {"value": Y_VALUE, "label": Y_CLASS}, {"sample_weight": WEIGHTS}, "adam", K),
    "two-outputs-sgd": (two_outputs, X, {"value": Y_VALUE, "label": Y_CLASS}, {"sample_weight": WEIGHTS}, "sgd", K),
    "reduction-sum": (
        dense(1, loss=keras.losses.MeanSquaredError(reduction="sum")),
        X,
        Y_VALUE,
        {"sample_weight": WEIGHTS},
        "sgd-small",
        K,
    ),
    "reduction-mean-with-sample-weight": (
        dense(1, loss=keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")),
        X,
        Y_VALUE,
        {"sample_weight": WEIGHTS},
        "adam",
        K,
    ),
    "activity-regularizer": (dense(1, activity_regularizer=keras.regularizers.L2(0.1)), X, Y_VALUE, {}, "sgd", K),
    "schedule-counts-updates": (dense(1), X, Y_VALUE, {"sample_weight": WEIGHTS}, "decay", K),
    "clipnorm-once": (dense(1), X, Y_VALUE, {"sample_weight": WEIGHTS}, "clipnorm", K),
    "clipvalue-once": (dense(1), X, Y_VALUE, {"sample_weight": WEIGHTS}, "clipvalue", K),
    "global-clipnorm-once": (dense(1), X, Y_VALUE, {"sample_weight": WEIGHTS}, "global_clipnorm", K),
    "batchnorm-one-micro-batch": (batchnorm, X, Y_VALUE, {}, "sgd", 1),
    # applied after each update, as Keras' optimizer applies them (both bind: tested below)
    "weight-constraints": (
        dense(1, kernel_constraint=keras.constraints.MaxNorm(0.3), bias_constraint=keras.constraints.NonNeg()),
        X,
        Y_VALUE,
        {"sample_weight": WEIGHTS},
        "sgd",
        K,
    ),
    "subclassed": (subclassed, X, Y_CLASS, {}, "adam", K),
}


def compiled(build, optimizer_name):
    keras.utils.set_random_seed(1)
    model, loss, metrics, *jit = build()
    model.compile(
        optimizer=optimizer(optimizer_name),
        loss=loss,
        loss_weights=_loss_weights(model),
        metrics=metrics,
        jit_compile=bool(jit),
    )
    return model


def _loss_weights(model):
    if isinstance(model, Subclassed) or not isinstance(model.output, dict):  # a subclassed one has no output yet
        return None
    weights = {"value": 0.5, "label": 2.0, "binary": 1.5, "class": 0.7, "summed": 0.05}
    return {name: weights[name] for name in model.output}


# validation data where the val_ logs take another path (masks, several outputs, metrics over examples)
VALIDATED = {
    "four-outputs",
    "masked-tokens",
    "masked-tokens-lstm-adam",
    "masked-tokens-xla",
    "two-outputs",
    "one-hot-adam-class-weight",
    "subclassed",
}
# The default suite's cases (the rest in make test-slow): every kind of normaliser once, and one quick case of each
# behaviour that only a weighted, uneven cut tells apart from averaging micro-batch means: several outputs,
# class_weight, clipping (once, on the accumulated gradient) and a rate schedule (counted in updates), each on
# sample weights (class_weight is one: Keras takes one or the other).
DEFAULT = {
    "masked-tokens",
    "masked-tokens-xla",
    "batchnorm-one-micro-batch",
    "two-outputs-sgd",
    "one-hot-adam-class-weight",
    "clipnorm-once",
    "schedule-counts-updates",
    "weight-constraints",
}


@pytest.mark.parametrize("case", [c if c in DEFAULT else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_fit_ends_at_the_weights_and_logs_of_model_fit_on_whole_batches(case):
    build, x, y, keywords, optimizer_name, k = CASES[case]
    validation = (x[:13], tuple_or_dict(y, slice(0, 13))) if case in VALIDATED else None
    oracle, ours = compiled(build, optimizer_name), compiled(build, optimizer_name)
    start = [w.copy() for w in ours.get_weights()]
    expected = oracle.fit(
        x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, validation_data=validation, **keywords
    )
    history = accum_train.fit(
        ours,
        x,
        y,
        batch_size=BATCH,
        subdivisions=k,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        validation_data=validation,
        **keywords,
    )
    assert max_difference(ours.get_weights(), expected.model.get_weights(), relative=True) < 1e-5
    assert max_difference(ours.get_weights(), start) > 1e-2  # it trained
    if case == "weight-constraints":  # the kernel started over MaxNorm's norm and keeps within it; no bias below 0
        kernel, bias = ours.layers[1].kernel.numpy(), ours.layers[1].bias.numpy()
        assert np.linalg.norm(start[0], axis=0).max() > 0.5 and np.linalg.norm(kernel, axis=0).max() <= 0.3 + 1e-6
        assert bias.min() >= 0.0
    # model.fit's keys, and the gradient noise scale's where an update has micro-batches to measure it with
    assert [key for key in history.history if key != "noise_scale"] == list(expected.history)
    assert ("noise_scale" in history.history) == (k > 1)
    for name, values in expected.history.items():
        assert history.history[name] == pytest.approx(values, rel=1e-5, abs=1e-6), name


def tuple_or_dict(y, rows):
    return {key: value[rows] for key, value in y.items()} if isinstance(y, dict) else y[rows]


def test_batchnorm_moving_statistics_move_once_per_update_from_the_pooled_batch():
    """k=4: training normalises each micro-batch by its own statistics, but the moving statistics are those
    of one pass over each whole batch: equal to model.fit's when the model is frozen but for BatchNorm."""
    oracle, ours = compiled(batchnorm, "sgd"), compiled(batchnorm, "sgd")
    for model in (oracle, ours):
        for layer in model.layers:
            layer.trainable = isinstance(layer, keras.layers.BatchNormalization)
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    oracle.fit(X, Y_VALUE, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    accum_train.fit(ours, X, Y_VALUE, batch_size=BATCH, subdivisions=4, epochs=1, shuffle=False, verbose=0)
    norm = next(layer for layer in ours.layers if isinstance(layer, keras.layers.BatchNormalization))
    expected = next(layer for layer in oracle.layers if isinstance(layer, keras.layers.BatchNormalization))
    assert type(norm) is keras.layers.BatchNormalization and "call" not in vars(norm)  # Keras' own again
    for name in ("moving_mean", "moving_variance"):
        moved = getattr(norm, name).numpy()
        assert np.max(np.abs(moved - getattr(expected, name).numpy())) < 1e-6, name
        assert np.max(np.abs(moved - (0.0 if name == "moving_mean" else 1.0))) > 1e-3, name


def keras_io_convnet():
    """The shape of keras-io's MNIST convnet, small: Conv2D, MaxPooling2D, Conv2D, Flatten, Dense softmax."""
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(6, 2, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )


def test_a_keras_io_convnet_with_validation_split_ends_at_model_fit_s_weights_and_val_logs():
    """Images, one-hot labels, validation_split: the last 10 of 50 examples held out, evaluated in batches of 4
    (three of them, the last short) after each epoch; k=2 over batches of 16."""
    images = RNG.random((N, 8, 8, 1), dtype=np.float32)
    labels = np.eye(4, dtype=np.float32)[RNG.integers(0, 4, N)]
    models = []
    for _ in range(2):
        keras.utils.set_random_seed(1)
        model = keras_io_convnet()
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="categorical_crossentropy", metrics=["accuracy"])
        models.append(model)
    oracle, ours = models
    start = [w.copy() for w in ours.get_weights()]
    same = {"batch_size": BATCH, "epochs": EPOCHS, "validation_split": 0.2, "validation_batch_size": 4}
    expected = oracle.fit(images, labels, shuffle=False, verbose=0, **same)
    history = accum_train.fit(ours, images, labels, subdivisions=2, shuffle=False, verbose=0, **same)
    assert max_difference(ours.get_weights(), expected.model.get_weights(), relative=True) < 1e-5
    assert max_difference(ours.get_weights(), start) > 1e-2  # it trained
    assert list(expected.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    for name, values in expected.history.items():
        assert history.history[name] == pytest.approx(values, rel=1e-5, abs=1e-6), name


def test_batchnorm_at_k_4_trains_the_weights_keras_accumulation_trains_from_equal_micro_batches():
    """Issue 77: the quick suite's BatchNorm case at k > 1 that trains weights. Each micro-batch is normalised by
    its own rows, as Keras' own gradient_accumulation_steps normalises each of its steps: with micro-batches of one
    size and a mean loss, the two updates are one (the mean of k means is then the batch's mean), so the trainable
    weights match Keras' after 2 epochs of 3 updates of 4 micro-batches of 4, under the suite's thread pools
    (tests/conftest.py: 1 intra-op, 2 inter-op threads; oneDNN splits its sums by thread) and SGD(0.1). The moving
    statistics are not compared: Keras moves them at every micro-step, accum-train once per update."""
    x, y = X[:48], Y_VALUE[:48]
    keras.utils.set_random_seed(1)
    model, loss, _ = batchnorm()
    oracle = keras.models.clone_model(model)
    oracle.set_weights(model.get_weights())
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    oracle.compile(optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=4), loss=loss)
    start = [w.copy() for w in model.get_weights()]
    accum_train.fit(model, x, y, batch_size=16, subdivisions=4, epochs=2, shuffle=False, verbose=0)
    oracle.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    trainable = lambda m: [v.numpy() for v in m.trainable_variables]  # noqa: E731
    assert max_difference(trainable(model), trainable(oracle), relative=True) < 1e-5
    assert max_difference(model.get_weights(), start) > 1e-2  # it trained
    assert int(oracle.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy()) == 6
