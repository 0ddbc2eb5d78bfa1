"""KerasHub tasks that carry their preprocessor, through accum_train.fit as task.fit takes them: raw texts batched
by batch_size, the preprocessor mapped over each whole batch, then the micro-batch cut. task.fit on whole batches is
the oracle (1e-5), for a text classifier and a causal LM, with validation split off the raw arrays or given raw, and
with trim_padding under the causal LM's default loss (sum_over_batch_size). The text classifier trains with SGD:
under Adam, model.fit squares an Embedding's gradient slice by slice (docs/fit.md). Both sides run in this process,
under its pinned thread pools (conftest)."""

import json

import accum_train
import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from accum_train.keras_fit.train import _ENGINES
from accum_train.trainer.data.batching import Cut
from accum_train.trainer.data.stream_feed import DatasetFeed
from accum_train.trainer.data.task_feed import preprocessed
from helpers import max_difference
from hub_tasks import causal_lm, text_classifier, texts

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
TEXTS, LABELS = texts(100, seed=1), np.arange(100) % 3


def classifier_compiled(lora_rank=None):
    model = text_classifier()
    if lora_rank:
        model.backbone.enable_lora(lora_rank)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS, metrics=["accuracy"])
    return model


def causal_lm_compiled(sequence_length=16, lora_rank=None):
    """The causal LM's default loss and weighted accuracy, at a rate that moves its weights in a few updates; with
    ``lora_rank``, only the backbone's LoRA matrices trainable."""
    model = causal_lm(sequence_length)
    if lora_rank:
        model.backbone.enable_lora(lora_rank)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=LOSS, weighted_metrics=["accuracy"])
    return model


def raw_batches(values, size):
    return tf.data.Dataset.from_tensor_slices(values).batch(size)


# name: (the compiled task, task.fit's arguments, accum_train.fit's own)
CASES = {
    "text classifier with LoRA: a list of strings, validation_split": (
        lambda: classifier_compiled(lora_rank=2),
        dict(x=TEXTS, y=LABELS, batch_size=30, validation_split=0.2),
        dict(x=list(TEXTS), micro_batch_size=8),  # a list, which model.fit's validation_split refuses
    ),
    "causal LM: a dataset of raw batches, raw validation batches": (
        causal_lm_compiled,
        dict(x=raw_batches(TEXTS[:90], 30), validation_data=raw_batches(TEXTS[90:], 4)),
        dict(subdivisions=3),
    ),
    "causal LM with LoRA: trim_padding, validation (x, None)": (
        lambda: causal_lm_compiled(48, lora_rank=2),
        dict(x=TEXTS[:80], batch_size=25, validation_data=(TEXTS[80:], None)),
        dict(micro_batch_size=8, trim_padding=8),
    ),
}


