"""The seam for a second backend (accum/backends/, docs/design.md): what speaks TensorFlow to run an update lives in
accum/backends/tensorflow/; the trainer's loop, the Trainer, its memory guard, the run directory and the runtime's
policy import no TensorFlow and reach the backend only through the seam (``accum_train.backends.active``), which
Keras' own backend chooses; the TensorFlow backend answers the seam's calls. No module outside accum/backends/
imports a backend's folder: the objective, the Keras objective, the evaluation, the noise terms and averages, the
trim check, BatchNorm pooling (and the TensorLayer nets' norm layers) and the checkpoint manager are the backend's,
reached through ``active()``.

Nothing speaks TensorFlow outside accum/backends/, the feed with its sources' feeds (trainer/data/) and trim_padding's
cut (tf.data stays the data layer: Keras reads it on every backend) and datasets/ (``STILL_SPEAKING``, held equal to
what the sources import, is empty): the TensorLayer nets, which only TensorFlow runs, are its backend's (builtin.py,
``active().built_in``), and accum_train.fit's door (keras_fit/fit.py) loads the Trainer's path, which reads tf.data,
only on a backend that trains under the Trainer (test_jax_backend.py trains on JAX with TensorFlow unimportable).
The commands ask the backend for what they need of it (a checkpoint read back, outputs in batches, compare's
gradient: the backend's backend.py); keras_private reaches Keras' internals through keras.tree; outcome's
quiet_tensorflow sets TensorFlow's environment before Keras loads it.
"""

import ast
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train.backends import BACKENDS, Backend, Engine, active
from accum_train.errors import OutOfMemory, UserError
from accum_train.trainer.loop import Loop
from test_layers import FOLDERS, PACKAGE, ROOT, SEAM, imports, outside_imports, sources

# The modules that must not speak TensorFlow: they import none, directly or inside a function.
CLEAN = [
    "accum/trainer/optim.py",
    "accum/trainer/loop.py",
    "accum/trainer/trainer.py",
    "accum/trainer/store/rundir.py",
    "accum/trainer/memory.py",
    "accum/trainer/runtime.py",
    "accum/trainer/data/batching.py",
    "accum/trainer/data/order.py",
    "accum/trainer/data/conversion.py",
    "accum/trainer/data/timeline.py",
    "accum/trainer/store/metrics_log.py",
    "accum/trainer/store/lock.py",
    "accum/backends/__init__.py",
    *(f"accum/{m}.py" for m in ("loader", "predict", "reload", "keras_private", "outcome", "models/to_keras")),
    "accum/keras_fit/checks.py",
    "accum/keras_fit/fit.py",
    "accum/models/__init__.py",
    "accum/keras_fit/fit_hooks.py",
    "accum/keras_fit/inputs.py",
    "accum/keras_fit/rundir.py",
]
# Where tf.data may stay: the feed (with trim_padding's cut in its pipeline), the feeds that the one dispatch
# (trainer/data/sources.py, which speaks no TensorFlow itself) picks, KerasHub's preprocessed batches (task_feed), and
# the loaders.
DATA_LAYER = {f"{PACKAGE}.trainer.data.{m}" for m in ("feed", "array_feed", "stream_feed", "task_feed")}
# The next to move (the module docstring says why each speaks TensorFlow): a module made clean leaves this list.
STILL_SPEAKING: set[str] = set()


