"""`accum-train export`, `predict` and `evaluate --data` on fit run directories the plain case does not cover: a
KerasHub LoRA fine-tune (the LoRA kernels the model file does not rebuild), a model file that does not fit the
checkpoint (one line, no traceback).

The numbers are the trained model's in memory, to 1e-6."""

import json
import warnings

import accum_train
import keras
import numpy as np
import pytest
from accum_train.cli.main import main
from accum_train.errors import RunDirError
from accum_train.reload import load_fit_run
from click.testing import CliRunner
from helpers import small_regressor
from hub_tasks import causal_lm, text_classifier, texts

X = np.random.default_rng(7).random((40, 6), dtype=np.float32)
Y = X[:, :1] * 2.0


def preprocessed(task, sentences):
    """The model's inputs for ``sentences``: what the task's preprocessor makes of them, as arrays."""
    x = task.preprocessor(sentences)
    x = x[0] if isinstance(x, tuple) else x
    return {name: np.asarray(value) for name, value in x.items()}


def bare_outputs(task, x):
    """``task``'s outputs for preprocessed ``x``, its preprocessor left out (and put back)."""
    kept = task.preprocessor
    task.preprocessor = None
    try:
        return task.predict(x, verbose=0)
    finally:
        task.preprocessor = kept


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    """(run directory, the trained task, preprocessed inputs): keras-hub.md's LoRA fine-tune of a tiny GPT-2."""
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    keras.utils.set_random_seed(3)
    task = causal_lm()
    task.backbone.enable_lora(rank=2)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    task.compile(optimizer=keras.optimizers.Adam(0.05), loss=loss, weighted_metrics=["accuracy"])
    accum_train.fit(
        task, list(texts(32)), batch_size=16, subdivisions=2, epochs=1, seed=1, verbose=0, output_dir=run_dir
    )
    return run_dir, task, preprocessed(task, list(texts(6, seed=9)))


def test_a_lora_fine_tune_is_reloaded_with_its_lora_kernels(lora):
    run_dir, trained, x = lora
    reloaded = load_fit_run(run_dir, compile=False)
    assert len(reloaded.variables) == len(trained.variables) == 24  # 20 of the backbone and head, 4 of LoRA
    for got, expected in zip(reloaded.variables, trained.variables):
        assert got.path == expected.path and np.array_equal(got.numpy(), expected.numpy())
    expected = bare_outputs(trained, x)
    assert np.abs(bare_outputs(reloaded, x) - expected).max() <= 1e-6
    # without the LoRA kernels the outputs are far off: the test measures them
    initial = keras.models.load_model(run_dir / "initial_model.keras", compile=False)
    assert np.abs(bare_outputs(initial, x) - expected).max() > 1e-2


def test_export_of_a_lora_fine_tune_writes_a_file_that_predicts_what_the_trained_model_does(lora, tmp_path):
    run_dir, trained, x = lora
    out = tmp_path / "lm.keras"
    result = CliRunner().invoke(main, ["export", str(run_dir), "--output", str(out)])
    assert (result.exit_code, result.stdout) == (0, f"written: {out}\n"), result.stderr
    exported = keras.models.load_model(out, compile=False)  # Keras saves each LoRA layer's kernel merged
    assert len(exported.variables) == 20
    assert np.abs(bare_outputs(exported, x) - bare_outputs(trained, x)).max() <= 1e-6


def regressor_run(run_dir):
    accum_train.fit(
        small_regressor(), X, Y, batch_size=8, subdivisions=2, epochs=1, seed=1, verbose=0, output_dir=run_dir
    )


def test_a_model_file_that_does_not_fit_the_checkpoint_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    regressor_run(run_dir)
    other = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(1)])
    other.save(run_dir / "initial_model.keras")
    result = CliRunner().invoke(main, ["export", str(run_dir), "--output", str(tmp_path / "x.keras")])
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        f"error: the checkpoint of {run_dir} does not fit the model rebuilt from initial_model.keras: 4 variables "
        f"there, 4 here, variable 0 of shape (6, 8) there, (6, 5) here: build the model in Python as fit trained it "
        f"and pass it: accum_train.reload.load_fit_run("
        f"{str(run_dir)!r}, model=model)\n"
    )
    assert not (tmp_path / "x.keras").exists()


