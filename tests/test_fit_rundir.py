"""accum_train.fit's output_dir: kept as training goes, resumed by the next call at the uninterrupted weights."""

import json
import os
import signal

import accum_train
import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train import UserError
from accum_train.errors import Interrupted, RunDirError
from accum_train.trainer.store.checkpoints import checkpoint_numbers
from accum_train.trainer.store.metrics_log import read_metrics
from helpers import max_difference, signal_after, small_regressor

N, BATCH, K, SEED = 50, 16, 3, 5
RNG = np.random.default_rng(11)
X = RNG.random((N, 6), dtype=np.float32)
Y = RNG.random((N, 1), dtype=np.float32)


def fit(built, epochs, output_dir=None, **keywords):
    order = {"batch_size": BATCH, "subdivisions": K, "seed": SEED, "verbose": 0}
    return accum_train.fit(built, X, Y, epochs=epochs, output_dir=output_dir, **order, **keywords)


@pytest.fixture(scope="module")
def uninterrupted():
    built = small_regressor()
    history = fit(built, 4)
    return built.get_weights(), history.history


def test_a_second_call_continues_the_run_directory(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    fit(small_regressor(), 2, run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "checkpoints",
        "history.jsonl",
        "initial_model.keras",
        "metrics.jsonl",
        "model.keras",
        "run.json",
        "summary.json",
        "tensorboard",
        "writer.lock",
    ]
    resumed = small_regressor()  # a fresh process would build it again from its code: the checkpoint restores it
    history = fit(resumed, 4, run_dir)
    weights, expected = uninterrupted
    assert max_difference(resumed.get_weights(), weights) == 0.0
    assert history.epoch == [0, 1, 2, 3]  # the whole run's: the first two epochs read back from metrics.jsonl
    assert history.history == expected
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if not r.get("epoch_end")] == list(range(1, 17))
    assert [r["loss"] for r in records if r.get("epoch_end")] == pytest.approx(expected["loss"])
    saved = keras.models.load_model(run_dir / "model.keras")
    assert max_difference(saved.get_weights(), weights) == 0.0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {key: summary[key] for key in ("steps", "epochs", "subdivisions", "replicas", "skipped_updates")} == {
        "steps": 16,
        "epochs": 4,
        "subdivisions": K,
        "replicas": 1,
        "skipped_updates": 0,
    }
    assert summary["cpu_time_s"] > 0 and summary["peak_rss_bytes"] > 0 and summary["loss_scale"] is None
    # each call's start, as the CLI's history.jsonl has it: the first started, the second resumed at update 8
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [(h["event"], h["step"], h["strategy"], h["replicas"], h["subdivisions"]) for h in history] == [
        ("start", 0, "default", 1, K),
        ("resume", 8, "default", 1, K),
    ]
    # TensorBoard has what metrics.jsonl has (the CLI's writer): each update's loss, each epoch's logs
    scalars = {}
    # one file per call, in the order written: events.out.tfevents.SECONDS.HOST.PID.N, N the process's count of
    # writers, which a name sort puts 10 before 9 when two calls fall in one second
    files = (run_dir / "tensorboard").glob("events.out.tfevents.*")
    for path in sorted(files, key=lambda p: (int(p.name.split(".")[3]), int(p.name.rsplit(".", 1)[1]))):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    updates = [r for r in records if not r.get("epoch_end")]
    assert scalars["train/loss"] == [(r["step"], float(np.float32(r["loss"]))) for r in updates]
    assert scalars["epoch/mae"] == list(zip([4, 8, 12, 16], np.float32(expected["mae"]).tolist()))


