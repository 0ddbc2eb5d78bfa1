"""Tools the tests share: NaN poisoning of chosen updates, a progress that
sends SIGINT at a chosen report, calls into TensorFlow's graphs counted,
metrics.jsonl read back, the largest difference of two sets of weights, a
script loaded as a module, and `accum-train run` on a Keras file and arrays; for
accum_train.fit's run directories, a small compiled regressor and a callback
that signals after an update."""

import importlib.util
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import tensorflow as tf
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.from_config.run_parts import Run
from accum_train.progress import Progress
from accum_train.trainer.store.metrics_log import MetricsLog
from accum_train.trainer.store.rundir import RunDirectory
from tensorflow.python.eager.polymorphic_function import atomic_function


def poison(monkeypatch, bad_steps, snapshot_after=None):
    """Updates whose 1-based number is in bad_steps get a NaN in their last example: the run's micro-step that
    holds it (``prepare``, inside the update's graph) puts it there.

    With snapshot_after=N, the weights and moving statistics right after update N are kept in the returned
    dict, by their names in weights.npz."""
    original = Accumulator.__init__
    calls, kept = [0], {}
    bad = tf.constant(sorted(step - 1 for step in bad_steps) or [-1], tf.int64)

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        prepare, real = self.prepare, self.update_from

        def poisoned(element, n):
            x, y, weights = prepare(element, n)
            step, begin = element[1][0], element[1][1]
            rows = tf.shape(x)[0]
            last = tf.equal(begin + tf.cast(rows, tf.int64), tf.cast(n, tf.int64))  # holds the batch's last example
            hit = tf.logical_and(tf.reduce_any(tf.equal(bad, step)), tf.logical_and(last, rows > 0))
            nan = lambda: tf.tensor_scatter_nd_update(x, [[rows - 1, 0, 0, 0]], [float("nan")])  # noqa: E731
            return tf.cond(hit, nan, lambda: x), y, weights

        def update_from(iterator, n, pulls, stop=0, size=None):
            calls[0] += 1
            out = real(iterator, n, pulls, stop, size)
            if calls[0] == snapshot_after:
                statistics = [s for layer in self.norm_layers for s in (layer.moving_mean, layer.moving_var)]
                kept.update({v.name.split(":")[0]: v.numpy() for v in self.variables + statistics})
            return out

        self.prepare, self.update_from = poisoned, update_from

    monkeypatch.setattr(Accumulator, "__init__", init)
    return kept


class InterruptAt(Progress):
    """Sends this process ``signals`` signals ``sig`` (SIGINT) in a row when the loop's ``step``-th report comes.
    Sent to itself from the main thread, each one's handler runs before the next is sent."""

    def __init__(self, step, signals=1, sig=signal.SIGINT):
        self.step, self.seen, self.signals, self.sig = step, 0, signals, sig

    def updates(self, micro_done, loss, examples_per_s):
        self.seen += 1
        if self.seen == self.step:
            for _ in range(self.signals):
                os.kill(os.getpid(), self.sig)