def test_the_model_passed_takes_the_checkpoint_s_weights_or_one_line(tmp_path):
    run_dir = tmp_path / "run"
    regressor_run(run_dir)
    trained = load_fit_run(run_dir)
    given = load_fit_run(run_dir, model=small_regressor())
    for got, expected in zip(given.get_weights(), trained.get_weights()):
        assert np.array_equal(got, expected)
    # the same shapes in another dtype: the restore itself refuses, in one line
    wide = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="tanh", dtype="float64"), keras.layers.Dense(1)]
    )
    with pytest.raises(RunDirError) as caught:
        load_fit_run(run_dir, model=wide)
    message = str(caught.value)
    assert message.startswith(f"cannot restore the checkpoint {run_dir / 'checkpoints'}/ckpt-")
    assert message.endswith(
        f"build the model in Python as fit trained it and pass it: accum_train.reload.load_fit_run("
        f"{str(run_dir)!r}, model=model)"
    )
    assert len(message.splitlines()) == 1


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """(run directory, the trained task, preprocessed inputs, labels): a tiny BERT classifier trained with its
    preprocessor on raw texts."""
    run_dir = tmp_path_factory.mktemp("classifier") / "run"
    keras.utils.set_random_seed(4)
    task = text_classifier()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # not the task's default metric: evaluate must give what fit trained with (load_model leaves a KerasHub task,
    # whose compile() is its own, with its default compile)
    top2 = keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")
    task.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss, metrics=[top2])
    labels = np.random.default_rng(0).integers(0, 3, 48)
    accum_train.fit(
        task, list(texts(48)), labels, batch_size=16, subdivisions=4, epochs=2, seed=1, verbose=0, output_dir=run_dir
    )
    return run_dir, task, preprocessed(task, list(texts(10, seed=5))), np.arange(10) % 3


def test_predict_takes_a_task_s_preprocessed_arrays_as_its_model_takes_them(classifier, lora, tmp_path):
    for name, (run_dir, trained, x, *_) in {"classifier": classifier, "lora": lora}.items():
        inputs, out = tmp_path / f"{name}-inputs.npz", tmp_path / f"{name}-outputs.npz"
        np.savez(inputs, **{f"x_{key}": value for key, value in x.items()})
        result = CliRunner().invoke(main, ["predict", str(run_dir), str(inputs), "--output", str(out)])
        assert result.exit_code == 0, result.stderr
        expected = bare_outputs(trained, x)
        assert np.abs(np.load(out)["outputs"] - expected).max() <= 1e-6, name


def test_evaluate_takes_a_task_s_preprocessed_arrays_and_gives_model_evaluate_s_numbers(classifier, tmp_path):
    run_dir, trained, x, y = classifier
    data, out = tmp_path / "data.npz", tmp_path / "eval"
    np.savez(data, **{f"x_{key}": value for key, value in x.items()}, y=y)
    result = CliRunner().invoke(main, ["evaluate", str(run_dir), "--data", str(data), "--output-dir", str(out)])
    assert result.exit_code == 0, result.stderr
    kept = trained.preprocessor
    trained.preprocessor = None
    try:
        expected = trained.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    finally:
        trained.preprocessor = kept
    written = json.loads((out / "evaluate.json").read_text())
    assert abs(written["test_loss"] - expected["loss"]) <= 1e-6
    assert sorted(written) == ["batch_size", "data", "run_dir", "test_examples", "test_loss", "test_top2"]
    assert abs(written["test_top2"] - expected["top2"]) <= 1e-6
    assert written["test_examples"] == 10


def test_evaluate_says_in_one_line_which_label_is_out_of_range_and_writes_nothing(classifier, tmp_path):
    run_dir, trained, x, y = classifier
    data, out = tmp_path / "data.npz", tmp_path / "eval"
    np.savez(data, **{f"x_{key}": value for key, value in x.items()}, y=np.where(np.arange(10) == 4, 7, y))
    result = CliRunner().invoke(main, ["evaluate", str(run_dir), "--data", str(data), "--output-dir", str(out)])
    assert (result.exit_code, result.stdout, sorted(p.name for p in tmp_path.iterdir())) == (2, "", ["data.npz"])
    assert result.stderr == (
        f"error: --data {data}: y[4] holds class 7, and model {trained.name!r} outputs 3 classes: its sparse "
        f"categorical cross-entropy takes labels 0 to 2\n"
    )


