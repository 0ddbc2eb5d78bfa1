"""subdivisions: auto, and the out-of-memory paths.

The allocator peak and the ResourceExhaustedError are forced (a fake peak that
grows with the micro-batch; an update that raises once), so the tests say
exactly which k must be chosen and that no batch is lost or applied twice.
"""

import json

import accum_train.backends.tensorflow.backend as tf_backend
import accum_train.trainer.memory as memory_module
import numpy as np
import pytest
import tensorflow as tf
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.cli.main import main
from accum_train.config import load_config
from accum_train.errors import OutOfMemory
from accum_train.from_config.lifecycle import train
from accum_train.progress import Progress
from click.testing import CliRunner
from helpers import max_difference, update_records

MiB = 2**20
# The peak and the out-of-memory errors are forced, so which k is chosen does not depend on the model or the
# length of the run: smoke.yaml with a small MLP on 600 examples, 10 updates of 64 (the last a short one of
# 24). A run is then mostly its start-up, and k=64's one-example micro-steps stay few.
SHORT = ["model.name=mlp", "model.hidden=32", "data.train_limit=600", "data.test_limit=100"]


class Messages(Progress):
    def __init__(self):
        self.lines = []

    def message(self, text):
        self.lines.append(text)


@pytest.fixture()
def fake_peak(monkeypatch):
    """Allocator peak = 1 MiB per example of the last micro-step measured."""
    peak = [0]
    original = Accumulator.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        real = self.accumulate

        def accumulate(x, y, n):
            peak[0] = int(x.shape[0]) * MiB
            return real(x, y, n)

        self.accumulate = accumulate

    monkeypatch.setattr(Accumulator, "__init__", init)
    monkeypatch.setattr(tf_backend, "allocator_peak_bytes", lambda: peak[0])
    return peak


@pytest.mark.parametrize(
    "limit, chosen, tried",
    [
        pytest.param("64MiB", 1, [64], marks=pytest.mark.slow),
        ("40MiB", 2, [64, 32]),
        pytest.param("20MiB", 4, [64, 32, 16], marks=pytest.mark.slow),
        ("1MiB", 64, [64, 32, 16, 8, 4, 2, 1]),
    ],
)
def test_auto_picks_the_fewest_subdivisions_that_fit(tmp_path, repo_root, fake_peak, limit, chosen, tried):
    cfg = load_config(
        repo_root / "configs" / "smoke.yaml", [*SHORT, "subdivisions=auto", f"memory_limit={limit}", "epochs=1"]
    )
    messages = Messages()
    summary = train(cfg, tmp_path / "run", progress=messages)
    assert summary["subdivisions"] == chosen
    measured = [line for line in messages.lines if line.startswith("subdivisions=auto: micro-batch of ")]
    assert [int(line.split()[3]) for line in measured] == tried
    split = "1 micro-batch" if chosen == 1 else f"{chosen} micro-batches"
    size = "1 example" if chosen == 64 else f"{64 // chosen} examples"
    assert f"subdivisions=auto chose {split} of up to {size}" in messages.lines
    assert f"batch_size=64 as {split} of {64 // chosen} examples" in messages.lines
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["subdivisions"] == chosen


class ProbedEngine:
    """What choose_subdivisions needs of an engine: a micro-step of m examples peaks at m MiB."""

    replicas = 1

    def __init__(self, peak):
        self.peak, self.k = peak, None

    def accumulate(self, x, y, batch):
        self.peak[0] = int(x.shape[0]) * MiB
        return tf.constant(0.0)

    def reset(self):
        pass

    def largest_over_workers(self, k):
        return k

    def set_subdivisions(self, k):
        self.k = k


def test_the_probe_makes_only_the_micro_batch_it_measures(fake_peak):
    """The probe's peak is its micro-step's, not the batch's: only the micro-batch probed is made (``take``), as a
    run's update pulls one at a time. Holding the batch of 64 (1 MiB per example here) would make 40MiB fit no k."""
    taken = []

    def take(m):
        taken.append(m)
        return tf.zeros([m, 2]), tf.zeros([m], tf.int32)

    engine = ProbedEngine(fake_peak)
    assert memory_module.choose_subdivisions(engine, take, 64, "40MiB", 40 * MiB, lambda line: None) == 2
    assert taken == [64, 32] and engine.k == 2