def test_a_run_directory_of_the_previous_release_resumes(tmp_path, monkeypatch, uninterrupted):
    """0.1.0 checkpointed neither the noise scale's averages nor k: such a directory resumes at the uninterrupted
    weights, its estimate starting afresh."""
    from accum_train.backends.tensorflow.checkpoints import Checkpoints

    def tracked_alone(self):  # what 0.1.0 saved: none of the optional variables
        return tf.train.CheckpointManager(tf.train.Checkpoint(**self.tracked), str(self.directory), self.keep)

    run_dir = tmp_path / "run"
    with monkeypatch.context() as earlier:
        earlier.setattr(Checkpoints, "_manager", tracked_alone)
        fit(small_regressor(), 2, run_dir)
    assert not {"noise_trace", "subdivisions"} & {
        name.split("/")[0] for name, _ in tf.train.list_variables(str(run_dir / "checkpoints" / "ckpt-8"))
    }
    resumed = small_regressor()
    history = fit(resumed, 4, run_dir)
    assert max_difference(resumed.get_weights(), uninterrupted[0]) == 0.0
    assert history.epoch == [0, 1, 2, 3]


@pytest.mark.parametrize(("signum", "update"), [(signal.SIGINT, 6), (signal.SIGTERM, 3)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_after_the_update_in_hand_and_the_next_call_ends_where_an_uninterrupted_one_does(
    tmp_path, uninterrupted, signum, update
):
    run_dir = tmp_path / "run"
    stopped = small_regressor()
    with pytest.raises(Interrupted) as caught:
        fit(stopped, 4, run_dir, callbacks=[signal_after(update, signum)])
    assert (caught.value.step, caught.value.exit_code) == (update, 128 + signum)
    name = signal.Signals(signum).name
    assert str(caught.value) == (
        f"stopped by {name} after update {update}; checkpoint saved; to go on, call accum_train.fit again with "
        f"output_dir={str(run_dir)!r}"
    )
    assert checkpoint_numbers(run_dir / "checkpoints")[0] == update
    assert int(stopped.optimizer.iterations.numpy()) == update  # the object holds the last update's weights
    resumed = small_regressor()
    history = fit(resumed, 4, run_dir)
    weights, expected = uninterrupted
    assert max_difference(resumed.get_weights(), weights) == 0.0
    # the epoch the signal fell in ends with the logs of the uninterrupted run: its running metrics were kept
    assert list(history.history) == list(expected)
    for name, values in expected.items():
        assert history.history[name] == pytest.approx(values, rel=1e-6), name
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if not r.get("epoch_end")] == list(range(1, 17))  # every update once


def test_a_second_signal_stops_at_once_and_names_the_newest_checkpoint(tmp_path):
    """Two signals in one update: the second stops the call in the signal's handler; the update it names to go on
    from is the newest checkpoint's (the end of the first epoch), where the next call resumes."""
    run_dir = tmp_path / "run"
    twice = [signal_after(6), signal_after(6)]
    with pytest.raises(Interrupted) as caught:
        fit(small_regressor(), 4, run_dir, callbacks=twice)
    assert (caught.value.forced, caught.value.step) == (True, 4)
    assert str(caught.value) == (
        "stopped at once by a second SIGINT; the last checkpoint (update 4) is intact; to go on, call "
        f"accum_train.fit again with output_dir={str(run_dir)!r}"
    )
    assert checkpoint_numbers(run_dir / "checkpoints")[0] == 4


@pytest.mark.parametrize(
    "changed, refused",
    [
        (
            {"batch_size": 10, "seed": SEED},
            "batch_size=16, not 10: a resume continues the same batches; pass batch_size=16",
        ),
        # no seed given: the recorded one is taken, so the refusal names what did change
        (
            {"batch_size": 16, "shuffle": False},
            "shuffle=True, not False: a resume continues the same batches; pass shuffle=True",
        ),
    ],
    ids=["batch_size", "shuffle-without-seed"],  # another k resumes: test_resume_cut.py
)
def test_a_resume_with_other_batches_is_refused_before_anything_changes(changed, refused, tmp_path):
    run_dir = tmp_path / "run"
    fit(small_regressor(), 1, run_dir)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*"))
    with pytest.raises(UserError) as caught:
        keywords = {"subdivisions": K, **changed}
        accum_train.fit(small_regressor(), X, Y, epochs=2, verbose=0, output_dir=run_dir, **keywords)
    assert str(caught.value) == (
        f"accum_train.fit: output_dir {run_dir} was trained with {refused} or choose a new output_dir"
    )
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before


def test_a_resume_on_other_data_is_refused_before_anything_changes(tmp_path):
    """run.json records the examples an array call trains on (after validation_split): a resume on fewer would
    go on from a position past its epoch's end."""
    run_dir = tmp_path / "run"
    fit(small_regressor(), 1, run_dir)
    assert json.loads((run_dir / "run.json").read_text())["fit"]["examples"] == N
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*"))
    with pytest.raises(UserError) as caught:
        fit(small_regressor(), 2, run_dir, validation_split=0.2)
    assert str(caught.value) == (
        f"accum_train.fit: output_dir {run_dir} was trained on {N} examples, not 40: a resume continues the same "
        f"batches; pass the same data (after validation_split) or choose a new output_dir"
    )
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before


@pytest.mark.parametrize(
    ("output_dir", "refused"),
    [
        (5, "output_dir=5 must be the path of a directory, a str or a pathlib.Path (None: no run directory)"),
        ("", "output_dir='' must be the path of a directory, a str or a pathlib.Path (None: no run directory)"),
        ("{tmp}/notes.txt/run", "output_dir {tmp}/notes.txt/run: {tmp}/notes.txt is a file, not a directory"),
    ],
    ids=["an int", "empty", "under a file"],
)
def test_an_output_dir_that_cannot_be_one_is_refused_in_one_line(tmp_path, output_dir, refused):
    (tmp_path / "notes.txt").write_text("mine")
    if isinstance(output_dir, str):
        output_dir = output_dir.format(tmp=tmp_path)
    built = small_regressor()
    before = built.get_weights()
    with pytest.raises(UserError) as caught:
        fit(built, 1, output_dir)
    assert str(caught.value) == "accum_train.fit: " + refused.format(tmp=tmp_path)
    assert max_difference(built.get_weights(), before) == 0.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


class FailsAtTrainBegin(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        raise RuntimeError("the callback's own failure")


@pytest.mark.parametrize(
    "failure, keywords",
    [
        # refused before the directory is entered
        (UserError, {"sample_weight": np.ones((N, 3), np.float32)}),
        # the directory entered (run.json written, the checkpoint of update 0 taken), then no update
        (RuntimeError, {"callbacks": [FailsAtTrainBegin()]}),
    ],
)
def test_a_call_that_fails_before_anything_trained_leaves_no_run_directory(tmp_path, failure, keywords):
    """Nothing trained, so the output_dir is not left half begun (run.json would refuse another batch_size on the
    next call), and a corrected call trains in it."""
    run_dir = tmp_path / "run"
    with pytest.raises(failure):
        fit(small_regressor(), 1, run_dir, **keywords)
    assert not run_dir.exists()
    accum_train.fit(small_regressor(), X, Y, batch_size=10, subdivisions=2, verbose=0, output_dir=run_dir)
    assert json.loads((run_dir / "run.json").read_text())["fit"]["batch_size"] == 10


@pytest.mark.slow  # six fit calls
def test_fit_called_epoch_by_epoch_into_one_directory_warns_of_no_retracing(tmp_path, caplog):
    """A notebook's loop of fit calls, each one epoch on: TensorBoard's writer traced a graph per call, and
    TensorFlow warned of retracing from the fifth call on."""
    model = small_regressor()
    with caplog.at_level("WARNING", logger="tensorflow"):
        for epochs in range(1, 7):
            fit(model, epochs, tmp_path / "run")
    assert [r.getMessage() for r in caplog.records if "retracing" in r.getMessage()] == []
    assert [r["epoch"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("epoch_end")] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no folder can be made")
def test_an_output_dir_that_cannot_be_made_is_one_line():
    """/proc passes the writable-folder check and refuses every mkdir: the call ended in a traceback."""
    with pytest.raises(RunDirError) as caught:
        fit(small_regressor(), 1, "/proc/accum-train-test/run")
    assert str(caught.value) == (
        "output_dir /proc/accum-train-test/run cannot be made (No such file or directory): choose another directory"
    )


def test_a_directory_of_something_else_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError) as caught:
        fit(small_regressor(), 1, tmp_path)
    assert str(caught.value) == (
        f"accum_train.fit: output_dir {tmp_path} is not empty and was not written by accum_train.fit: choose an "
        f"empty or new directory"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_checkpoint_of_another_model_is_refused_by_the_restore_where_run_json_does_not_say_what_it_holds(tmp_path):
    """A directory written before run.json recorded what its checkpoint holds (test_resume_cut.py: one that does)."""
    run_dir = tmp_path / "run"
    fit(small_regressor(), 1, run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    del record["fit"]["holds"]
    (run_dir / "run.json").write_text(json.dumps(record))
    keras.utils.set_random_seed(1)
    other = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    other.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    with pytest.raises(UserError) as caught:
        fit(other, 2, run_dir)
    assert str(caught.value).startswith(f"accum_train.fit: output_dir {run_dir} holds a checkpoint of another model (")
    assert str(caught.value).endswith("): pass the same model, or choose a new output_dir")
    # refused before anything was written: no file added or changed (no TensorBoard events file either)
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before


def test_the_cli_tells_a_fit_run_directory_apart(tmp_path):
    """--resume refuses it (the command line has neither the model's code nor the data); the readers take it
    (tests/test_fit_rundir_cli.py: their numbers)."""
    from accum_train.cli.main import main
    from click.testing import CliRunner

    run_dir = tmp_path / "run"
    trained = small_regressor()
    fit(trained, 1, run_dir)
    refused = (
        f"--resume {run_dir} was written by accum_train.fit: continue it by calling accum_train.fit(model, ..., "
        f"output_dir={str(run_dir)!r}) again (the command line has neither the model's code nor the data); "
        f"accum-train export, predict and evaluate --data read it as it is"
    )
    with pytest.raises(UserError) as caught:
        accum_train.run(resume=run_dir)
    assert str(caught.value) == refused
    result = CliRunner().invoke(main, ["run", "--resume", str(run_dir), "--quiet"])
    assert (result.exit_code, result.stderr) == (2, f"error: {refused}\n")
    exported = tmp_path / "exported.keras"
    result = CliRunner().invoke(main, ["export", str(run_dir), "--output", str(exported)])
    assert (result.exit_code, result.stdout) == (0, f"written: {exported}\n"), result.stderr
    assert max_difference(keras.models.load_model(exported).get_weights(), trained.get_weights()) == 0.0


def test_each_update_record_has_the_clis_figures_of_the_update(tmp_path):
    """An update's line of metrics.jsonl names, as the CLI's does, the rate applied, the global norm of the whole
    batch's gradient and whether it was skipped: update 1's norm is the whole first batch's at the first weights."""
    built = small_regressor()
    loss = keras.losses.MeanSquaredError()
    with tf.GradientTape() as tape:
        first = loss(Y[:BATCH], built(X[:BATCH]))
    expected = float(tf.linalg.global_norm(tape.gradient(first, built.trainable_variables)))
    run_dir = tmp_path / "run"
    fit(built, 1, run_dir, shuffle=False)
    updates = [r for r in read_metrics(run_dir / "metrics.jsonl") if not r.get("epoch_end")]
    assert len(updates) == 4  # 50 examples in batches of 16
    assert updates[0]["grad_norm"] == pytest.approx(expected, rel=1e-5)
    assert [(r["learning_rate"], r["skipped"]) for r in updates] == [(pytest.approx(0.01), False)] * 4
    assert all(r["grad_norm"] > 0 for r in updates)