def module_of(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    name = ".".join([FOLDERS[parts[0]], *parts[1:]])
    return name.removesuffix(".__init__")


@pytest.mark.parametrize("path", CLEAN)
def test_a_module_that_must_not_speak_tensorflow_imports_none(path):
    assert "tensorflow" not in outside_imports(ROOT / path)


@pytest.mark.parametrize("path", CLEAN)
def test_a_module_that_must_not_speak_tensorflow_reaches_the_backend_through_the_seam(path):
    modules, name = sources(), module_of(path)
    assert name in modules
    assert sorted(t for t in imports(ROOT / path, name, modules) if t.startswith(f"{SEAM}.")) == []


def test_no_module_outside_the_backends_imports_a_backend_s_folder():
    """Everything outside accum/backends/ reaches a backend through the seam (``active()``), never by importing
    accum_train.backends.tensorflow (or a later backend's folder), at top level or inside a function."""
    modules = sources()
    direct = {
        name: sorted(t for t in imports(path, name, modules) if t.startswith(f"{SEAM}."))
        for name, path in modules.items()
        if name != SEAM and not name.startswith(f"{SEAM}.")
    }
    assert {name: found for name, found in direct.items() if found} == {}


def test_what_still_speaks_tensorflow_outside_the_backends_the_feed_and_the_loaders_is_the_list():
    """Nothing new speaks TensorFlow outside accum/backends/, and the list of what is left to move stays true."""
    speaking = {
        name
        for name, path in sources().items()
        if "tensorflow" in outside_imports(path)
        and not name.startswith((f"{SEAM}.", f"{FOLDERS['datasets']}."))
        and name not in DATA_LAYER
    }
    assert speaking == STILL_SPEAKING
    assert not STILL_SPEAKING & {module_of(path) for path in CLEAN}


@pytest.mark.parametrize(
    "source, found",
    [
        ("import tensorflow as tf", {"tensorflow"}),
        ("import tensorflow.compat.v1", {"tensorflow"}),
        ("from tensorflow.python.framework import errors", {"tensorflow"}),
        ("def f():\n    import tensorflow as tf\n", {"tensorflow"}),  # inside a function
        ("from .backends import active\nimport keras", {"keras"}),  # relative imports are the package's
        ("x = 'import tensorflow'", set()),
    ],
)
def test_the_reader_sees_every_way_to_import_tensorflow(tmp_path, source, found):
    """The premise: a reader that saw no import would pass every module as clean."""
    path = tmp_path / "module.py"
    path.write_text(source)
    assert outside_imports(path) == found


def test_the_seam_names_the_backends_it_has_and_each_has_its_folder():
    assert BACKENDS == ("tensorflow", "jax")
    for name in BACKENDS:
        assert (ROOT / "accum" / "backends" / name / "backend.py").is_file()
    setup = (ROOT / "setup.cfg").read_text()  # installed, not only importable from the checkout
    assert all(f"    {SEAM}.{name}\n" in setup for name in BACKENDS) and f"    {SEAM}\n" in setup


@pytest.mark.parametrize(
    "keras_backend, chosen, error",
    [
        ("tensorflow", f"{SEAM}.tensorflow.backend", None),
        ("jax", f"{SEAM}.jax.backend", None),  # the plain case of accum_train.fit (test_jax_backend.py)
        (
            "torch",
            None,
            "Keras runs on 'torch' (KERAS_BACKEND or ~/.keras/keras.json), which accum-train has no engine for: set "
            "KERAS_BACKEND to one of tensorflow, jax",
        ),
    ],
)
def test_keras_backend_chooses_the_backend(monkeypatch, keras_backend, chosen, error):
    if keras_backend == "jax":
        pytest.importorskip("jax")  # the `jax` extra
    monkeypatch.setattr(keras.config, "backend", lambda: keras_backend)
    if error is None:
        assert active().__name__ == chosen
    else:
        with pytest.raises(UserError) as raised:
            active()
        assert str(raised.value) == error


def engine(loss_scale=None):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    loss = lambda x, y: tf.reduce_sum(tf.square(model(x) - y), axis=-1)  # noqa: E731  (per example)
    return active().accumulator_for(model, loss, keras.optimizers.SGD(0.1), subdivisions=2, loss_scale=loss_scale)


def test_the_tensorflow_backend_answers_the_seam():
    backend = active()
    assert isinstance(backend, Backend) and backend.NAME == keras.config.backend() == "tensorflow"
    built = engine()
    assert isinstance(built, Engine)
    assert backend.OUT_OF_MEMORY is tf.errors.ResourceExhaustedError and backend.OP_ERROR is tf.errors.OpError
    assert backend.BAD_INPUT is tf.errors.InvalidArgumentError  # what predict and evaluate name the data for
    assert issubclass(backend.OUT_OF_MEMORY, backend.OP_ERROR)  # why the loop catches OUT_OF_MEMORY first
    assert backend.STRATEGY is tf.distribute.Strategy
    changes = backend.state_variable("[]", "string", "rule_changes")  # what older checkpoints hold
    assert (changes.dtype, changes.trainable, changes.numpy()) == (tf.string, False, b"[]")
    with backend.eagerly():
        assert tf.config.functions_run_eagerly()
    assert not tf.config.functions_run_eagerly()  # as it was
    assert (backend.replicas(None), backend.strategy_name(None), backend.is_chief(None)) == (1, "default", True)
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
    out, peak = backend.peak_during(lambda: built.update(x, y))
    assert int(built.optimizer.iterations.numpy()) == 1 and float(out["examples"]) == 4
    assert peak is None or peak > 0


@pytest.mark.parametrize(
    "loss_scale, names",
    [
        (None, ["bad_updates_in_a_row", "skipped_updates"]),
        (1024.0, ["bad_updates_in_a_row", "skipped_updates", "loss_scale", "good_updates"]),
    ],
)
def test_a_checkpoint_holds_the_engine_s_counters_by_their_names(loss_scale, names):
    """The names older checkpoints hold them by: a resume of a run saved before the seam restores them."""
    built = engine(loss_scale)
    state = active().engine_state(built)
    assert list(state) == names
    assert all(state[name] is getattr(built, name) for name in names)


class Hooks:
    def __init__(self):
        self.failures = []

    def failed(self, source, step, err):
        self.failures.append((step, type(err)))


class Guard:
    needed = False

    def out_of_memory(self, step, err):
        return OutOfMemory(f"update {step + 1} ran out of memory ({err.message})")


class Raising:
    def __init__(self, error):
        self.error = error

    def update(self, step, stop):
        raise self.error


@pytest.mark.parametrize(
    "error, raised, message, failures",
    [
        (tf.errors.ResourceExhaustedError(None, None, "OOM"), OutOfMemory, "update 4 ran out of memory (OOM)", []),
        (tf.errors.DataLossError(None, None, "corrupted record"), tf.errors.DataLossError, "corrupted record", [3]),
        (ValueError("a bug"), ValueError, "a bug", []),  # not an op's: no door names it
    ],
)
def test_the_loop_sorts_an_update_s_errors_by_the_backend_s_classes(error, raised, message, failures):
    hooks = Hooks()
    loop = Loop(engine=None, guard=Guard(), noise=None, stop=None, max_bad_steps=None, ends=None)
    with pytest.raises(raised) as caught:
        loop.update(hooks, Raising(error), 3)
    assert str(caught.value) == message
    assert hooks.failures == [(step, raised) for step in failures]


def test_the_seam_s_interface_is_what_the_backend_s_module_defines():
    """Every name of ``Backend`` is in the TensorFlow backend's ``__all__``, and nothing else: the module is the
    interface answered, which a JAX folder copies."""
    tree = ast.parse((ROOT / "accum" / "backends" / "tensorflow" / "backend.py").read_text())
    listed = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
    )
    protocol = {name for name in vars(Backend) if not name.startswith("_")} | set(Backend.__annotations__)
    assert sorted(listed) == sorted(protocol)


