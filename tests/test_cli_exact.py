"""accum-train run is exact for every loss accum_train.fit is exact for: one accumulator, whatever normalises the
loss. A keras_file compiled with a masked per-token loss, a mean over sample weights, a sum, two outputs with
normalisers of their own; from an .npz and from a python data factory. Keras' model.fit(shuffle=False) on whole
batches is the oracle: 50 examples in batches of 16 (three full and a short one of 2), k=3 (micro-batches of
5, 5 and 6; the short batch's 0, 1 and 1), two epochs, SGD. The token sequences are long in the first half of the
data and short in the second, so the micro-batches of a batch hold very different numbers of valid tokens:
averaging micro-batch means, or dividing by the examples, would be off by far more than 1e-5."""

import accum_train
import keras
import numpy as np
import pytest
from helpers import max_difference

N, T, VOCAB, BATCH, K, EPOCHS, RATE = 50, 8, 20, 16, 3, 2, 0.5


def token_arrays():
    """Sequences of 6-8 valid tokens in the first 25 examples, 1-2 in the last 25 (0: padding), tags 0-3."""
    rng = np.random.default_rng(5)
    lengths = np.concatenate([rng.integers(6, T + 1, 25), rng.integers(1, 3, 25)])
    x = rng.integers(1, VOCAB, (N, T)).astype(np.int32)
    x[np.arange(T)[None, :] >= lengths[:, None]] = 0
    tags = rng.integers(0, 4, (N, T)).astype(np.int64)
    value = (lengths / T + 0.1 * rng.normal(size=N)).astype(np.float32)[:, None]
    return x, tags, value


def tagger(two_outputs=False, lstm=False):
    keras.utils.set_random_seed(11)
    tokens = keras.Input((T,), dtype="int32", name="tokens")
    embedded = keras.layers.Embedding(VOCAB, 6, mask_zero=True, name="embed")(tokens)
    hidden_layer = keras.layers.LSTM(8, return_sequences=True, name="hidden") if lstm else None
    hidden = (hidden_layer or keras.layers.Dense(8, activation="tanh", name="hidden"))(embedded)
    tags = keras.layers.Dense(4, name="tags")(hidden)
    if not two_outputs:
        return keras.Model(tokens, tags)
    value = keras.layers.Dense(1, name="value")(keras.layers.GlobalAveragePooling1D(name="pool")(hidden))
    return keras.Model(tokens, {"tags": tags, "value": value})


def regression():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, name="out")(hidden))


def masked_case(lstm=False):
    x, tags, _ = token_arrays()
    arrays = dict(x_train=x, y_train=tags, x_test=x[20:32], y_test=tags[20:32])
    return tagger(lstm=lstm), lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True), None, arrays


def two_outputs_case():
    x, tags, value = token_arrays()
    arrays = dict(x_train=x, y_train_tags=tags, y_train_value=value, x_test=x[20:32])
    arrays.update(y_test_tags=tags[20:32], y_test_value=value[20:32])

    def loss():
        return {"tags": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "value": "mse"}

    return tagger(two_outputs=True), loss, {"tags": 1.0, "value": 0.5}, arrays


def regression_arrays(weights: bool):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 6)).astype(np.float32)
    y = (x @ rng.normal(size=(6, 2)) + 0.1 * rng.normal(size=(N, 2))).astype(np.float32)
    arrays = dict(x_train=x, y_train=y, x_test=x[:20], y_test=y[:20])
    if weights:  # heavy at the start, light at the end: the micro-batches' weights differ
        arrays["w_train"] = np.linspace(3.0, 0.1, N).astype(np.float32)
        arrays["w_test"] = np.linspace(0.5, 2.0, 20).astype(np.float32)
    return arrays


def weighted_mean_case():
    return (
        regression(),
        lambda: keras.losses.MeanSquaredError(reduction="mean_with_sample_weight"),
        None,
        (regression_arrays(weights=True)),
    )


