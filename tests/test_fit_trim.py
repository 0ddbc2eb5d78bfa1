"""accum_train.fit(trim_padding=...): each batch's sequences ordered by length, each micro-batch cut after its
longest, and still the whole batch's update: model.fit on whole uncut batches is the oracle (1e-5), for masked
recurrent taggers and classifiers, per-token sample weights, several multiples and XLA. The feed's micro-batches
are checked as cut, and what cannot be cut exactly is refused in one line. Both sides run in this process, under
its pinned thread pools (conftest)."""

import importlib
import json

import accum_train
import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.defaults import TRIM_MULTIPLE
from accum_train.trainer.data.array_feed import ArrayFeed
from accum_train.trainer.data.batching import Cut
from accum_train.trainer.data.lengths import check_trimmable
from accum_train.trainer.data.stream_feed import DatasetFeed
from helpers import max_difference

N, BATCH, K, STEPS, VOCABULARY = 40, 16, 3, 24, 30
VALIDATION = 24  # the last examples, validated on after each epoch
RNG = np.random.default_rng(11)
LENGTHS = RNG.integers(1, STEPS + 1, N)
LENGTHS[:4] = [24, 3, 9, 17]
TOKENS = RNG.integers(1, VOCABULARY, (N, STEPS)).astype(np.int32)
TOKENS[np.arange(STEPS)[None, :] >= LENGTHS[:, None]] = 0
FEATURES = RNG.random((N, STEPS, 3), dtype=np.float32) * (TOKENS[..., None] > 0)
TAGS = RNG.integers(0, 4, (N, STEPS)).astype(np.int32)
LABELS = RNG.integers(0, 3, N)
TOKEN_WEIGHTS = (RNG.random((N, STEPS), dtype=np.float32) + 0.5) * (TOKENS > 0)


def tagger(features=False):
    """Per-token tags over padded sequences of any length: Embedding(mask_zero) or Masking, then an LSTM."""
    if features:
        inputs = keras.Input((None, 3))
        hidden = keras.layers.Masking()(inputs)
    else:
        inputs = keras.Input((None,), dtype="int32")
        hidden = keras.layers.Embedding(VOCABULARY, 6, mask_zero=True)(inputs)
    hidden = keras.layers.LSTM(8, return_sequences=True)(hidden)
    return keras.Model(inputs, keras.layers.Dense(4)(hidden))


def classifier():
    """One label per sequence, from a masked GRU's last valid step."""
    inputs = keras.Input((None,), dtype="int32")
    hidden = keras.layers.GRU(8)(keras.layers.Embedding(VOCABULARY, 6, mask_zero=True)(inputs))
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

# name: (model, x, y, sample_weight, trim_padding, k, jit_compile)
CASES = {
    "embedding tagger": (tagger, TOKENS, TAGS, None, True, K, False),
    "masking tagger, features": (lambda: tagger(True), FEATURES, TAGS, None, True, K, False),
    "per-token sample weights": (tagger, TOKENS, TAGS, TOKEN_WEIGHTS, True, K, False),
    "multiple of 4, k=5": (tagger, TOKENS, TAGS, None, 4, 5, False),
    "sequence classifier": (classifier, TOKENS, LABELS, None, 8, K, False),
    "xla": (tagger, TOKENS, TAGS, None, 8, K, True),
}


def trained(case, fit):
    build, x, y, weights, _, _, jit = CASES[case]
    keras.utils.set_random_seed(3)
    model = build()
    metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]  # a mean over each example's steps
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS, metrics=metrics, jit_compile=jit)
    history = fit(model, x, y, weights, (x[-VALIDATION:], y[-VALIDATION:]))
    return model, history.history


def widths_seen(monkeypatch) -> list:
    """The time axis's length of every micro-batch the engine differentiates from now on, as it runs (not as traced:
    a cut one's is unknown there), in the order their micro-steps ran."""
    seen, real = [], Accumulator._gradients

    def recording(self, x, *args, **kwargs):
        def record(width):
            seen.append(int(width))
            return width

        width = tf.numpy_function(record, [tf.shape(tf.nest.flatten(x)[0])[1]], tf.int32, stateful=True)
        with tf.control_dependencies([width]):
            x = tf.nest.map_structure(tf.identity, x)
        return real(self, x, *args, **kwargs)

    monkeypatch.setattr(Accumulator, "_gradients", recording)
    return seen