@pytest.mark.parametrize(
    ("batch", "replicas", "limit_mib", "tried", "chosen"),
    [
        # k doubles, but never past the share: a batch of 6 goes 1, 2, 4, then 6 micro-batches, not 8
        (6, 1, 1, [6, 3, 2, 1], 6),
        (6, 1, 2, [6, 3, 2], 4),
        # two replicas: each share is 3 (its largest micro-batch is what is probed), so k stops at 3
        (6, 2, 1, [3, 2, 1], 3),
        (64, 1, 40, [64, 32], 2),
    ],
)
def test_the_probe_doubles_k_up_to_a_replica_share(fake_peak, batch, replicas, limit_mib, tried, chosen):
    taken = []

    def take(m):
        taken.append(m)
        return tf.zeros([m, 2]), tf.zeros([m], tf.int32)

    engine = ProbedEngine(fake_peak)
    engine.replicas = replicas
    limit = f"{limit_mib}MiB"
    assert memory_module.choose_subdivisions(engine, take, batch, limit, limit_mib * MiB, lambda line: None) == chosen
    assert taken == tried and engine.k == chosen


def test_auto_with_nothing_that_fits(tmp_path, repo_root, fake_peak):
    cfg = load_config(repo_root / "configs" / "smoke.yaml", [*SHORT, "subdivisions=auto", "memory_limit=512KiB"])
    with pytest.raises(OutOfMemory) as err:
        train(cfg, tmp_path / "run")
    assert str(err.value) == (
        "even one example per micro-batch needs 1 MiB of TensorFlow memory, over "
        "memory_limit=512KiB: raise memory_limit or use a smaller model"
    )


