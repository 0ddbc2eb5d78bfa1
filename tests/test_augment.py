"""data.augment (random crops and flips) and data.validation, asserted with numbers.

Augmentation draws are a function of (seed, update, position in the global
batch): the same update gives the same images, a worker's rows are the rows of
the whole batch, and a run killed and resumed reaches an uninterrupted run's
weights. The validation split is a fixed choice held out of training.
"""

import json

import numpy as np
import pytest
import tensorflow as tf
from accum_train.backends.tensorflow.backend import Augment
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.config import AugmentConfig, load_config
from accum_train.datasets import load
from accum_train.from_config.lifecycle import train
from accum_train.trainer.data.order import epoch_order
from accum_train.trainer.store.metrics_log import read_metrics
from accum_train.trainer.store.rundir import RunDirectory
from helpers import max_difference, records

N, SIZE = 64, 12
ROW, COL = 5, 3  # one bright pixel per image, away from the border by more than the crop


def augmenter(cfg: AugmentConfig, seed: int):
    """data.augment's draws, called eagerly as the micro-step calls them in its graph."""
    return Augment(cfg.flip, cfg.crop, seed).rows


def dots():
    x = np.zeros((N, SIZE, SIZE, 1), np.float32)
    x[:, ROW, COL, 0] = 1.0
    return tf.constant(x)


def where_the_dot_is(x):
    x = np.asarray(x)[..., 0]
    found = [np.argwhere(image > 0) for image in x]
    assert all(len(f) == 1 for f in found), "each image keeps exactly one bright pixel"
    assert np.allclose(x.sum(axis=(1, 2)), 1.0)
    return np.array([f[0] for f in found])


def test_crop_shifts_each_image_by_its_own_offset_within_the_padding():
    moved = where_the_dot_is(augmenter(AugmentConfig(crop=2), seed=0)(dots(), step=0, n=N))
    shifts = moved - [ROW, COL]
    assert np.abs(shifts).max() <= 2
    assert len({tuple(s) for s in shifts}) >= 15  # of the 25 possible: per example, not one for the batch


def test_flip_mirrors_about_half_the_images_left_right():
    cols = where_the_dot_is(augmenter(AugmentConfig(flip=True), seed=0)(dots(), step=3, n=N))[:, 1]
    assert set(cols) == {COL, SIZE - 1 - COL}
    assert 16 <= int(np.sum(cols == COL)) <= 48


@pytest.mark.parametrize("cfg", [AugmentConfig(crop=3), AugmentConfig(flip=True), AugmentConfig(crop=1, flip=True)])
def test_draws_depend_on_seed_and_update_only(cfg):
    x = tf.constant(np.random.default_rng(0).random((N, SIZE, SIZE, 2), np.float32))
    augment = augmenter(cfg, seed=7)
    first = augment(x, step=11, n=N).numpy()
    np.testing.assert_array_equal(first, augmenter(cfg, seed=7)(x, step=11, n=N).numpy())  # a resumed run
    assert not np.array_equal(first, augment(x, step=12, n=N).numpy())
    assert not np.array_equal(first, augmenter(cfg, seed=8)(x, step=11, n=N).numpy())


@pytest.mark.parametrize("begin, end", [(0, 32), (32, 64), (21, 43)])
def test_a_workers_rows_are_those_rows_of_the_whole_batch(begin, end):
    x = tf.constant(np.random.default_rng(1).random((N, SIZE, SIZE, 1), np.float32))
    augment = augmenter(AugmentConfig(crop=2, flip=True), seed=0)
    whole = augment(x, step=5, n=N).numpy()
    np.testing.assert_array_equal(augment(x[begin:end], step=5, n=N, begin=begin).numpy(), whole[begin:end])


def test_no_augmentation_leaves_the_batch_alone():
    x = dots()
    assert augmenter(AugmentConfig(), seed=0)(x, step=0, n=N) is x


def test_validation_is_a_fixed_choice_held_out_of_training(data_dir):
    cfg = load_config(None, [f"data.dir={data_dir}", "data.train_limit=2000", "data.validation=500", "batch_size=100"])
    data, again = load(cfg.data), load(cfg.data)
    full = load(load_config(None, [f"data.dir={data_dir}", "data.train_limit=2000", "batch_size=100"]).data)
    assert (len(data.train), len(data.validation)) == (1500, 500)
    np.testing.assert_array_equal(data.validation.labels, again.validation.labels)
    np.testing.assert_array_equal(data.validation.images, again.validation.images)
    # disjoint and together the whole training split: match rows of the full split
    rows = {image.tobytes(): i for i, image in enumerate(full.train.images)}
    held = sorted(rows[image.tobytes()] for image in data.validation.images)
    kept = sorted(rows[image.tobytes()] for image in data.train.images)
    assert sorted(held + kept) == list(range(2000))
    assert held != list(range(1500, 2000))  # a random choice, not the file's tail
    assert len(set(data.validation.labels)) == 10  # every class


class KilledAfter(BaseException):
    """Stands in for kill -9: nothing after it runs, no handler catches it."""


