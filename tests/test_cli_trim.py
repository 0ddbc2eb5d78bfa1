"""data.trim_padding: the CLI's run of a keras_file sequence model from an .npz, each batch's examples ordered by
length and each micro-batch cut after its longest sequence (accum/trainer/data/feed.py, the cut accum_train.fit
makes).
The oracle is model.fit on whole, uncut batches: 50 examples in batches of 16 (a short one of 2), k=3, two epochs, SGD;
sequences of 1 to 24 tokens of which the shortest are cut to a multiple of 8. Every refusal is one line."""

import accum_train
import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train.cli.plan_text import format_plan
from accum_train.config.parse import config_from_dict
from accum_train.datasets.base import TaskSplit
from accum_train.plan import plan
from accum_train.trainer.data.feed import Feed, Held, TrimmedSplit
from accum_train.trainer.data.timeline import Segment
from helpers import max_difference

N, STEPS, VOCABULARY, BATCH, K, EPOCHS, RATE, MULTIPLE = 50, 24, 30, 16, 3, 2, 0.5, 8
RNG = np.random.default_rng(7)
LENGTHS = RNG.integers(1, STEPS + 1, N)
TOKENS = RNG.integers(1, VOCABULARY, (N, STEPS)).astype(np.int32)
TOKENS[np.arange(STEPS)[None, :] >= LENGTHS[:, None]] = 0
TAGS = RNG.integers(0, 4, (N, STEPS)).astype(np.int32)


def tagger(steps=None, masked=True):
    """Per-token tags of padded sequences: Embedding(mask_zero) then an LSTM (``masked=False``: no mask)."""
    keras.utils.set_random_seed(3)
    tokens = keras.Input((steps,), dtype="int32")
    hidden = keras.layers.Embedding(VOCABULARY, 6, mask_zero=masked)(tokens)
    hidden = keras.layers.LSTM(8, return_sequences=True)(hidden)
    model = keras.Model(tokens, keras.layers.Dense(4)(hidden), name="tagger")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def written(tmp_path, model, **data):
    """The model file, the .npz and the run's config (a dict in the YAML's shape)."""
    model.save(tmp_path / "model.keras")
    np.savez(tmp_path / "data.npz", x_train=TOKENS, y_train=TAGS, x_test=TOKENS[:20], y_test=TAGS[:20])
    return {
        "model": {"name": "keras_file", "path": str(tmp_path / "model.keras")},
        "data": {"name": "npz", "path": str(tmp_path / "data.npz"), "shuffle": False, **data},
        "batch_size": BATCH,
        "subdivisions": K,
        "epochs": EPOCHS,
        "optimizer": {"name": "sgd", "learning_rate": RATE},
    }