def test_the_backend_reads_a_checkpoint_back_for_the_commands(tmp_path):
    """The commands' calls (reload, loader, predict, compare): a checkpoint's weights, one of its variables and the
    weights' shapes read back; outputs in batches; a gradient; a batch's spec."""
    backend = active()
    saved = [tf.Variable(np.arange(6, dtype=np.float32).reshape(3, 2)), tf.Variable(np.ones(2, np.float32))]
    prefix = tf.train.Checkpoint(weights=saved, subdivisions=tf.Variable(4)).save(str(tmp_path / "ckpt"))
    assert backend.saved_value(prefix, "subdivisions") == 4 and backend.saved_value(prefix, "nothing") is None
    assert backend.saved_weight_shapes(prefix) == [(3, 2), (2,)]
    restored = [tf.Variable(tf.zeros((3, 2))), tf.Variable(tf.zeros(2))]
    backend.restore_weights(prefix, restored)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(saved, restored))
    with pytest.raises(ValueError):  # variables that do not fit what is saved
        backend.restore_weights(prefix, [tf.Variable(tf.zeros((2, 2))), tf.Variable(tf.zeros(2))])
    x = np.arange(10, dtype=np.float64).reshape(5, 2)
    seen = []
    out = backend.outputs_in_batches(lambda inputs, training: seen.append(training) or inputs * 2, x, 2)
    assert out.dtype == np.float32 and np.array_equal(out, 2 * x) and seen == [False]  # one trace, in inference
    v = tf.Variable(3.0)
    assert [float(g) for g in backend.gradients(lambda: v * v, [v])] == [6.0]
    assert backend.gradients(lambda: tf.constant(1.0), [v]) == [None]  # a variable the loss does not reach
    spec = backend.batch_spec((x, {"y": np.zeros((5,), np.int32)}))
    assert spec == (tf.TensorSpec((None, 2), tf.float64), {"y": tf.TensorSpec((None,), tf.int32)})


def test_the_backend_can_still_split_the_cpu_once_every_name_is_imported():
    """``strategy.cpu_devices`` splits the CPU into devices, which TensorFlow allows only before its runtime starts:
    asking the seam for the backend (which a run does first) must not start it (TensorLayer's import does)."""
    code = (
        "from accum_train.backends import active\n"
        "backend = active()\n"
        "print(backend.make_strategy('mirrored', 2).num_replicas_in_sync, backend.AccumBatchNorm.__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "AccumBatchNorm"], done.stderr[-2000:]