@pytest.mark.slow  # a resume with augmentation: 3 runs
def test_augmented_run_killed_and_resumed_reaches_the_uninterrupted_weights(tmp_path, repo_root, monkeypatch):
    # 900 examples, 300 of them held out: 600 to train on, 9 full batches of 64 and a short one of 24 per epoch
    # (smoke.yaml's 2700 made 43 updates an epoch, three runs of seconds each, and checked nothing more)
    overrides = ["data.augment.crop=2", "data.augment.flip=true", "data.validation=300", "data.train_limit=900"]
    overrides += ["checkpoint.every_steps=2"]
    cfg = load_config(repo_root / "configs" / "smoke.yaml", overrides)
    whole = train(cfg, tmp_path / "whole")
    real_save, saves = RunDirectory.save, [0]

    def save_then_die(self, step):
        real_save(self, step)
        saves[0] += 1
        if saves[0] == 5:  # ckpt-0, 2, 4, 6, then dies at 8 of 2 x 10 updates: mid-epoch 1, its short batch ahead
            raise KilledAfter(step)

    monkeypatch.setattr(RunDirectory, "save", save_then_die)
    with pytest.raises(KilledAfter) as killed:
        train(cfg, tmp_path / "cut")
    assert int(killed.value.args[0]) == 8  # where the comment above says
    monkeypatch.undo()
    resumed = train(cfg, tmp_path / "cut", resume=True)
    assert resumed["steps"] == whole["steps"] == 20
    a, b = np.load(tmp_path / "whole" / "weights.npz"), np.load(tmp_path / "cut" / "weights.npz")
    assert sorted(a.files) == sorted(b.files)
    assert max_difference(a, b) < 1e-6
    assert resumed["validation_accuracy"] == pytest.approx(whole["validation_accuracy"], abs=1e-9)
    epochs = [r for r in records(tmp_path / "cut") if "test_accuracy" in r]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert [e["validation_accuracy"] for e in epochs] == [
        e["validation_accuracy"] for e in read_metrics(tmp_path / "whole" / "metrics.jsonl") if "test_accuracy" in e
    ]
    assert json.loads((tmp_path / "cut" / "run.json").read_text())["data"]["validation_examples"] == 300


def by_hand(raw: np.ndarray, seed: int, step: int, crop: int) -> np.ndarray:
    """Crop and flip in numpy, from the draws the augmentation is specified by: (seed, update) seeds one
    (top, left) per example and, offset by 2^40, one coin per example."""
    n, height, width = raw.shape[:3]
    key = tf.constant([seed, step], tf.int64)
    corners = tf.random.stateless_uniform([n, 2], key, 0, 2 * crop + 1, tf.int32).numpy()
    mirror = tf.random.stateless_uniform([n], key + [0, 1 << 40], 0, 2, tf.int32).numpy() > 0
    padded = np.pad(raw, [(0, 0), (crop, crop), (crop, crop), (0, 0)])
    out = np.stack([padded[i, top : top + height, left : left + width] for i, (top, left) in enumerate(corners)])
    out[mirror] = out[mirror][:, :, ::-1]
    return out


def test_the_engine_trains_on_the_batch_cropped_and_flipped_as_drawn(tmp_path, repo_root, monkeypatch):
    # a small MLP: what is checked is the batch the engine receives, whatever it trains
    cfg = load_config(
        repo_root / "configs" / "smoke.yaml",
        [
            "model.name=mlp",
            "model.hidden=32",
            "data.augment.crop=2",
            "data.augment.flip=true",
            "data.train_limit=256",
            "data.test_limit=100",
            "epochs=1",
        ],
    )
    received = []
    original = Accumulator.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        prepare = self.prepare

        def seen(element, n):  # each micro-batch as the micro-step trains on it, and where it sits
            x, y, weights = prepare(element, n)
            record = lambda x, where: received.append((x.numpy(), *where.numpy())) or 0  # noqa: E731
            done = tf.py_function(record, [x, element[1]], tf.int32)
            with tf.control_dependencies([done]):
                return tf.identity(x), y, weights

        self.prepare = seen

    monkeypatch.setattr(Accumulator, "__init__", init)
    train(cfg, tmp_path / "run")
    data = load(cfg.data)
    order = epoch_order(cfg.seed, 0, len(data.train))
    batches = {}
    for x, step, _begin in sorted(received, key=lambda r: (r[1], r[2])):
        batches.setdefault(step, []).append(x)
    received = [np.concatenate(parts) for _, parts in sorted(batches.items())]
    assert len(received) == 4 and all(len(x) == 64 for x in received)  # 256 / 64
    for step, x in enumerate(received):
        raw = data.train.take(order[64 * step : 64 * (step + 1)])[0].numpy()
        np.testing.assert_array_equal(x, by_hand(raw, cfg.seed, step, crop=2))
        assert np.mean(np.any(x != raw, axis=(1, 2, 3))) > 0.9  # hardly any image is left as it was


def test_validation_figures_are_an_evaluation_of_the_held_out_examples(tmp_path, repo_root):
    from accum_train.reload import load_run

    # 600 examples, 300 held out: 5 updates of a small MLP give a model whose figures can be checked
    sets = ["model.name=mlp", "model.hidden=32", "data.train_limit=600", "data.test_limit=100"]
    cfg = load_config(repo_root / "configs" / "smoke.yaml", [*sets, "data.validation=300", "epochs=1"])
    summary = train(cfg, tmp_path / "run")
    (record,) = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "test_accuracy" in r]
    held_out = load(cfg.data).validation
    model = load_run(tmp_path / "run").model  # its one epoch-end checkpoint: the weights the record saw
    logits = model.forward(tf.constant(held_out.take(np.arange(len(held_out)))[0]), False).numpy().astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    accuracy = float(np.mean(logits.argmax(axis=1) == held_out.labels))
    loss = float(-np.mean(log_softmax[np.arange(len(held_out)), held_out.labels]))
    assert record["validation_accuracy"] == summary["validation_accuracy"] == accuracy
    assert record["validation_loss"] == pytest.approx(loss, abs=1e-5)