# the LoRA classifier's case, about 10 s, in the slow suite: the quick suite keeps LoRA through the causal LM's
SLOW = {"text classifier with LoRA: a list of strings, validation_split"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_a_task_with_its_preprocessor_ends_at_task_fit_s_weights(case):
    build, theirs, ours = CASES[case]

    def trained(fit, args):
        keras.utils.set_random_seed(3)
        model = build()
        start = [v.numpy() for v in model.trainable_variables]
        frozen = [v.numpy() for v in model.non_trainable_variables]
        logs = fit(model, **args, epochs=2, verbose=0).history
        after = [v.numpy() for v in model.non_trainable_variables]
        assert all(np.array_equal(a, b) for a, b in zip(frozen, after))  # LoRA's frozen weights untouched
        return model, start, [v.numpy() for v in model.trainable_variables], logs

    _, start, expected, expected_logs = trained(lambda model, **a: model.fit(**a), theirs)
    model, _, weights, logs = trained(accum_train.fit, {**theirs, **ours})
    assert max_difference(expected, start) > 1e-2
    assert max_difference(weights, expected) < 1e-5
    # the gradient cache holds the trainable variables alone, in float32
    slots = [slot for engine in _ENGINES[model].values() for cache in engine[0].caches for slot in cache.slots]
    assert [tuple(s.shape) for s in slots] == [tuple(v.shape) for v in model.trainable_variables]
    assert {s.dtype for s in slots} == {tf.float32}
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(logs[key], expected_logs[key], rtol=1e-5)


def test_trim_padding_cuts_each_preprocessed_micro_batch_after_its_longest_sequence():
    """The causal LM's preprocessor pads every batch to 48 tokens; the feed cuts each micro-batch's token_ids,
    padding_mask, targets and sample weights after its longest sequence (rounded up to 8), and only those."""
    model = causal_lm(48)
    batches = preprocessed(model, TEXTS[:50], None, None, 25)
    feed = DatasetFeed(batches, batch_size=None, class_weight=None, steps_per_epoch=None, trim=8)
    elements = list(feed.dataset(0, 0, Cut(3, 1, (0,))).take(6).as_numpy_iterator())
    widths = []
    for (x, y, weights), _ in elements:
        longest = int(x["padding_mask"].sum(axis=1).max())
        width = x["token_ids"].shape[1]
        assert width == min(-(-longest // 8) * 8, 48)
        assert x["padding_mask"].shape[1] == y.shape[1] == weights.shape[1] == width
        widths.append(width)
    assert max(widths) < 48  # the texts are short: every micro-batch lost padding


def test_what_a_task_s_preprocessing_cannot_take_is_refused_in_one_line():
    model = causal_lm_compiled()
    name = model.name
    cases = [
        (
            dict(
                x=TEXTS, batch_size=20, batch_schedule=[{"epoch": 1, "batch_size": 20}, {"epoch": 2, "batch_size": 40}]
            ),
            f"accum_train.fit: batch_schedule re-cuts arrays into batches each epoch, and model {name!r} preprocesses "
            f"whole batches of raw examples: leave batch_schedule out, or preprocess the data yourself and pass the "
            f"model with preprocessor=None",
        ),
        (
            dict(x=iter([TEXTS[:10]])),
            f"accum_train.fit: x is a list_iterator, and model {name!r} preprocesses its inputs in fit: pass arrays or "
            f"lists of raw examples, or a tf.data.Dataset of raw batches",
        ),
        (
            dict(x=raw_batches(TEXTS, 10), batch_size=10),
            f"accum_train.fit: x is a tf.data.Dataset of raw batches for model {name!r}'s preprocessor: leave "
            f"batch_size out (batch the dataset, and put targets and weights in its elements)",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(accum_train.UserError) as raised:
            accum_train.fit(model, **kwargs, verbose=0)
        assert str(raised.value) == message


def test_class_labels_past_the_task_s_classes_are_refused_before_preprocessing():
    """Labels held in memory are checked as for any model (limitations.md), also where the task's preprocessing
    would make them a stream first: a Python list of labels here, one past the last of 3 classes."""
    model = classifier_compiled()
    before = model.get_weights()
    labels = [int(v) for v in LABELS]
    labels[7] = 3
    with pytest.raises(accum_train.UserError) as raised:
        accum_train.fit(model, TEXTS, labels, batch_size=20, subdivisions=2, verbose=0)
    assert str(raised.value) == (
        f"accum_train.fit: y[7] holds class 3, and model {model.name!r} outputs 3 classes: its sparse categorical "
        f"cross-entropy takes labels 0 to 2"
    )
    assert max_difference(model.get_weights(), before) == 0.0


def test_a_task_whose_compute_loss_is_its_own_is_refused():
    class OwnLoss(keras_hub.models.GPT2CausalLM):
        def compute_loss(self, *args, **kwargs):
            return super().compute_loss(*args, **kwargs)

    plain = causal_lm()
    model = OwnLoss(plain.backbone, preprocessor=plain.preprocessor)
    with pytest.raises(accum_train.UserError) as raised:
        accum_train.fit(model, TEXTS, batch_size=10, verbose=0)
    assert str(raised.value) == (
        f"accum_train.fit: model {model.name!r} overrides compute_loss, which accum_train.fit does not call (it "
        f"differentiates the compiled loss itself, micro-batch by micro-batch): compile the loss with "
        f"compile(loss=...), or train with model.fit"
    )


def guide_example(repo_root, name):
    page = (repo_root / "docs" / "keras-hub.md").read_text()
    return page.split(f"<!-- python example: {name} -->\n```python\n", 1)[1].split("```", 1)[0]


OFFLINE = {  # the guide's presets, as tiny tasks built offline (hub_tasks.py)
    'keras_hub.models.GPT2CausalLM.from_preset("gpt2_base_en")': "causal_lm(64)",
    'keras_hub.models.BertTextClassifier.from_preset("bert_tiny_en_uncased", num_classes=2)': "text_classifier(16, 2)",
}


def run_offline(block, capsys):
    script = block
    for preset, tiny in OFFLINE.items():
        script = script.replace(preset, tiny)
    assert script != block  # a preset was replaced
    exec(compile("from hub_tasks import causal_lm, text_classifier\n" + script, "keras-hub.md", "exec"), {})
    return capsys.readouterr().out.splitlines()


@pytest.mark.slow  # about 10 s: the guide's whole example, trained
def test_the_guide_s_opening_example_runs_as_written_offline_and_its_run_reads_raw_text(
    repo_root, tmp_path, monkeypatch, capsys
):
    """keras-hub.md opens with a task built from its config, with an inline vocabulary: it runs as written (no
    preset: nothing to download), trains, and predict reads raw text of its run through its preprocessor."""
    from accum_train.cli.main import main
    from click.testing import CliRunner

    monkeypatch.chdir(tmp_path)
    block = guide_example(repo_root, "keras-hub offline")
    assert "from_preset" not in block
    exec(compile(block, "keras-hub.md", "exec"), {})
    (printed,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("loss: ")]
    losses = json.loads(printed.removeprefix("loss: "))
    assert len(losses) == 3 and losses[2] < losses[0]
    run_dir = tmp_path / "runs" / "tiny-lm"
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 12  # 64 texts, 16 per update, 3 epochs
    (tmp_path / "prompts.txt").write_text("the cat\n")
    result = CliRunner().invoke(main, ["predict", str(run_dir), "prompts.txt", "--json"])
    assert result.exit_code == 0, result.stderr
    (row,) = json.loads(result.stdout)
    # up to the padding: the start token, "the cat" as this vocabulary splits it (t, h, e, " c", a, t), the end token
    assert (row["input"], [t["position"] for t in row["tokens"]]) == ("prompts.txt:1", list(range(8)))


def test_the_guide_s_causal_lm_example_runs_offline_and_the_same_call_again_resumes(
    repo_root, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.txt").write_text("\n".join(texts(64, seed=4)) + "\n")
    block = guide_example(repo_root, "keras-hub causal lm")
    (printed,) = [line for line in run_offline(block, capsys) if line.startswith("loss: ")]
    losses = json.loads(printed.removeprefix("loss: "))
    assert len(losses) == 2 and losses[1] < losses[0]
    summary = tmp_path / "runs" / "lora" / "summary.json"
    assert json.loads(summary.read_text())["steps"] == 4  # 64 texts, 32 per update, 2 epochs
    # again: the run directory is continued (both epochs are in it: nothing to train) and its history returned
    (printed,) = [line for line in run_offline(block, capsys) if line.startswith("loss: ")]
    assert json.loads(printed.removeprefix("loss: ")) == losses
    assert json.loads(summary.read_text())["steps"] == 4


def test_the_guide_s_classifier_example_runs_offline(repo_root, capsys):
    printed = run_offline(guide_example(repo_root, "keras-hub classifier"), capsys)
    (printed,) = [line for line in printed if line.startswith("loss: ")]
    losses = json.loads(printed.removeprefix("loss: "))
    assert len(losses) == 1 and np.isfinite(losses[0])


@pytest.mark.slow  # a GPT-2 of 172,288 parameters over 128 steps, twice
def test_trim_padding_takes_the_stock_gpt2_whose_key_biases_get_rounding_noise(repo_root, monkeypatch):
    """An attention key bias adds one number to all of a query's scores, which the softmax cancels: its gradient is
    zero in exact arithmetic and float32 noise of about 1e-9 whole and cut. The check that padding changes nothing
    holds each gradient to its own size or a thousandth of the largest, so it takes the model as KerasHub builds it
    (it refused it when each was held to its own size alone). The model and first batch of
    benchmarks/peers_causal_lm.py's distance, one update under mean_with_sample_weight, against model.fit."""
    import argparse

    from helpers import load_file

    monkeypatch.syspath_prepend(str(repo_root / "benchmarks"))
    bench = load_file(repo_root / "benchmarks" / "peers_causal_lm.py", "peers_causal_lm")
    args = argparse.Namespace(V=1000, L=2, heads=4, D=64, T=128, k=8, micro=8, seed=0)
    x, y, w, _ = bench.make_data(3 * 64, args, "uneven")
    x, y, w = {key: value[:64] for key, value in x.items()}, y[:64], w[:64]

    def trained(fit):
        model = bench.build_model(args)
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=bench.loss("mean_with_sample_weight"))
        fit(model)
        return [v.numpy() for v in model.trainable_variables]

    expected = trained(lambda m: m.fit(x, y, sample_weight=w, batch_size=64, shuffle=False, verbose=0))
    weights = trained(
        lambda m: accum_train.fit(
            m, x, y, sample_weight=w, batch_size=64, subdivisions=8, trim_padding=True, shuffle=False, verbose=0
        )
    )
    assert max_difference(weights, expected) < 1e-5