def cut_widths(multiple, k, epochs):
    """What trim_padding=multiple must cut the batches of BATCH to, worked out here from LENGTHS: each batch in order
    of length, longest first, cut as the engine cuts a batch of n into k (n // k each, the last n % k one more), each
    micro-batch as long as its longest sequence rounded up to the multiple (never past STEPS)."""
    widths = []
    for start in range(0, N, BATCH):
        lengths = sorted(LENGTHS[start : start + BATCH], reverse=True)
        n = len(lengths)
        sizes = [n // k + (i >= k - n % k) for i in range(k)]
        begins = np.cumsum([0, *sizes])
        widths += [int(min(-(-lengths[b] // multiple) * multiple, STEPS)) for b, size in zip(begins, sizes) if size]
    return widths * epochs


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.slow) if c == "xla" else c for c in CASES],  # XLA: a compile per length
)
def test_trimmed_micro_batches_end_at_model_fit_s_weights_on_whole_batches(case, monkeypatch):
    _, _, _, _, trim, k, _ = CASES[case]
    oracle, expected_logs = trained(
        case,
        lambda m, x, y, w, v: m.fit(
            x, y, sample_weight=w, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, validation_data=v
        ),
    )
    widths = widths_seen(monkeypatch)
    model, logs = trained(
        case,
        lambda m, x, y, w, v: accum_train.fit(
            m, x, y, sample_weight=w, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, subdivisions=k,
            trim_padding=trim, validation_data=v,
        ),
    )  # fmt: skip
    # it cut: the model.fit oracle below holds with trim_padding ignored, the lengths the micro-steps ran at do not
    multiple = TRIM_MULTIPLE if trim is True else trim
    assert sorted(widths) == sorted(cut_widths(multiple, k, epochs=2)) and min(widths) < STEPS
    expected, weights = oracle.get_weights(), model.get_weights()
    keras.utils.set_random_seed(3)
    start = CASES[case][0]().get_weights()  # the initial weights: the updates must have moved them
    assert max_difference(expected, start) > 1e-2
    assert max_difference(weights, expected) < 1e-5
    np.testing.assert_allclose(logs["loss"], expected_logs["loss"], rtol=1e-5)
    # the metrics see each micro-batch at its uncut length, the steps cut away masked: model.fit's accuracy
    np.testing.assert_allclose(logs["accuracy"], expected_logs["accuracy"], rtol=1e-6)
    np.testing.assert_allclose(logs["val_accuracy"], expected_logs["val_accuracy"], rtol=1e-6)
    # the validation's micro-batches are cut too, and its loss is the whole set's (docs/fit.md: model.fit's own
    # weighs batch means by their examples), which Keras gives for the set in one batch
    _, x, y, _, _, _, _ = CASES[case]
    whole_set = model.evaluate(x[-VALIDATION:], y[-VALIDATION:], batch_size=VALIDATION, verbose=0, return_dict=True)
    np.testing.assert_allclose(logs["val_loss"][-1], whole_set["loss"], rtol=1e-5)


def unpadded():
    """The token sequences and their tags without their padding, one example at a time."""
    for tokens, tags, length in zip(TOKENS, TAGS, LENGTHS):
        yield tokens[:length], tags[:length]


SEQUENCE = tf.TensorSpec([None], tf.int32)
STREAMS = {  # each gives the batches of BATCH that model.fit(TOKENS, TAGS, batch_size=BATCH, shuffle=False) reads
    "dataset of batches": lambda: tf.data.Dataset.from_tensor_slices((TOKENS, TAGS)).batch(BATCH),
    "padded_batch": lambda: tf.data.Dataset.from_generator(
        unpadded, output_signature=(SEQUENCE, SEQUENCE)
    ).padded_batch(BATCH),
    "generator": lambda: ((TOKENS[i : i + BATCH], TAGS[i : i + BATCH]) for i in range(0, N, BATCH)),
}


def trained_on(fit):
    keras.utils.set_random_seed(3)
    model = tagger()
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    start = model.get_weights()
    loss = fit(model).history["loss"]
    return start, model.get_weights(), loss


@pytest.fixture(scope="module")
def model_fit_on_whole_batches():
    """The oracle of every stream case, the same model.fit call for all six: run once."""
    return trained_on(lambda model: model.fit(TOKENS, TAGS, batch_size=BATCH, shuffle=False, verbose=0))


@pytest.mark.parametrize("trim", [8, False])  # uncut too: a padded_batch's unknown length once failed the LSTM
@pytest.mark.parametrize("stream", list(STREAMS))
def test_a_stream_s_batches_are_cut_to_the_weights_of_model_fit_on_whole_batches(
    stream, trim, model_fit_on_whole_batches
):
    start, expected, expected_loss = model_fit_on_whole_batches
    _, weights, loss = trained_on(
        lambda model: accum_train.fit(model, STREAMS[stream](), subdivisions=K, verbose=0, trim_padding=trim)
    )
    assert max_difference(expected, start) > 1e-2
    assert max_difference(weights, expected) < 1e-5
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)


def elements(feed, k):
    """Every element of the feed's first epoch as numpy (x, y), with the update it belongs to."""
    dataset = feed.dataset(0, 0, Cut(k, 1, (0,)), pad=False)
    return [(tuple(part.numpy() for part in data), int(where[0])) for data, where in dataset]


def feeds(source, multiple):
    """(a feed that trims, the same without): arrays shuffled with a seed, or a tf.data dataset of batches."""
    if source == "arrays":
        made = [
            ArrayFeed(TOKENS, TAGS, None, None, batch_size=BATCH, shuffle=True, seed=5, steps_per_epoch=None, trim=trim)
            for trim in (multiple, 0)
        ]
    else:
        batches = tf.data.Dataset.from_tensor_slices((TOKENS, TAGS)).batch(BATCH)
        made = [
            DatasetFeed(batches, batch_size=None, class_weight=None, steps_per_epoch=None, trim=t)
            for t in (multiple, 0)
        ]
    return made


@pytest.mark.parametrize("source", ["arrays", "dataset"])
@pytest.mark.parametrize("multiple", [1, 8, 16])
def test_the_feed_orders_each_batch_by_length_and_cuts_each_micro_batch_after_its_longest(source, multiple):
    feed, plain = feeds(source, multiple)
    cut, whole = elements(feed, K), elements(plain, K)
    assert [len(x) for (x, _), _ in cut] == [len(x) for (x, _), _ in whole]  # the same micro-batch sizes
    for update in range(3):  # every batch cut into K micro-batches, in pull order
        mine = [data for data, _ in cut[update * K : (update + 1) * K]]
        theirs = np.concatenate([x for (x, _), _ in whole[update * K : (update + 1) * K]])
        # the same examples in the update, longest first
        rows = np.concatenate([np.pad(x, ((0, 0), (0, STEPS - x.shape[1]))) for x, _ in mine])
        assert sorted(map(bytes, rows)) == sorted(map(bytes, theirs))
        lengths = np.count_nonzero(rows, axis=1)
        assert list(lengths) == sorted(lengths, reverse=True)
        for x, y in mine:  # cut after the longest, rounded up to the multiple; y cut alike
            longest = np.count_nonzero(x, axis=1).max()
            assert x.shape[1] == min(-(-longest // multiple) * multiple, STEPS) == y.shape[1]
    assert feed.element_spec[0].shape.as_list() == [None, None]
    assert plain.element_spec[0].shape.as_list() == [None, STEPS]


def test_noise_scale_is_left_out_of_the_logs_and_the_summary_of_trimmed_micro_batches(tmp_path):
    def logged(trim):
        keras.utils.set_random_seed(3)
        model = tagger()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
        seen = []
        callback = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(set(logs)))
        accum_train.fit(model, TOKENS, TAGS, batch_size=BATCH, subdivisions=K, verbose=0, callbacks=[callback],
                        trim_padding=trim, output_dir=tmp_path / str(trim), seed=0)  # fmt: skip
        return seen, json.loads((tmp_path / str(trim) / "summary.json").read_text())["noise_scale"]

    untrimmed, trimmed = logged(False), logged(True)
    assert all("noise_scale" in logs for logs in untrimmed[0]) and untrimmed[1] is not None
    assert all("noise_scale" not in logs and "loss" in logs for logs in trimmed[0]) and trimmed[1] is None


def static_tagger():
    inputs = keras.Input((STEPS,), dtype="int32")
    return keras.Model(inputs, keras.layers.Dense(4)(keras.layers.Embedding(VOCABULARY, 6, mask_zero=True)(inputs)))


def unmasked_conv():
    inputs = keras.Input((None,), dtype="int32")
    hidden = keras.layers.Conv1D(6, 3, padding="same")(keras.layers.Embedding(VOCABULARY, 6, name="tokens")(inputs))
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GlobalMaxPooling1D()(hidden)))