def test_inputs_longer_than_the_model_takes_are_one_line_for_predict_and_evaluate(lora, tmp_path):
    run_dir, trained, _ = lora
    longer = trained.backbone.max_sequence_length + 16  # past the position embedding's table
    ids = np.ones((2, longer), np.int32)
    np.savez(tmp_path / "x.npz", x_token_ids=ids, x_padding_mask=ids.astype(bool))
    np.savez(tmp_path / "xy.npz", x_token_ids=ids, x_padding_mask=ids.astype(bool), y=ids)
    said = f"Expected size[0] in [0, {trained.backbone.max_sequence_length}], but got {longer}"
    cases = [
        (
            ["predict", str(run_dir), str(tmp_path / "x.npz")],
            f"{tmp_path / 'x.npz'}: the model of {run_dir} cannot take these inputs ({said}): save them as it took "
            "its training inputs",
        ),
        (
            ["evaluate", str(run_dir), "--data", str(tmp_path / "xy.npz"), "--output-dir", str(tmp_path / "ev")],
            f"--data {tmp_path / 'xy.npz'}: the model of {run_dir} cannot evaluate it ({said}): save x as the model "
            "takes it and y as its loss takes it",
        ),
    ]
    for args, line in cases:
        result = CliRunner().invoke(main, args)
        assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {line}\n")
    assert not (tmp_path / "ev").exists()


def test_the_readers_load_a_lora_fine_tune_without_keras_optimizer_warning(lora, tmp_path):
    """The task's constructor compiles it with a default Adam of 2 variables, and the model file holds fit's Adam of
    14: Keras warns that it skips the optimizer's variables, which reads as a failure. The readers never train."""
    run_dir, _, x = lora
    inputs = {f"x_{key}": value for key, value in x.items()}
    np.savez(tmp_path / "x.npz", **inputs)
    np.savez(tmp_path / "xy.npz", **inputs, y=x["token_ids"])
    commands = [
        ["export", str(run_dir), "--output", str(tmp_path / "lm.keras")],
        ["predict", str(run_dir), str(tmp_path / "x.npz")],
        ["evaluate", str(run_dir), "--data", str(tmp_path / "xy.npz"), "--output-dir", str(tmp_path / "ev")],
    ]
    for args in commands:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.stderr
        said = [str(w.message) for w in caught] + result.stderr.splitlines()
        assert [line for line in said if "optimizer" in line] == [], args[0]


def raw_file(folder, name, lines):
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_predict_reads_raw_text_through_the_run_s_preprocessor_and_gives_each_position_s_next_token(lora, tmp_path):
    run_dir, trained, _ = lora
    sentences = list(texts(4, seed=11))
    lines = [sentences[0], "", *sentences[1:]]  # a blank line is skipped, the rows keep their line numbers
    txt, jsonl = raw_file(tmp_path, "a.txt", lines), raw_file(tmp_path, "b.jsonl", [json.dumps({"x": sentences[0]})])
    result = CliRunner().invoke(main, ["predict", str(run_dir), str(txt), str(jsonl), "--json"])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [row["input"] for row in rows] == [f"{txt}:1", f"{txt}:3", f"{txt}:4", f"{txt}:5", f"{jsonl}:1"]
    x = preprocessed(trained, [*sentences, sentences[0]])
    probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(bare_outputs(trained, x)))
    tokenizer = trained.preprocessor.tokenizer
    for i, row in enumerate(rows):
        positions = np.flatnonzero(x["padding_mask"][i])  # up to the padding: the text and its start token
        assert [t["position"] for t in row["tokens"]] == positions.tolist()
        ids = probabilities[i, positions].argmax(-1)
        assert [t["id"] for t in row["tokens"]] == ids.tolist()
        assert [t["token"] for t in row["tokens"]] == [tokenizer.detokenize([[j]])[0] for j in ids]
        got = [t["probability"] for t in row["tokens"]]
        assert np.abs(np.array(got) - probabilities[i, positions].max(-1)).max() <= 1e-6
    # the text table: per row its name, then each position's token and probability
    printed = CliRunner().invoke(main, ["predict", str(run_dir), str(jsonl)]).stdout.splitlines()
    first = rows[-1]["tokens"][0]
    assert printed[0] == f"{jsonl}:1: most likely next token (probability) per position"
    assert printed[1].startswith(f"  {json.dumps(first['token'])} {first['probability']:.2f}, ")
    assert len(printed) == 2 and printed[1].count(", ") == len(rows[-1]["tokens"]) - 1
    # --output keeps the logits, and each position's token id and probability
    out = tmp_path / "out.npz"
    assert CliRunner().invoke(main, ["predict", str(run_dir), str(jsonl), "--output", str(out)]).exit_code == 0
    written = np.load(out)
    assert np.abs(written["outputs"][0] - bare_outputs(trained, x)[-1]).max() <= 1e-6
    assert written["token_ids"][0].tolist() == [t["id"] for t in rows[-1]["tokens"]] + [-1] * (
        x["padding_mask"].shape[1] - len(rows[-1]["tokens"])
    )


