"""What accum_train.fit has from the one accumulator besides exactness: the gradient noise scale in its logs,
micro_batch_size="auto" retrying an update that ran out of memory at twice the micro-batches, and k changed
between updates without a new graph."""

import math

import accum_train
import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.trainer.noise import one_update
from helpers import records

N, BATCH = 48, 24


def linear(seed=0, metrics=()):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=list(metrics))
    return model


def regression(rng):
    x = rng.normal(size=(N, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + rng.normal(size=(N, 1))).astype(np.float32)
    return x, y


def test_the_noise_scale_of_a_per_example_loss_is_mcCandlish_s_estimate_from_its_micro_batches():
    """One update of 24 examples as 3 micro-batches of 8: the logged noise scale is S_hat / G2_hat (noise.py) of
    the micro-batches' and the batch's mean gradients, computed here from the per-example gradients of MSE on a
    linear model, 2 (w.x - y) x."""
    x, y = regression(np.random.default_rng(1))
    model = linear()
    w = model.get_weights()[0]
    history = accum_train.fit(model, x[:BATCH], y[:BATCH], batch_size=BATCH, subdivisions=3, shuffle=False, verbose=0)
    per_example = 2 * (x[:BATCH] @ w - y[:BATCH]) * x[:BATCH]  # [24, 3]
    micro = [per_example[i * 8 : (i + 1) * 8].mean(0) for i in range(3)]
    batch = per_example.mean(0)
    squares = sum(float(g @ g) for g in micro)
    trace, signal = one_update(squares, 3 / 8, 3, float(batch @ batch), BATCH)
    assert history.history["noise_scale"] == pytest.approx([trace / signal], rel=1e-4)


def tagger():
    keras.utils.set_random_seed(2)
    tokens = keras.Input((6,), dtype="int32")
    hidden = keras.layers.Embedding(12, 4, mask_zero=True)(tokens)
    model = keras.Model(tokens, keras.layers.Dense(3)(hidden))
    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def test_with_one_data_dependent_normaliser_a_micro_batch_s_size_is_its_count(monkeypatch):
    """A masked per-token loss: each micro-batch's size is its valid tokens, its mean gradient the gradient of
    its own masked mean (Keras' loss on it alone), and the batch's the gradient of the whole batch's: the
    update's sums (sum |g_i|^2, sum 1/b_i, k; |G_B|^2, B) as the estimate takes them."""
    rng = np.random.default_rng(3)
    x = rng.integers(1, 12, (12, 6)).astype(np.int32)
    x[np.arange(6)[None, :] >= np.array([6, 5, 6, 4, 1, 2, 1, 1, 3, 2, 2, 1])[:, None]] = 0
    y = rng.integers(0, 3, (12, 6))
    model = tagger()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def gradient(rows):
        with tf.GradientTape() as tape:
            value = loss(y[rows], model(x[rows], training=True))
        return np.concatenate([tf.convert_to_tensor(g).numpy().ravel() for g in tape.gradient(value, model.weights)])

    parts = [slice(0, 4), slice(4, 8), slice(8, 12)]
    micro = [gradient(rows) for rows in parts]
    batch = gradient(slice(0, 12))
    counts = [int((x[rows] > 0).sum()) for rows in parts]
    records, real = [], Accumulator.update_from
    monkeypatch.setattr(Accumulator, "update_from", lambda *args: records.append(real(*args)) or records[-1])
    accum_train.fit(model, x, y, batch_size=12, subdivisions=3, shuffle=False, verbose=0)
    squares = sum(float(g @ g) for g in micro)
    assert np.asarray(records[0]["noise"]) == pytest.approx([squares, sum(1 / c for c in counts), 3], rel=1e-4)
    assert np.asarray(records[0]["noise_batch"]) == pytest.approx([float(batch @ batch), sum(counts)], rel=1e-4)


def test_one_micro_batch_logs_no_noise_scale_a_first_update_its_estimate_and_one_without_nan_written_as_null(
    tmp_path,
):
    x, y = regression(np.random.default_rng(1))
    assert "noise_scale" not in accum_train.fit(linear(), x, y, batch_size=BATCH, verbose=0).history
    logged = []
    callback = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: logged.append(logs))
    accum_train.fit(linear(), x, y, batch_size=BATCH, subdivisions=2, verbose=0, callbacks=[callback])
    assert len(logged) == 2
    assert all("noise_scale" in logs for logs in logged)  # the estimate of the first update is a number already
    assert not any(math.isnan(logs["noise_scale"]) for logs in logged)
    # Two micro-batches whose gradients cancel (the same input, opposite targets, zero weights): the batch's
    # gradient is zero, the estimate of |G|^2 negative, the noise scale undefined. The logs hold model.fit's NaN,
    # metrics.jsonl strict JSON's null.
    model = linear()
    model.set_weights([np.zeros((3, 1), np.float32)])
    same, opposite = np.ones((2, 3), np.float32), np.array([[1.0], [-1.0]], np.float32)
    logged.clear()
    accum_train.fit(
        model, same, opposite, batch_size=2, subdivisions=2, verbose=0, callbacks=[callback], output_dir=tmp_path
    )
    assert math.isnan(logged[0]["noise_scale"])
    assert [r["noise_scale"] for r in records(tmp_path)] == [None, None]  # the update's record, the epoch's


