"""accum_train.fit on Keras' JAX backend over several devices (accum/backends/jax/devices.py, issue 76's item 5):
under ``keras.distribution.DataParallel`` on 2 host CPU devices, the same weights as on one device and as Keras'
own whole-batch model.fit, to 1e-5, with one all-reduce per update, found in the compiled update's HLO.

JAX fixes its devices when it is first imported, and Keras its backend: the cases run in one child process with
KERAS_BACKEND=jax and XLA_FLAGS=--xla_force_host_platform_device_count=2, which prints each case's outcome as JSON.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")
pytestmark = pytest.mark.slow  # a process with its own devices, about 15 s: the slow suite (CI runs it)

CASES = r"""
import json, re, numpy as np, jax, keras, accum_train
from accum_train.backends import active
from accum_train.backends.jax.engine import stacked
from accum_train.errors import UserError

def mlp(loss):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=loss)
    return model

rng = np.random.default_rng(0)
x = rng.normal(size=(22, 5)).astype("float32")  # batches of 7, 7, 7, 1: odd, and the last smaller than the mesh
targets = {"mse": rng.normal(size=(22, 4)).astype("float32"), "weighted mean": rng.integers(0, 4, size=(22,))}
weights = rng.uniform(0.1, 3.0, size=(22,)).astype("float32")
losses = {
    "mse": "mse",
    "weighted mean": keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
}
# a batch of 7 is 3 + 4 rows on 2 devices, cut 1, 1, 1 and 1, 1, 2 (k=3) or 1, 2 and 2, 2 (micro-batches of <= 2)
cuts = {"mse": {"subdivisions": 3}, "weighted mean": {"micro_batch_size": 2}}
apart = lambda a, b: max(float(np.max(np.abs(p - q))) for p, q in zip(a.get_weights(), b.get_weights()))
out, models = {"devices": len(jax.devices())}, {}

def train(name, door):
    model = mlp(losses[name])
    data = dict(x=x, y=targets[name], batch_size=7, sample_weight=weights, shuffle=False, verbose=0)
    history = model.fit(**data) if door == "model.fit" else accum_train.fit(model, **data, **cuts[name])
    return model, history.history["loss"][0]

for name in losses:
    models[name] = [train(name, "model.fit"), train(name, "accum_train.fit")]  # one device
keras.distribution.set_distribution(keras.distribution.DataParallel())
for name in losses:
    (keras_own, keras_loss), (one, one_loss) = models[name]
    two, two_loss = train(name, "accum_train.fit")
    models[name] = two
    sharding = two.trainable_variables[0].value.sharding
    out[name] = {
        "2 devices v 1": apart(two, one), "2 devices v model.fit": apart(two, keras_own),
        "moved": apart(one, mlp(losses[name])), "losses": [two_loss, one_loss, keras_loss],
        "replicated": [len(sharding.device_set), sharding.is_fully_replicated],
    }

# the update's compiled HLO: its all-reduce instructions, and the computation each one is in
model = models["mse"]  # trained on 2 devices
backend = active()
engine = backend.accumulator_for(model, backend.KerasObjective(model), model.optimizer, subdivisions=3)
batches = stacked([(x[i : i + 2], targets["mse"][i : i + 2], weights[i : i + 2]) for i in range(0, 12, 2)])
hlo = engine._update.lower(*engine._state(), batches, np.float32(12)).compile().as_text()
computation, found = None, []
for line in hlo.splitlines():
    if line and not line.startswith(" "):
        computation = line.split(" ")[0]
    if re.search(r"\ball-reduce\(", line):
        found.append([computation, line.split("all-reduce(")[1].split(")")[0].count("%")])  # its operands
out["all-reduces"] = found
out["trainable variables"] = len(model.trainable_variables)
out["engine"] = [type(engine).__name__, engine.replicas, engine.replica_ids]