def test_evaluate_reads_raw_text_through_the_run_s_preprocessor(lora, classifier, tmp_path):
    """A causal LM's .txt (its preprocessor makes the targets) and a classifier's .jsonl with labels give
    model.evaluate's numbers on what the task's preprocessor makes of them."""
    sentences = list(texts(10, seed=5))
    labels = np.arange(10) % 3
    cases = [
        (lora, raw_file(tmp_path, "lm.txt", sentences), (sentences,)),
        (
            classifier,
            raw_file(tmp_path, "cls.jsonl", [json.dumps({"x": s, "y": int(y)}) for s, y in zip(sentences, labels)]),
            (sentences, labels),
        ),
    ]
    for (run_dir, trained, *_), data, raw in cases:
        out = tmp_path / f"eval-{data.stem}"
        result = CliRunner().invoke(main, ["evaluate", str(run_dir), "--data", str(data), "--output-dir", str(out)])
        assert result.exit_code == 0, result.stderr
        x, y, weights = keras.utils.unpack_x_y_sample_weight(trained.preprocessor(*raw))
        kept = trained.preprocessor
        trained.preprocessor = None
        try:
            expected = trained.evaluate(x, y, sample_weight=weights, batch_size=16, verbose=0, return_dict=True)
        finally:
            trained.preprocessor = kept
        written = json.loads((out / "evaluate.json").read_text())
        assert written["test_examples"] == 10
        assert abs(written["test_loss"] - expected["loss"]) <= 1e-6, data.name


# (id; the file's name and lines; the command after the run directory, {f} the file; the error line, {f} the file)
RAW_ERRORS = [
    ("not JSON", "a.jsonl", ['{"x": "the cat"}', "the cat"], ["predict", "{f}"],
     '{f} line 2 is not JSON (Expecting value: line 1 column 1 (char 0)): write one {{"x": TEXT, "y": LABEL}} a line'),
    ("no x", "a.jsonl", ['{"text": "the cat"}'], ["predict", "{f}"],
     '{f} line 1 has no text "x": write one {{"x": TEXT, "y": LABEL}} a line'),
    ("other keys", "a.jsonl", ['{"x": "the cat", "label": 1}'], ["predict", "{f}"],
     '{f} line 1 has keys [\'label\'] besides "x" and "y": write one {{"x": TEXT, "y": LABEL}} a line'),
    ("blank", "a.txt", ["", " "], ["predict", "{f}"],
     '{f} holds no examples (every line is blank): pass a .txt file of one text a line, or a .jsonl file of one '
     '{{"x": TEXT, "y": LABEL}} a line'),
    ("some labels", "a.jsonl", ['{"x": "the cat", "y": 1}', '{"x": "a dog"}'], ["evaluate", "--data", "{f}"],
     '{f}:2 has no "y" where other lines have one: give every example its label, or none'),
    ("no labels", "a.txt", ["the cat"], ["evaluate", "--data", "{f}"],
     "{f} holds texts without labels, and the task's preprocessor makes no targets of them: write a .jsonl file "
     'of one {{"x": TEXT, "y": LABEL}} a line'),
]  # fmt: skip


@pytest.mark.parametrize(
    "lines_name, lines, args, line", [case[1:] for case in RAW_ERRORS], ids=[c[0] for c in RAW_ERRORS]
)
def test_a_bad_raw_text_file_is_one_line_and_nothing_is_written(classifier, tmp_path, lines_name, lines, args, line):
    run_dir = classifier[0]
    path = raw_file(tmp_path, lines_name, lines)
    out = tmp_path / "ev"
    args = [a.format(f=path) for a in args] + (["--output-dir", str(out)] if args[0] == "evaluate" else [])
    result = CliRunner().invoke(main, [args[0], str(run_dir), *args[1:]])
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {line.format(f=path)}\n")
    assert not out.exists()


def test_predict_refuses_raw_text_beside_npz_files_in_one_line(lora, tmp_path):
    run_dir, _, x = lora
    np.savez(tmp_path / "x.npz", **{f"x_{key}": value for key, value in x.items()})
    txt = raw_file(tmp_path, "a.txt", ["the cat"])
    result = CliRunner().invoke(main, ["predict", str(run_dir), str(tmp_path / "x.npz"), str(txt)])
    assert (result.exit_code, result.stdout) == (2, "")
    assert (
        result.stderr
        == f"error: {txt} is raw text and the other files are not: pass raw text or .npz files, not both\n"
    )