def records(run_dir):
    """Every record of a run directory's metrics.jsonl (a Path or a str)."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def update_records(run_dir):
    """The per-update records of metrics.jsonl (not the per-epoch ones)."""
    return [r for r in records(run_dir) if "loss" in r]


def max_difference(a, b, relative=False):
    """The largest |a - b| over every element of two sets of weights: sequences in one order (get_weights(), lists
    from JSON), or mappings by name (weights.npz, dicts), which must name the same weights. ``relative``: each
    difference over 1 + |b| (1e-5 of a weight that grew past 1 is float32's rounding, amplified over the updates:
    summing micro-batches is another order of the same sums, not a difference of meaning)."""
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        assert sorted(a.keys()) == sorted(b.keys())
        a, b = [a[k] for k in sorted(a.keys())], [b[k] for k in sorted(a.keys())]
    a, b = list(a), list(b)
    assert len(a) == len(b), f"{len(a)} weights against {len(b)}"
    worst = 0.0
    for first, second in zip(a, b):
        u, v = np.asarray(first, np.float64), np.asarray(second, np.float64)
        assert u.shape == v.shape, f"shapes {u.shape} and {v.shape}"
        gap = np.abs(u - v) / (1.0 + np.abs(v)) if relative else np.abs(u - v)
        worst = max(worst, float(np.max(gap, initial=0.0)))
    return worst


class GraphCalls:
    """Counts the calls from Python into TensorFlow graphs, leaving out those made while a run evaluates,
    writes its records or checkpoints. ``patch(owner, name, value)`` installs the counters: monkeypatch.setattr,
    or setattr."""

    def __init__(self, patch):
        self.calls, self._elsewhere = 0, 0
        real_call = atomic_function.AtomicFunction.call_flat

        def counted(function, *args, **kwargs):
            self.calls += 0 if self._elsewhere else 1
            return real_call(function, *args, **kwargs)

        patch(atomic_function.AtomicFunction, "call_flat", counted)
        for owner, name in ((Run, "scores"), (RunDirectory, "save")):
            patch(owner, name, self._not_counted(getattr(owner, name)))
        # the records' TensorBoard scalars: one call per tag and flush (every log_every updates), not per update
        patch(MetricsLog, "write", self._not_counted(MetricsLog.write))

    def _not_counted(self, method):
        def wrapped(*args, **kwargs):
            self._elsewhere += 1
            try:
                return method(*args, **kwargs)
            finally:
                self._elsewhere -= 1

        return wrapped


def load_file(path, name: str):
    """The Python file at ``path`` (a script or benchmark, not a package module) imported as module ``name``,
    registered in sys.modules as a normal import would be (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def iterated_autotuning(monkeypatch) -> list:
    """The autotune option of every tf.data pipeline iterated from now on (None: TensorFlow's default, on)."""
    import tensorflow as tf

    seen, plain = [], tf.data.Dataset.__iter__

    def recording(dataset):
        seen.append(dataset.options().autotune.enabled)
        return plain(dataset)

    monkeypatch.setattr(tf.data.Dataset, "__iter__", recording)
    return seen


def small_regressor():
    """6 inputs -> Dense(8, tanh) -> Dense(1), compiled with Adam(0.01), mse and mae; the same initial weights on
    every call (what a process resuming a run directory builds again)."""
    import keras

    keras.utils.set_random_seed(1)
    built = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    built.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return built


def signal_after(update, signum=signal.SIGINT):
    """A Keras callback that sends this process ``signum`` after the ``update``-th update (counting across calls)."""
    import keras

    class SignalAt(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen = 0

        def on_train_batch_end(self, batch, logs=None):
            self.seen += 1
            if self.seen == update:
                os.kill(os.getpid(), signum)

    return SignalAt()


def run_keras_file(folder: Path, model, arrays: dict, settings: str, data: str = "") -> Path:
    """``accum-train run`` in ``folder`` on ``model`` saved as model.keras and ``arrays`` (x_train, y_train, x_test,
    y_test) as data.npz: ``data`` more keys of the data section (", shuffle: false"), ``settings`` the config's
    other lines; the run directory of a run that ended with exit code 0."""
    from accum_train.cli.main import main
    from click.testing import CliRunner

    folder = Path(folder)
    model.save(folder / "model.keras")
    np.savez(folder / "data.npz", **arrays)
    (folder / "run.yaml").write_text(
        f"model: {{name: keras_file, path: {folder / 'model.keras'}}}\n"
        f"data: {{name: npz, path: {folder / 'data.npz'}{data}}}\n" + settings
    )
    result = CliRunner().invoke(main, ["run", str(folder / "run.yaml"), "--output-dir", str(folder / "run")])
    assert result.exit_code == 0, result.output
    return folder / "run"


def out_of_memory_at(monkeypatch, update: int) -> None:
    """TensorFlow's accumulator runs out of memory (ResourceExhaustedError, injected) in its ``update``-th update,
    counting over every accumulator built from now on."""
    import tensorflow as tf
    from accum_train.backends.tensorflow.engine import Accumulator

    calls, original = [0], Accumulator.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        real = self.update_from

        def update_from(iterator, n, pulls, stop=0, size=None):
            calls[0] += 1
            if calls[0] == update:
                raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (injected)")
            return real(iterator, n, pulls, stop, size)

        self.update_from = update_from

    monkeypatch.setattr(Accumulator, "__init__", init)