def test_a_trimmed_run_ends_at_model_fit_s_weights_on_whole_batches(tmp_path, monkeypatch):
    cuts = []  # the run's feed cuts its micro-batches (traced into its pipeline: at least once)
    uncut = Held.cut
    monkeypatch.setattr(Held, "cut", lambda self, rows, indices: cuts.append(1) or uncut(self, rows, indices))
    config = written(tmp_path, tagger(), trim_padding=MULTIPLE)
    oracle = keras.models.load_model(tmp_path / "model.keras", compile=False)
    oracle.compile(optimizer=keras.optimizers.SGD(RATE), loss=keras.losses.SparseCategoricalCrossentropy(True))
    oracle.fit(TOKENS, TAGS, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    accum_train.run(config, output_dir=tmp_path / "run")
    saved = np.load(tmp_path / "run" / "weights.npz")
    weights = [saved[v.path] for v in oracle.weights]
    assert max_difference(weights, oracle.get_weights()) < 1e-5
    assert cuts
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert records and all('"noise_scale": null' in line for line in records if '"step"' in line)


def test_plan_shows_the_cut(tmp_path):
    config = written(tmp_path, tagger(), trim_padding=MULTIPLE)
    config["epochs"] = 1
    lines = format_plan(plan(config_from_dict(config))).splitlines()
    cut = "each batch ordered by length, each micro-batch cut after its longest sequence (a multiple of 8 steps)"
    assert f"trim_padding   {cut}" in lines
    assert "updates        4 per epoch x 1 epoch = 4" in lines
    noise = "none: data.trim_padding orders each batch by length (the estimate needs micro-batches drawn at random)"
    assert f"noise scale    {noise}" in lines  # as the run says, and measures none


def test_the_feed_orders_each_batch_by_length_and_cuts_each_micro_batch_after_its_longest():
    split = TrimmedSplit(TaskSplit(TOKENS, TAGS), MULTIPLE, "data.trim_padding=8")
    order = RNG.permutation(N)
    feed = Feed(split, order, 0, [Segment(0, 0, 0, N, BATCH)], lambda batch: K, tf.distribute.get_strategy(), [0])
    elements = [element for element, _ in zip(feed.iterator, range(sum(u.pulls for u in feed.updates)))]
    first = 0
    steps_seen = []
    for planned in feed.updates:
        batch = order[first : first + planned.n]
        first += planned.n
        pulled, elements = elements[: planned.pulls], elements[planned.pulls :]
        padded = [np.pad(x.numpy(), [(0, 0), (0, STEPS - x.shape[1])]) for (x, _), _ in pulled]
        rows = np.concatenate(padded)  # the cut took only padding: padded again, the batch's own rows
        lengths = (rows != 0).sum(axis=1)
        assert sorted(map(tuple, rows)) == sorted(map(tuple, TOKENS[batch]))
        assert list(lengths) == sorted(lengths, reverse=True)  # longest first
        for (x, y), _ in pulled:
            longest = int((x.numpy() != 0).sum(axis=1).max(initial=0))
            steps = x.shape[1]
            assert steps == min(STEPS, max(MULTIPLE, -(-longest // MULTIPLE) * MULTIPLE)) == y.shape[1]
            steps_seen.append(steps)
    assert min(steps_seen) < STEPS  # something was cut


SOURCE = "config"  # what a dict config's errors name
REFUSED = {
    # name: (model, data keys, other config keys, message)
    "built-in model": (
        None,
        {"trim_padding": 8},
        {"model": {"name": "mlp"}},
        "data.trim_padding=8 cuts the padding of sequences a keras_file model takes, not mlp's images: remove it",
    ),
    "python stream": (
        tagger,
        {"name": "python", "factory": "f:g", "trim_padding": 8},
        {},
        "data.trim_padding is only for data.name=npz, not python: a stream is not read by index: cut the padding in "
        "the factory's pipeline",
    ),
    "mirrored": (
        tagger,
        {"trim_padding": 8},
        {"strategy": {"name": "mirrored"}},
        "data.trim_padding=8 runs on one replica, and strategy.name=mirrored trains on several: remove one of them",
    ),
    "noise-scale rule": (
        tagger,
        {"trim_padding": 8},
        {
            "micro_batch_size": 4,
            "subdivisions": None,
            "batch_schedule": {"rule": "noise_scale", "max_batch_size": 32},
        },
        "data.trim_padding=8 orders each batch by length, and batch_schedule's noise_scale rule measures "
        "micro-batches drawn at random: remove one of them",
    ),
    "fixed length": (
        lambda: tagger(steps=STEPS),
        {"trim_padding": 8},
        {},
        f"data.trim_padding=8: trim_padding gives micro-batches of several lengths, and model 'tagger' takes inputs "
        f"of shape (None, {STEPS}): build it on keras.Input(shape=(None, ...)), or leave trim_padding out",
    ),
    "no mask": (
        lambda: tagger(masked=False),
        {"trim_padding": 8},
        {},
        "data.trim_padding=8: trim_padding changes the loss summed of model 'tagger' (a micro-batch cut from 24 to ",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_cut_that_cannot_be_exact_is_refused_in_one_line_before_anything_trains(tmp_path, case):
    build, data, other, message = REFUSED[case]
    config = written(tmp_path, (build or tagger)(), **data)
    config.update(other)
    config["data"] = {
        key: value for key, value in config["data"].items() if not (case == "python stream" and key == "path")
    }
    with pytest.raises(accum_train.UserError) as refused:
        accum_train.run(config, output_dir=tmp_path / "run")
    text = str(refused.value)
    assert "\n" not in text
    if case == "no mask":
        assert text.startswith(message) and text.endswith("or leave trim_padding out")
    else:
        assert text.split(": ", 1)[-1] == message or text == message, text
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_keras_file_on_class_labels_is_refused(tmp_path):
    """A keras_file without a loss trains with the built-in cross-entropy on images: nothing to cut."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(3)])
    model.save(tmp_path / "model.keras")  # not compiled: the built-in loss
    images = RNG.integers(0, 256, (N, 4, 4), dtype=np.uint8)
    labels = RNG.integers(0, 3, N)
    np.savez(tmp_path / "data.npz", x_train=images, y_train=labels, x_test=images[:10], y_test=labels[:10])
    config = {
        "model": {"name": "keras_file", "path": str(tmp_path / "model.keras")},
        "data": {"name": "npz", "path": str(tmp_path / "data.npz"), "trim_padding": 8},
        "batch_size": BATCH,
        "subdivisions": K,
    }
    with pytest.raises(accum_train.UserError) as refused:
        accum_train.run(config, output_dir=tmp_path / "run")
    assert str(refused.value) == (
        f"data.trim_padding=8: it cuts the sequences a Keras loss trains on, and model.path={tmp_path / 'model.keras'} "
        f"trains with the built-in cross-entropy on class labels: give loss: in the YAML, or remove data.trim_padding"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()
