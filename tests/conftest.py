"""Shared fixtures. Tests never touch the network: the data comes from Debian's
dataset-fashion-mnist (installed by .ci/run) or $ACCUM_TRAIN_DATA."""

import atexit
import gc
import importlib.util
import os
import shutil
import signal
import sys
import tempfile
import weakref
from pathlib import Path

# XLA compiles the tests' programs (JAX's, and TensorFlow's under jit_compile) with its CPU backend's LLVM passes off:
# the same HLO and buffers, the machine code less tuned, and a third less compile time (the JAX cases' process: 98 to
# 64 CPU seconds). Every oracle compares two programs compiled alike; the benchmarks compile as users do. Set before
# TensorFlow and JAX load, and inherited by the processes the tests start.
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

import pytest

# KerasHub is the hub extra's, installed by its own line (README, `make setup`): without it the files that build
# KerasHub tasks at import are left out of the collection, not failed in it
HUB_FILES = ("test_fit_hub.py", "test_fit_dir_readers.py", "test_jax_hub.py")
collect_ignore = [] if importlib.util.find_spec("keras_hub") else list(HUB_FILES)

# The suite started as a background job of a non-interactive shell (`make test &`) inherits SIGINT ignored, and a run
# leaves an ignored SIGINT ignored (rundir.StopFlag): the in-process signal tests would see no stop. They send
# SIGINT to this process as Ctrl-C would reach a foreground run, so it is Python's default here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The image folder check's cache (datasets/image_check.py): one per test process, never the user's own,
# inherited by the processes the tests start.
os.environ["ACCUM_TRAIN_CACHE"] = tempfile.mkdtemp(prefix="accum-train-test-cache-")
atexit.register(shutil.rmtree, os.environ["ACCUM_TRAIN_CACHE"], True)

# JAX's compilation cache in that folder, every program kept however fast it compiled: the JAX processes a test
# process starts compile many programs alike (Keras' train step of the same small nets, case after case), which the
# cache, keyed by the program itself, compiles once (the JAX cases' process: 63 to 52 CPU seconds). Traces are not
# cached: what the tests count of them is unchanged.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.environ["ACCUM_TRAIN_CACHE"], "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


# A tf.data iterator that a test leaves in a reference cycle (a run stopped by an exception keeps its frames, and
# the iterators in them, in the traceback's cycle) is freed by Python's next full collection, in whichever later
# test that falls. TensorFlow's iterator destructor joins the pipeline's autotuning thread, and that thread now and
# then sits out a timed wait first (seen under gdb): single tests stalled 10 to 46 s, with no CPU spent. Collected
# at the end of the test that left it, no such iterator has stalled a test since. A call of accum_train.fit lets its
# pipeline go as it returns (fit_hooks.FitHooks.call), so only tests that end in an error collect (13 in a run).
_LIVE_ITERATORS = weakref.WeakSet()


class _CallerFrame:
    getmro = staticmethod(__import__("inspect").getmro)

    @staticmethod
    def stack():
        # called from func_wrapper: [1][0] is func_wrapper's caller's frame, what inspect.stack()[1][0] was
        return [None, (sys._getframe(2),)]


def _set_up_tensorflow():
    """What every process that runs tests sets before TensorFlow's runtime starts (pytest_configure)."""
    import accum_train  # noqa: F401  (sets the allocator mode before TensorFlow loads)
    import tensorflow as tf

    # Every test process runs under the same thread pools, whichever test starts TensorFlow's runtime first
    # (a run's threads.configure would otherwise fix them for the rest of the session) and however
    # pytest-xdist deals the files out: one thread per op and two ops side by side, what a run picks on
    # 2 cores. Results under BatchNorm depend on the pools: oneDNN splits its sums by thread.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    # The CPU as two logical devices, which only a process whose runtime has not started can set up: the default suite's
    # two-replica case (test_fit_distribute.py) runs tf.distribute.MirroredStrategy over /cpu:0 and /cpu:1 in this
    # process, not in a fresh one (about 7 s of TensorFlow's start on 2 cores). Both share the process's thread pools;
    # every other op is placed on /cpu:0, as before (no strategy, or the default one, uses only that device).
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )

    # TensorLayer guards two methods of every layer (tensorlayer/decorators/method_decorator.py) by looking at the
    # caller's frame through inspect.stack(), which also reads every frame's source lines and looks up every frame's
    # module among all of sys.modules: in a test process (a stack of pytest frames, a few thousand modules loaded)
    # that was most of the time a built-in model takes to build (measured: test_plan.py's 12 warning cases, 17.3 CPU
    # seconds with it, 9.8 with the caller's frame taken directly). The same frame, the same check: only how the frame
    # is found changes, in this process (the fresh processes the tests start run TensorLayer as it is).
    import tensorlayer.decorators.method_decorator as methods

    methods.inspect = _CallerFrame
    # tf.data's iterators tracked (_LIVE_ITERATORS)
    iterator = type(iter(tf.data.Dataset.range(1)))
    created = iterator.__init__

    def tracked(self, *args, **kwargs):
        created(self, *args, **kwargs)
        _LIVE_ITERATORS.add(self)

    iterator.__init__ = tracked