def test_auto_retries_an_update_that_runs_out_of_memory_at_twice_the_micro_batches(monkeypatch, capsys):
    """The second update's first attempt at k=1 runs out of memory after pulling and accumulating its micro-batch;
    it is retried from the same data at k=2, and the run ends at model.fit's weights on whole batches (nothing
    lost, nothing applied twice), its metrics as model.fit's (the failed attempt's metric state undone)."""
    x, y = regression(np.random.default_rng(4))
    oracle, ours = linear(metrics=["mae"]), linear(metrics=["mae"])
    expected = oracle.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    calls, pulls_seen = [0], []
    real = Accumulator.update_from

    def update_from(self, iterator, n, pulls, stop=0, size=None):
        calls[0] += 1
        pulls_seen.append((pulls, size))
        if calls[0] == 2:
            self.accumulate_from(iterator, n, pulls, size)  # the micro-batches pulled and in the caches, metrics moved
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[24,3]")
        return real(self, iterator, n, pulls, stop, size)

    monkeypatch.setattr(Accumulator, "update_from", update_from)
    history = accum_train.fit(ours, x, y, batch_size=BATCH, micro_batch_size="auto", shuffle=False, verbose=1)
    assert pulls_seen == [(1, 24), (1, 24), (2, 12)]
    assert "update 2 ran out of memory with subdivisions=1: retrying the same batch with subdivisions=2" in (
        capsys.readouterr().out
    )
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(ours.get_weights(), oracle.get_weights())) < 1e-6
    for name in ("loss", "mae"):
        assert history.history[name] == pytest.approx(expected.history[name], rel=1e-5), name


def test_a_resumed_auto_run_goes_on_at_the_micro_batches_its_checkpoint_holds(monkeypatch, tmp_path):
    """auto doubled k in the first call; the second, with a new model object (a new engine, its k read before the
    restore), resumes the output_dir at the checkpoint's k."""
    x, y = regression(np.random.default_rng(4))
    calls, pulls_seen = [0], []
    real = Accumulator.update_from

    def update_from(self, iterator, n, pulls, stop=0, size=None):
        calls[0] += 1
        pulls_seen.append(pulls)
        if calls[0] == 2:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[24,3]")
        return real(self, iterator, n, pulls, stop, size)

    monkeypatch.setattr(Accumulator, "update_from", update_from)
    for epochs in (1, 2):
        accum_train.fit(
            linear(), x, y, batch_size=BATCH, micro_batch_size="auto", epochs=epochs, output_dir=tmp_path, verbose=0
        )
    assert pulls_seen == [1, 1, 2, 2, 2]  # epoch 1: k=1, its retry and the rest at 2; epoch 2 resumed at 2


def test_out_of_memory_with_a_fixed_micro_batch_is_one_line(monkeypatch):
    x, y = regression(np.random.default_rng(4))

    def update_from(self, iterator, n, pulls, stop=0, size=None):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[12,3]")

    monkeypatch.setattr(Accumulator, "update_from", update_from)
    with pytest.raises(accum_train.errors.OutOfMemory) as caught:
        accum_train.fit(linear(), x, y, batch_size=BATCH, micro_batch_size=12, verbose=0)
    assert str(caught.value) == (
        "update 1 ran out of memory with subdivisions=2 (OOM when allocating tensor with shape[12,3]): pass a "
        "smaller micro_batch_size, or micro_batch_size='auto'"
    )