# a Dropout on 2 devices: a batch of the same 5 rows twice, each device's share in one micro-batch. Devices that drew
# one mask would give one device's update on the 5 rows (the counterfactual: the seed states not set apart)
def dropped():
    keras.utils.set_random_seed(1)
    layers = [keras.Input((5,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dropout(0.5, seed=4)]
    model = keras.Sequential([*layers, keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    return model

same = dict(x=np.concatenate([x[:5]] * 2), y=np.concatenate([targets["mse"][:5]] * 2), batch_size=10, shuffle=False)
twice, alike = dropped(), dropped()
accum_train.fit(twice, **same, verbose=0)
from accum_train.backends.jax import devices
apart_per_device = devices.DataParallelAccumulator._offset
devices.DataParallelAccumulator._offset = lambda self, values, sign: values
accum_train.fit(alike, **same, verbose=0)
devices.DataParallelAccumulator._offset = apart_per_device
# BatchNormalization on 2 devices: each device normalises its own micro-batches, the pooled sums of both devices move
# the moving statistics once per update: batches of 10 as 2 + 3 rows per device equal one device's 2, 3, 2, 3
def normed():
    keras.utils.set_random_seed(1)
    layers = [keras.Input((5,)), keras.layers.Dense(16, use_bias=False), keras.layers.BatchNormalization(momentum=0.8)]
    model = keras.Sequential([*layers, keras.layers.Activation("tanh"), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model

statistics = lambda model: [v.numpy() for v in model.non_trainable_variables]
normed_data = dict(x=x[:20] * 3 + 1, y=targets["mse"][:20], batch_size=10, shuffle=False, verbose=0)
normed_two = normed()
accum_train.fit(normed_two, **normed_data, subdivisions=2)
keras.distribution.set_distribution(None)
normed_one = normed()
accum_train.fit(normed_one, **normed_data, subdivisions=4)
keras.distribution.set_distribution(keras.distribution.DataParallel())
out["batchnorm"] = {
    "2 devices v 1": apart(normed_two, normed_one),
    "statistics": max(float(np.max(np.abs(a - b))) for a, b in zip(statistics(normed_two), statistics(normed_one))),
    "moved": max(float(np.max(np.abs(a - b))) for a, b in zip(statistics(normed_two), statistics(normed()))),
}

# compiled metrics on 2 devices: each device's changes to them summed once per update, in the same psum
def metered():
    model = mlp(losses["weighted mean"])
    weighted = [keras.metrics.SparseCategoricalAccuracy(name="weighted_accuracy")]
    model.compile(keras.optimizers.Adam(0.05), losses["weighted mean"], metrics=["accuracy"], weighted_metrics=weighted)
    return model

data = dict(x=x, y=targets["weighted mean"], batch_size=7, sample_weight=weights, epochs=2, shuffle=False, verbose=0)
metered_two = accum_train.fit(metered(), **data, subdivisions=2).history
keras.distribution.set_distribution(None)
out["metrics"] = [metered_two, metered().fit(**data).history]
once = dropped()
accum_train.fit(once, x[:5], targets["mse"][:5], batch_size=5, shuffle=False, verbose=0)
seed_state = lambda model: [v.numpy().tolist() for v in model.non_trainable_variables]
out["dropout"] = {
    "v one device": apart(twice, once), "one mask v one device": apart(alike, once),
    "seed states": [seed_state(twice), seed_state(once)],
}

# validation and a run directory on 2 devices: 2 epochs into output_dir, then a call with epochs=3 resuming it, against
# 3 epochs on one device (each device's share of a validation batch evaluated, the checkpoint's replicated state)
import shutil, tempfile
run_dir, held_out = tempfile.mkdtemp(), (x[:9], targets["mse"][:9])
fitted = dict(x=x, y=targets["mse"], batch_size=7, shuffle=False, verbose=0, validation_data=held_out)
resumed = mlp("mse")
keras.distribution.set_distribution(keras.distribution.DataParallel())
accum_train.fit(resumed, **fitted, epochs=2, subdivisions=2, output_dir=run_dir)
resumed = mlp("mse")  # a new process's model, from its first weights: the checkpoint's are restored into it
two_logs = accum_train.fit(resumed, **fitted, epochs=3, subdivisions=2, output_dir=run_dir).history
keras.distribution.set_distribution(None)
single = mlp("mse")
one_logs = accum_train.fit(single, **fitted, epochs=3, subdivisions=4).history
shutil.rmtree(run_dir)
out["run directory"] = {
    "2 devices, resumed v 1": apart(resumed, single),
    "history": {key: max(abs(a / b - 1) for a, b in zip(two_logs[key], one_logs[key])) for key in one_logs},
}

layout = keras.distribution.LayoutMap(keras.distribution.DeviceMesh((1, 2), ["batch", "model"]))
keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch"))
try:
    accum_train.fit(mlp("mse"), x, targets["mse"], batch_size=7, shuffle=False, verbose=0)
except UserError as err:
    out["ModelParallel"] = str(err)
print("CASES " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def cases():
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    done = subprocess.run([sys.executable, "-c", CASES], capture_output=True, text=True, timeout=300, env=env)
    line = next((line for line in done.stdout.splitlines() if line.startswith("CASES ")), None)
    assert line is not None, done.stderr[-3000:]
    return json.loads(line.removeprefix("CASES "))


@pytest.mark.parametrize("case", ["mse", "weighted mean"])
def test_two_devices_equal_one_and_keras_whole_batch_fit(cases, case):
    got = cases[case]
    assert cases["devices"] == 2
    assert got["moved"] > 1e-2  # 4 updates of Adam(0.05) move the weights: the equalities below are not vacuous
    assert got["2 devices v 1"] <= 1e-5
    assert got["2 devices v model.fit"] <= 1e-5
    two, one, keras_loss = got["losses"]
    assert abs(two - keras_loss) <= 1e-5 * max(1.0, abs(keras_loss)) and abs(one - keras_loss) <= 1e-5
    assert got["replicated"] == [2, True]  # DataParallel's layout: every device holds the whole weights


def test_one_all_reduce_per_update_outside_the_micro_step_loop(cases):
    """XLA's compiled update holds one all-reduce, of the cache (one operand per trainable variable), the totals, the
    noise scale's terms and each loss's own sums, in the entry computation: after the micro-steps' while loop, not in
    its body."""
    ((computation, operands),) = cases["all-reduces"]
    assert computation == "ENTRY"
    assert operands == cases["trainable variables"] + 3
    assert cases["engine"] == ["DataParallelAccumulator", 2, [0, 1]]


def test_a_distribution_other_than_data_parallel_is_refused_in_one_line(cases):
    assert cases["ModelParallel"] == (
        "accum_train.fit: keras.distribution.ModelParallel over 1 process(es) is not supported: use "
        "keras.distribution.DataParallel"
    )


def test_devices_draw_their_own_dropout_masks_from_one_replicated_seed_state(cases):
    """Two devices on the same rows draw different masks (their update is not one device's on those rows), while the
    seed state they leave is one device's: each update moves it on once per micro-step. Counterfactual: with the seed
    states not set apart per device, both draw one mask and give one device's update exactly."""
    got = cases["dropout"]
    assert got["v one device"] > 1e-2
    assert got["one mask v one device"] <= 1e-6
    twice, once = got["seed states"]
    assert twice == once == [[4, 1]]


def test_compiled_metrics_on_two_devices_log_model_fit_s_values(cases):
    two, keras_own = cases["metrics"]
    assert sorted(keras_own) == ["accuracy", "loss", "weighted_accuracy"]
    assert sorted(two) == sorted([*keras_own, "noise_scale"])  # and the noise scale: 2 micro-batches an update
    for name, values in keras_own.items():
        assert two[name] == pytest.approx(values, rel=1e-5, abs=1e-6), name


def test_a_run_directory_on_two_devices_resumes_with_its_validation_as_one_device_trains(cases):
    """2 epochs into output_dir on 2 devices, a second call to epoch 3 resuming it: one device's 3 epochs, the
    History of the whole run (its validation evaluated over the devices' shares) the same."""
    found = cases["run directory"]
    assert found["2 devices, resumed v 1"] < 1e-5
    assert sorted(found["history"]) == ["loss", "noise_scale", "val_loss"] and max(found["history"].values()) < 1e-5


def test_batchnorm_on_two_devices_pools_its_statistics_once_per_update_as_one_device(cases):
    got = cases["batchnorm"]
    assert got["2 devices v 1"] <= 1e-5 and got["statistics"] <= 1e-5 and got["moved"] > 1e-2


# Two processes of one CPU device each, joined by jax.distributed (gloo's CPU collectives), under one DataParallel
# over both: each is handed the same arrays, lays its device's share of every batch into the global batch, and the
# update's one psum crosses the processes. Each prints its weights' distance from model.fit's (run in-process, after
# the distribution is unset) and both Histories.
PROCESS = r"""
import json, sys, jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{sys.argv[2]}", num_processes=2, process_id=int(sys.argv[1]))
import numpy as np, keras, accum_train

rng = np.random.default_rng(0)
x = rng.normal(size=(22, 5)).astype("float32")  # batches of 7, 7, 7, 1: 3 + 4 rows a process, the last 0 + 1
y = rng.normal(size=(22, 4)).astype("float32")
weights = rng.uniform(0.1, 3.0, size=(22,)).astype("float32")

def mlp():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    return model

data = dict(x=x, y=y, batch_size=7, sample_weight=weights, shuffle=False, verbose=0)
keras.distribution.set_distribution(keras.distribution.DataParallel())
ours = mlp()
history = accum_train.fit(ours, **data, subdivisions=3).history
trained = [np.asarray(v.value) for v in ours.trainable_variables]
keras.distribution.set_distribution(None)
keras_own = mlp()
keras_history = keras_own.fit(**data).history
apart = max(float(np.max(np.abs(a - b))) for a, b in zip(trained, keras_own.get_weights()))
moved = max(float(np.max(np.abs(a - b))) for a, b in zip(trained, mlp().get_weights()))
out = {"processes": jax.process_count(), "devices": len(jax.devices()), "local": len(jax.local_devices()),
       "v model.fit": apart, "moved": moved, "history": history, "keras": keras_history}
print("CASES " + json.dumps(out), flush=True)
"""


def test_two_processes_joined_by_jax_distributed_train_as_model_fit():
    import socket

    with socket.socket() as free:
        free.bind(("localhost", 0))
        port = str(free.getsockname()[1])
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # one device a process
    started = [
        subprocess.Popen([sys.executable, "-c", PROCESS, str(i), port], env=env, stdout=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [process.communicate(timeout=300)[0] for process in started]
    lines = [next((line for line in out.splitlines() if line.startswith("CASES ")), None) for out in outs]
    assert None not in lines, outs
    for got in (json.loads(line.removeprefix("CASES ")) for line in lines):
        assert [got["processes"], got["devices"], got["local"]] == [2, 2, 1]
        assert got["v model.fit"] <= 1e-5 and got["moved"] > 1e-2
        for name, values in got["keras"].items():
            assert got["history"][name] == pytest.approx(values, rel=1e-5, abs=1e-6), name