@pytest.fixture(autouse=True)
def _free_iterators_left_in_cycles():
    yield
    if _LIVE_ITERATORS:
        gc.collect()


def _real_data_dir() -> Path:
    for candidate in (os.environ.get("ACCUM_TRAIN_DATA"), "/usr/share/datasets/fashion-mnist"):
        if candidate and (Path(candidate) / "train-images-idx3-ubyte.gz").is_file():
            return Path(candidate)
    pytest.fail(
        "Fashion-MNIST is not installed: apt-get install dataset-fashion-mnist "
        "(or set ACCUM_TRAIN_DATA); .ci/run does this"
    )


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return _real_data_dir()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


# The files that take longest (measured with --durations), first: pytest-xdist deals files out in collection order
# (--dist loadfile; pytest_configure turns its reordering off), and a long file dealt last keeps one process busy
# while the other has finished.
# test_readme.py leads: in the slow suite its documented commands run for about 11 minutes in one process. The slow
# suite's other long files (each several minutes of fresh processes) follow, before the default suite's.
FIRST = (
    "test_readme.py",
    "test_kills.py",
    "test_distribute.py",
    "test_distribute_keras.py",
    "test_peers_masked.py",
    "test_peers_causal_lm.py",  # slow only: ten processes of a GPT-2's benchmark at smoke size
    "test_conformance.py",
    # the default suite's longest files, most first (seconds of test time summed per file, one measured make test)
    "test_fit_api.py",  # 56
    "test_fit_trim.py",  # 47 (35 with four stream and log cases in the slow suite)
    "test_plan.py",  # 18
    "test_fit_limits.py",  # 18
    "test_fit_hub.py",  # 17, and keras_hub's import
    "test_feed.py",  # 17
    "test_fit_exact.py",  # 16
    "test_engine.py",  # 16
    "test_fit_batch_schedule.py",  # 14
    "test_fit_noise.py",  # 14
    "test_fit_rundir_cli.py",  # 13
    "test_fit_rundir.py",  # 11
    "test_own_data.py",  # 13
    "test_export.py",
    "test_auto_subdivisions.py",
    "test_keras_file.py",
    "test_parallel.py",
    "test_cli_run.py",
    "test_evaluate_predict.py",
    "test_loop.py",
    "test_keras_loss.py",
    "test_precision.py",
    "test_python_data.py",
    "test_faults.py",
    "test_large_batch.py",
    "test_noise_scale.py",
    "test_groupnorm.py",
    "test_models.py",
    "test_image_check.py",
)


# The long cases of the default suite's behaviours run only in the slow suite: `make test` stays a few minutes.
LONG = [
    line.strip()
    for line in (Path(__file__).parent / "long_cases.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


def _mark_long(config, items):
    files = {Path(str(item.fspath)).name for item in items}
    matched = set()
    for item in items:
        node = item.nodeid.removeprefix("tests/")
        hits = [prefix for prefix in LONG if node.startswith(prefix)]
        if hits:
            item.add_marker(pytest.mark.slow)
            matched.update(hits)
    # a renamed test would silently come back to the default suite: when whole files were collected, refuse
    whole = not any("::" in arg for arg in config.args)
    stale = [p for p in LONG if whole and p.split("::")[0] in files and p not in matched]
    if stale:
        raise pytest.UsageError(f"tests/long_cases.txt names no collected test: {stale[0]} (rename or remove it)")


def pytest_configure(config):
    # pytest-xdist 3.6 and later deal the files out by their number of tests, most first, unless told not to: that put
    # test_readme.py (6 slow tests, the longest file) last in the slow suite, one process on it while the other idled
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # pytest-xdist's controller (make test's first process) deals the files out and runs none: it loads no TensorFlow,
    # and the workers start about 6 s sooner on 2 cores
    if not getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        _set_up_tensorflow()


def pytest_collection_modifyitems(config, items):
    _mark_long(config, items)
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(FIRST)))  # stable: the rest keep order