@pytest.mark.parametrize(
    ("norm", "batch", "note"),
    [
        ("none", 64, ""),
        # BatchNorm over the halved micro-batches of 6: said, as plan and fit warn of it at the start
        ("batchnorm", 12, " (BatchNorm now normalises micro-batches of 6 examples, under 8: noisy statistics)"),
    ],
)
def test_a_first_update_over_the_limit_doubles_k_and_retries_the_same_batch(
    tmp_path, repo_root, monkeypatch, norm, batch, note
):
    """The micro-step probe fits; the whole first update (1.5x a micro-step, say) does not."""
    overrides = [*SHORT, f"model.norm={norm}", "epochs=1", "optimizer.name=sgd", "optimizer.learning_rate=0.05"]
    overrides.append(f"batch_size={batch}")
    train(load_config(repo_root / "configs" / "smoke.yaml", overrides + ["subdivisions=2"]), tmp_path / "ref")
    peak = [0]
    original = Accumulator.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        real_micro, real_batch = self.accumulate, self.accumulate_from

        def accumulate(x, y, n):
            peak[0] = int(x.shape[0]) * MiB
            return real_micro(x, y, n)

        def accumulate_from(iterator, n, pulls, size=None):
            peak[0] = 3 * (n // pulls) * MiB // 2
            return real_batch(iterator, n, pulls, size)

        self.accumulate, self.accumulate_from = accumulate, accumulate_from

    monkeypatch.setattr(Accumulator, "__init__", init)
    monkeypatch.setattr(tf_backend, "allocator_peak_bytes", lambda: peak[0])
    messages = Messages()
    limit = ["subdivisions=auto", f"memory_limit={batch}MiB"]
    summary = train(load_config(repo_root / "configs" / "smoke.yaml", overrides + limit), tmp_path / "auto", messages)
    assert messages.lines[:2] == [
        f"subdivisions=auto: micro-batch of {batch} -> {batch} MiB (memory_limit={batch}MiB)",
        f"subdivisions=auto chose 1 micro-batch of up to {batch} examples",
    ]
    assert (
        f"update 1 peaked at {3 * batch // 2} MiB of TensorFlow memory with subdivisions=1, over "
        f"memory_limit={batch}MiB: retrying the same batch with subdivisions=2{note}"
    ) in messages.lines
    assert summary["subdivisions"] == 2 and summary["steps"] == -(-600 // batch)
    a, b = np.load(tmp_path / "ref" / "weights.npz"), np.load(tmp_path / "auto" / "weights.npz")
    assert max_difference(a, b) < 1e-6  # the batch applied once, at k=2


@pytest.fixture()
def oom_once(monkeypatch):
    """Once armed, the 5th update call raises ResourceExhaustedError before anything is applied."""
    calls = [0]
    original = Accumulator.__init__

    def arm():
        monkeypatch.setattr(Accumulator, "__init__", init)

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        real = self.update_from

        def update_from(iterator, n, pulls, stop=0, size=None):
            calls[0] += 1
            if calls[0] == 5:
                # half an update's micro-batches pulled, and their gradient in the cache, when memory runs out
                for _ in range(pulls // 2):
                    next(iterator)
                self.caches[0].add([tf.ones_like(v) for v in self.variables])
                raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[64,8]")
            return real(iterator, n, pulls, stop, size)

        self.update_from = update_from

    return arm


@pytest.mark.parametrize(
    "limit, update",
    [
        # under memory_limit the first update is accumulated and measured before it is applied, without calling
        # update_from(): the 5th update_from() call is update 6
        (["memory_limit=4GiB"], 6),
        ([], 5),  # nothing measured: k starts at 1 and only running out of memory doubles it (fit's policy too)
    ],
    ids=["memory_limit", "no-limit"],
)
def test_out_of_memory_doubles_k_and_retries_the_same_batch(tmp_path, repo_root, oom_once, limit, update):
    # SGD, 10 updates: the rounding of k=1 against k=2 stays far below what a batch lost or applied twice
    # moves (1e-2); Adam, or 47 updates, would amplify it past a fixed bound
    overrides = [
        *SHORT,
        "model.norm=none",
        "epochs=1",
        "log_every=1",
        "optimizer.name=sgd",
        "optimizer.learning_rate=0.05",
    ]
    reference = train(
        load_config(repo_root / "configs" / "smoke.yaml", overrides + ["subdivisions=1"]), tmp_path / "ref"
    )
    oom_once()
    cfg = load_config(repo_root / "configs" / "smoke.yaml", overrides + ["subdivisions=auto", *limit])
    messages = Messages()
    summary = train(cfg, tmp_path / "auto", progress=messages)
    assert (
        f"update {update} ran out of memory with subdivisions=1: retrying the same batch with subdivisions=2"
        in messages.lines
    )
    unmeasured = (
        "subdivisions=auto: no memory_limit, so nothing is measured before training: the first update runs as one "
        "micro-batch per replica, and an update that runs out of memory is retried at twice the micro-batches (a "
        "GPU reports running out; a CPU's memory is the machine's: set memory_limit there)"
    )
    assert (unmeasured in messages.lines) == (not limit)
    assert summary["subdivisions"] == 2 and summary["steps"] == reference["steps"] == 10
    a, b = np.load(tmp_path / "ref" / "weights.npz"), np.load(tmp_path / "auto" / "weights.npz")
    assert max_difference(a, b) < 1e-5  # nothing lost, nothing twice
    steps = [r["step"] for r in update_records(tmp_path / "auto")]
    assert steps == list(range(1, 11))
    # the new k is kept: it is in the checkpoint a resumed run restores
    reader = tf.train.load_checkpoint(str(tmp_path / "auto" / "checkpoints"))
    assert reader.get_tensor("subdivisions/.ATTRIBUTES/VARIABLE_VALUE") == 2


def test_out_of_memory_with_fixed_subdivisions_is_exit_3(tmp_path, repo_root, oom_once):
    oom_once()
    out = tmp_path / "run"
    sets = [arg for setting in SHORT for arg in ("--set", setting)]
    result = CliRunner().invoke(
        main, ["run", str(repo_root / "configs" / "smoke.yaml"), *sets, "--output-dir", str(out)]
    )
    assert result.exit_code == 3
    assert result.stderr == (
        "error: out of memory: update 5 ran out of memory with subdivisions=4 "
        "(OOM when allocating tensor with shape[64,8]): use more subdivisions or "
        "subdivisions: auto\n"
    )


def test_a_keras_file_model_tries_rematerialisation_before_giving_up(tmp_path, repo_root, monkeypatch):
    """The CLI's subdivisions: auto has fit's last rung: a keras_file network that does not fit at one example per
    micro-batch gets its activations recomputed in the backward pass, said in one line, and the probe runs again.
    The peak is forced: 1 MiB per example, half that once the network is rematerialised."""
    import keras
    from accum_train import keras_private

    rng = np.random.default_rng(0)
    arrays = {
        f"{x}_{split}": rng.random((n, 4) if x == "x" else (n, 1), dtype=np.float32)
        for split, n in (("train", 16), ("test", 4))
        for x in "xy"
    }
    np.savez(tmp_path / "data.npz", **arrays)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    network = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="tanh")(inputs)))
    network.compile(loss="mse")
    network.save(tmp_path / "model.keras")

    rematerialised, real = [], keras_private.rematerialise_activations
    monkeypatch.setattr(keras_private, "rematerialise_activations", lambda m: rematerialised.append(m) or real(m))
    peak, original = [0], Accumulator.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        measured = self.accumulate

        def accumulate(x, y, n):
            peak[0] = int(tf.nest.flatten(x)[0].shape[0]) * MiB // (2 if rematerialised else 1)
            return measured(x, y, n)

        self.accumulate = accumulate

    monkeypatch.setattr(Accumulator, "__init__", init)
    monkeypatch.setattr(tf_backend, "allocator_peak_bytes", lambda: peak[0])
    overrides = [
        f"model.path={tmp_path / 'model.keras'}",
        f"data.path={tmp_path / 'data.npz'}",
        "batch_size=4",
        "epochs=1",
        "subdivisions=auto",
        "memory_limit=512KiB",
    ]
    said = Messages()
    train(load_config(repo_root / "configs" / "regression.yaml", overrides), tmp_path / "run", progress=said)
    probes = [line for line in said.lines if line.startswith("subdivisions=auto")]
    assert probes == [
        "subdivisions=auto: micro-batch of 4 -> 4 MiB (memory_limit=512KiB), too much",
        "subdivisions=auto: micro-batch of 2 -> 2 MiB (memory_limit=512KiB), too much",
        "subdivisions=auto: micro-batch of 1 -> 1 MiB (memory_limit=512KiB), too much",
        "subdivisions=auto: one example per micro-batch does not fit: retrying with each layer's activation "
        'recomputed in the backward pass (keras.RematScope(mode="activations"))',
        "subdivisions=auto: micro-batch of 1 -> 512 KiB (memory_limit=512KiB)",
        "subdivisions=auto chose 4 micro-batches of up to 1 example",
    ]
    assert len(rematerialised) == 1
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 4


@pytest.mark.parametrize("existing", [False, True], ids=["a new directory", "an empty one"])
def test_a_probe_that_finds_nothing_that_fits_leaves_the_directory_as_it_was(tmp_path, repo_root, existing):
    """subdivisions: auto under a memory_limit that not even one example fits: exit 3 before anything trained,
    and the output directory is as it was found (config.yaml and run.json, written before the probe, go
    again; an empty one keeps the lock file, which marks no run), so a command runs again in it."""
    out = tmp_path / "run"
    if existing:
        out.mkdir()
    sets = [*SHORT, "memory_limit=100KB", "subdivisions=auto"]
    args = ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out), "--quiet"]
    result = CliRunner().invoke(main, [*args, *(arg for setting in sets for arg in ("--set", setting))])
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("error: out of memory: even one example per micro-batch needs")
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == (["writer.lock"] if existing else None)
    again = CliRunner().invoke(main, [*args, *(arg for setting in [*SHORT, "epochs=1"] for arg in ("--set", setting))])
    assert again.exit_code == 0, again.output