def unmasked_tagger():
    inputs = keras.Input((None,), dtype="int32")
    return keras.Model(inputs, keras.layers.Dense(4)(keras.layers.Embedding(VOCABULARY, 6)(inputs)))


def pooled_classifier():
    inputs = keras.Input((None,), dtype="int32")
    hidden = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCABULARY, 6)(inputs))
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))


def _two_inputs():
    a, b = keras.Input((None,), dtype="int32"), keras.Input((None,), dtype="int32")
    hidden = keras.layers.Embedding(VOCABULARY, 6, mask_zero=True)(a)
    return keras.Model([a, b], keras.layers.Dense(4)(hidden))


WHERE = "accum_train.fit: "
MULTIPLE = "must be True, False or a positive int (the multiple each micro-batch's length is rounded up to)"
REFUSED = {
    "half": (tagger, TOKENS, TAGS, 0.5, f"{WHERE}trim_padding=0.5 {MULTIPLE}"),
    "zero": (tagger, TOKENS, TAGS, 0, f"{WHERE}trim_padding=0 {MULTIPLE}"),
    "text": (tagger, TOKENS, TAGS, "yes", f"{WHERE}trim_padding='yes' {MULTIPLE}"),
    "fixed length": (
        static_tagger,
        TOKENS,
        TAGS,
        True,
        f"{WHERE}trim_padding gives micro-batches of several lengths, and model 'static' takes inputs of shape "
        f"(None, {STEPS}): build it on keras.Input(shape=(None, ...)), or leave trim_padding out",
    ),
    "a stream without a time axis": (
        classifier,
        tf.data.Dataset.from_tensor_slices((LENGTHS, LABELS)),  # single examples: batch_size batches them
        None,
        True,
        f"{WHERE}trim_padding cuts sequences along axis 1, and x's batches have no input with one (shapes "
        f"[(None,)]): leave trim_padding out",
    ),
    "no time axis": (
        classifier,
        {"a": LENGTHS},
        LABELS,
        True,
        f"{WHERE}trim_padding cuts sequences along axis 1, and x has no array with one (shapes [(40,)]): leave "
        f"trim_padding out",
    ),
    "inputs of two lengths": (
        _two_inputs,
        [TOKENS, TOKENS[:, :10]],
        TAGS,
        True,
        f"{WHERE}trim_padding needs every input of x to have the same length on axis 1, and they have [10, 24]: "
        f"pad them to one length, or leave trim_padding out",
    ),
    "unmasked convolution": (
        unmasked_conv,
        TOKENS,
        LABELS,
        True,
        f"{WHERE}trim_padding changes the gradient of tokens/embeddings of model 'static' (a micro-batch cut from 24 "
        f"to 9 steps): padding must change nothing, so mask it (Embedding(mask_zero=True), Masking) and keep layers "
        f"that mix time steps masked, or leave trim_padding out",
    ),
    "unmasked mean over time": (
        pooled_classifier,
        TOKENS,
        LABELS,
        True,
        f"{WHERE}trim_padding changes the loss summed of model 'static' (a micro-batch cut from 24 to 9 steps): "
        f"padding must change nothing, so mask it (Embedding(mask_zero=True), Masking) and keep layers that mix "
        f"time steps masked, or leave trim_padding out",
    ),
    "unmasked loss": (
        unmasked_tagger,
        TOKENS,
        TAGS,
        True,
        f"{WHERE}trim_padding changes the loss summed of model 'static' (a micro-batch cut from 24 to 9 steps): "
        f"padding must change nothing, so mask it (Embedding(mask_zero=True), Masking) and keep layers that mix "
        f"time steps masked, or leave trim_padding out",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_cannot_be_cut_exactly_is_refused_in_one_line_before_anything_trains(case):
    build, x, y, trim, message = REFUSED[case]
    keras.utils.set_random_seed(3)
    model = build()
    model.name = "static"
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(accum_train.UserError) as refused:
        accum_train.fit(model, x, y, batch_size=BATCH, subdivisions=K, verbose=0, trim_padding=trim)
    assert str(refused.value) == message
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_more_than_one_replica_is_refused():
    class TwoReplicas:
        num_replicas_in_sync = 2

    with pytest.raises(accum_train.UserError) as refused:
        check_trimmable(tagger(), TwoReplicas().num_replicas_in_sync, "accum_train.fit")
    assert str(refused.value) == (
        "accum_train.fit: trim_padding runs on one replica, and the strategy has 2: leave trim_padding out"
    )


def test_the_validation_arrays_are_cut_as_the_training_ones(monkeypatch):
    fit_module = importlib.import_module("accum_train.keras_fit.train")  # where accum_train.fit trains
    made = []

    def recorded(*args, **kwargs):
        made.append(fit_module.validation_feed.__wrapped__(*args, **kwargs))
        return made[-1]

    recorded.__wrapped__ = fit_module.validation_feed
    monkeypatch.setattr(fit_module, "validation_feed", recorded)
    keras.utils.set_random_seed(3)
    model = tagger()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    validation = (TOKENS[-VALIDATION:], TAGS[-VALIDATION:])
    accum_train.fit(model, TOKENS, TAGS, batch_size=BATCH, subdivisions=K, verbose=0, trim_padding=8,
                    validation_data=validation)  # fmt: skip
    (feed,) = made
    steps = [x.shape[1] for (x, _), _ in elements(feed, K)]
    assert feed.trim == 8 and min(steps) < STEPS and all(s % 8 == 0 for s in steps)


def causal_tagger():
    """No Keras mask, as a KerasHub causal LM: the padding is a sample weight of 0, and the forward LSTM's step never
    sees the padding after it."""
    inputs = keras.Input((None,), dtype="int32")
    hidden = keras.layers.LSTM(8, return_sequences=True)(keras.layers.Embedding(VOCABULARY, 6)(inputs))
    return keras.Model(inputs, keras.layers.Dense(4)(hidden))


PADDING_WEIGHTS = (TOKENS > 0).astype(np.float32)


def test_a_loss_over_every_position_divides_by_the_uncut_count_to_model_fit_s_weights():
    """sum_over_batch_size (a KerasHub task's default) divides by every position of the batch, padding included:
    a cut micro-batch still divides by the uncut count (trim.uncut_steps), so training and validation end where
    model.fit on whole, uncut batches does."""

    def trained(fit):
        keras.utils.set_random_seed(3)
        model = causal_tagger()
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
        # padded further than the training data: its own uncut count
        val = tuple(np.pad(a[-VALIDATION:], ((0, 0), (0, 6))) for a in (TOKENS, TAGS, PADDING_WEIGHTS))
        logs = fit(
            model,
            dict(
                sample_weight=PADDING_WEIGHTS, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, validation_data=val
            ),
        ).history
        return model.get_weights(), logs

    start = (keras.utils.set_random_seed(3), causal_tagger().get_weights())[1]
    expected, expected_logs = trained(lambda m, args: m.fit(TOKENS, TAGS, **args))
    weights, logs = trained(lambda m, args: accum_train.fit(m, TOKENS, TAGS, subdivisions=K, trim_padding=True, **args))
    assert max_difference(expected, start) > 1e-2
    assert max_difference(weights, expected) < 1e-5
    np.testing.assert_allclose(logs["loss"], expected_logs["loss"], rtol=1e-5)
    np.testing.assert_allclose(logs["val_loss"], expected_logs["val_loss"], rtol=1e-5)


def test_a_loss_over_every_position_of_batches_of_several_lengths_is_refused():
    """A padded_batch pads each batch to its own longest: the count before the cut is not known, so it is refused
    (in one line, before anything trains)."""

    def examples():
        for tokens, tags, weights, length in zip(TOKENS, TAGS, PADDING_WEIGHTS, LENGTHS):
            yield tokens[:length], tags[:length], weights[:length]

    spec = (SEQUENCE, SEQUENCE, tf.TensorSpec([None], tf.float32))
    batches = tf.data.Dataset.from_generator(examples, output_signature=spec).padded_batch(BATCH)
    keras.utils.set_random_seed(3)
    model = causal_tagger()
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(accum_train.UserError) as refused:
        accum_train.fit(model, batches, subdivisions=K, verbose=0, trim_padding=True)
    text = str(refused.value)
    assert text.startswith(
        f"{WHERE}trim_padding changes the number of values the loss of model {model.name!r} averages (a micro-batch "
        f"cut from 24 to "
    )
    assert text.endswith(
        "it divides by every position, padding included (reduction 'sum_over_batch_size'), and the batches' length "
        "before the cut is not fixed: pad every batch to one length, or leave trim_padding out"
    )
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