def test_one_graph_per_micro_batch_size_and_one_for_every_unknown_size():
    """The pulls of an update are a tensor: the graph traced for a micro-batch size (feed.sized) serves every update
    of that size whatever its k, and the graph of an unknown size serves every k but 1: one micro-batch in all
    skips the caches, in a graph of its own."""
    from accum_train.keras_fit.train import _ENGINES
    from accum_train.trainer.data.batching import Cut
    from accum_train.trainer.data.sources import feed_for

    x, y = regression(np.random.default_rng(5))
    model = linear()
    accum_train.fit(model, x, y, batch_size=BATCH, subdivisions=2, verbose=0)  # 4 updates, each 2 x 12 examples
    engine = next(iter(_ENGINES[model].values()))[0]
    traces = engine._update_pulled.experimental_get_tracing_count
    assert traces() == 1 and not engine.sized  # a Dense model: traced for no size
    engine.sized = True  # as for a model that loops over time
    feed = feed_for(x, y, None, None, batch_size=BATCH, shuffle=False, seed=0, steps_per_epoch=None)
    for k, size, after in [(3, None, 1), (4, None, 1), (1, None, 2), (1, None, 2), (2, 12, 3), (3, 8, 4), (3, 8, 4)]:
        out = engine.update_from(iter(feed.dataset(0, 0, Cut(k, 1, (0,)))), BATCH, k, 0, size)
        assert float(out["examples"]) == BATCH and bool(out["applied"])
        assert traces() == after, (k, size)


@pytest.mark.parametrize(
    "layers, batch_size, expected",
    [
        ([keras.layers.LSTM(4)], BATCH, [12]),  # loops over time: traced for its micro-batches of 12
        ([keras.layers.Bidirectional(keras.layers.GRU(2))], BATCH, [12]),  # the loop inside a wrapper
        ([keras.layers.LSTM(4)], 20, [4, 10]),  # batches of 20, 20, then 8: micro-batches of 10, then of 4
        ([keras.layers.LSTM(4)], 21, [3]),  # 21 as 10 and 11 (no one size: not sized), then 6 as 3 and 3
        ([keras.layers.Flatten()], BATCH, []),  # convolutions and Dense layers ran slower so: never sized
    ],
)
def test_a_model_that_loops_over_time_is_traced_for_its_micro_batch_size(monkeypatch, layers, batch_size, expected):
    from accum_train.backends.tensorflow import engine as engine_module

    seen, real = [], engine_module.sized
    monkeypatch.setattr(engine_module, "sized", lambda element, size: seen.append(size) or real(element, size))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5, 3)), *layers, keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.random.default_rng(6).normal(size=(N, 5, 3)).astype(np.float32)
    accum_train.fit(model, x, x[:, 0, :1], batch_size=batch_size, subdivisions=2, verbose=0)
    assert sorted(set(seen)) == expected  # the sizes of the traces made


def test_the_noise_scale_stays_out_of_the_epoch_logs_so_csvlogger_writes_model_fit_s_columns(tmp_path):
    """Issue 77: Keras' CSVLogger, given a first epoch's logs without val_ keys, adds val_<key> for every key, and
    the noise scale among them made an empty val_noise_scale column. The epoch's logs are model.fit's; History and
    each update's logs keep the noise scale."""
    x, y = regression(np.random.default_rng(1))
    headers = []
    for name, train in (("ours", lambda m, c: accum_train.fit(m, x, y, batch_size=BATCH, subdivisions=2, verbose=0,
                                                               callbacks=c)),
                        ("keras", lambda m, c: m.fit(x, y, batch_size=BATCH, verbose=0, callbacks=c))):  # fmt: skip
        path = tmp_path / f"{name}.csv"
        history = train(linear(metrics=["mae"]), [keras.callbacks.CSVLogger(str(path))])
        headers.append(path.read_text().splitlines()[0])
    assert headers[0] == headers[1] == "epoch,loss,mae,val_loss,val_mae"
    assert len(history.history["loss"]) == 1 and "noise_scale" not in history.history  # Keras' own History
    ours = accum_train.fit(linear(), x, y, batch_size=BATCH, subdivisions=2, epochs=2, verbose=0)
    assert len(ours.history["noise_scale"]) == 2 and all(np.isfinite(ours.history["noise_scale"]))