def sum_case():
    return regression(), lambda: keras.losses.Huber(reduction="sum"), None, regression_arrays(weights=False)


FACTORY = """
import numpy as np
import tensorflow as tf


def tokens(split, epoch, seed, path):
    arrays = np.load(path)
    return tf.data.Dataset.from_tensor_slices((arrays[f"x_{split}"], arrays[f"y_{split}"]))
"""

# (case, what it is: model, loss, loss weights, arrays; data from an .npz or the python factory; the learning rate;
# subdivisions)
CASES = [
    ("masked-npz", masked_case, "npz", RATE, K),
    ("masked-python", masked_case, "python", RATE, K),
    # an LSTM is traced for its micro-batch size (engine ``sized``): 4 micro-batches of 4, the short batch's 2 of 1
    ("masked-lstm-one-size", lambda: masked_case(lstm=True), "npz", RATE, 4),
    ("mean-with-sample-weight", weighted_mean_case, "npz", 0.05, K),
    ("sum", sum_case, "npz", 0.01, K),
    ("two-outputs-own-normalisers", two_outputs_case, "npz", RATE, K),
]


def prepared(tmp_path, case):
    """The model file (compiled with the loss), the data, the run's config and the oracle after model.fit."""
    make, source, rate, k = next(rest for name, *rest in CASES if name == case)
    model, loss, loss_weights, arrays = make()
    model.compile(loss=loss(), loss_weights=loss_weights)
    model.save(tmp_path / "model.keras")
    np.savez(tmp_path / "data.npz", **arrays)
    data = {"name": "npz", "path": str(tmp_path / "data.npz"), "shuffle": False}
    if source == "python":
        (tmp_path / "factory.py").write_text(FACTORY)
        data = {"name": "python", "factory": f"{tmp_path / 'factory.py'}:tokens", "path": data["path"]}
        data["shuffle"] = False
    config = {
        "model": {"name": "keras_file", "path": str(tmp_path / "model.keras")},
        "data": data,
        "batch_size": BATCH,
        "subdivisions": k,
        "epochs": EPOCHS,
        "optimizer": {"name": "sgd", "learning_rate": rate},
    }
    oracle = keras.models.load_model(tmp_path / "model.keras", compile=False)
    oracle.compile(optimizer=keras.optimizers.SGD(rate), loss=loss(), loss_weights=loss_weights)
    targets = _targets(arrays, "train")
    oracle.fit(
        arrays["x_train"],
        targets,
        sample_weight=arrays.get("w_train"),
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
    )
    return config, oracle, arrays


def _targets(arrays, split):
    named = {key[len(f"y_{split}_") :]: value for key, value in arrays.items() if key.startswith(f"y_{split}_")}
    return named or arrays[f"y_{split}"]


def saved_weights(run_dir, model):
    """weights.npz's arrays of ``model``'s weights, in its order (the file also holds an LSTM's seed state)."""
    saved = np.load(run_dir / "weights.npz")
    return [saved[v.path] for v in model.weights]


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_a_run_ends_at_model_fit_s_weights_and_test_loss_for_any_normaliser(tmp_path, case):
    config, oracle, arrays = prepared(tmp_path, case)
    start = keras.models.load_model(tmp_path / "model.keras", compile=False).get_weights()
    summary = accum_train.run(config, output_dir=tmp_path / "run")
    weights = saved_weights(tmp_path / "run", oracle)
    assert max_difference(weights, oracle.get_weights()) < 1e-5
    assert max_difference(weights, start) > 1e-3  # it trained
    # the test loss over the whole test set, as Keras gives it for one batch of all of it
    scores = oracle.evaluate(
        arrays["x_test"],
        _targets(arrays, "test"),
        sample_weight=arrays.get("w_test"),
        batch_size=len(arrays["x_test"]),
        verbose=0,
        return_dict=True,
    )
    assert summary["test_loss"] == pytest.approx(scores["loss"], rel=1e-5)
