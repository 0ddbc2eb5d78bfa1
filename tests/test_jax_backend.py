"""accum_train.fit on Keras' JAX backend (accum/backends/jax/, issue 76): the oracle matrix it covers so far exact
against Keras' own whole-batch model.fit on JAX (each case's counterfactual, in the slow suite, shows it can fail),
and what is not covered yet refused in one line.

Keras fixes its backend when it is first imported, and this suite's processes run TensorFlow: the cases run in one
child process with KERAS_BACKEND=jax (one start of TensorFlow and JAX for all of them, a few seconds), which leaves
each case's outcome in ``out``, printed as JSON for the tests to read.
"""

import json
import os
import subprocess
import sys

import accum_train
import keras
import numpy as np
import pytest
from accum_train.errors import UserError
from accum_train.trainer.data.array_feed import ArrayFeed

pytest.importorskip("jax")

# TensorFlow and TensorLayer made unimportable in a process, as where they are not installed
BLOCKED = r"""
import importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):  # TensorFlow and TensorLayer as where they are not installed
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorlayer"):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, Absent())
"""


# a plain regression MLP and its data, for the processes that need no more
PLAIN = r"""
def mlp():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model

rng = np.random.default_rng(0)
x, y = rng.normal(size=(23, 5)).astype("float32"), rng.normal(size=(23, 3)).astype("float32")
"""


LOOP_DEFS = r"""
# the one loop (keras_fit/fit_hooks.py) on JAX: model.fit's callbacks in model.fit's order, its validation (every
# second epoch, 7 examples in batches of 4 and 3) and History, a callback's stop_training, initial_epoch
class Events(keras.callbacks.Callback):
    def __init__(self, stop_after=None):
        super().__init__()
        self.seen, self.stop_after = [], stop_after

    def note(self, event, at=None, logs=None):
        self.seen.append([event, at, sorted(k for k in (logs or {}) if k != "noise_scale")])

    on_train_begin = lambda self, logs=None: self.note("train_begin", None, logs)
    on_epoch_begin = lambda self, epoch, logs=None: self.note("epoch_begin", epoch, logs)
    on_train_batch_end = lambda self, batch, logs=None: self.note("batch_end", batch, logs)
    on_test_begin = lambda self, logs=None: self.note("test_begin", None, logs)
    on_test_batch_end = lambda self, batch, logs=None: self.note("test_batch_end", batch, logs)
    on_train_end = lambda self, logs=None: self.note("train_end", None, logs)

    def on_epoch_end(self, epoch, logs=None):
        self.note("epoch_end", epoch, logs)
        if epoch == self.stop_after:
            self.model.stop_training = True

vx, vy = rng.normal(size=(7, 5)).astype("float32"), rng.normal(size=(7, 3)).astype("float32")
def metered_mlp():
    model = mlp()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    return model

def logged(name, source=None, **given):  # one case: ours against model.fit, with their callbacks' events
    ours, keras_own = metered_mlp(), metered_mlp()  # source(): the data, a source of batches (default: x, y by 10)
    stop_after = given.pop("stop_after", None)
    events = [Events(stop_after), Events(stop_after)]
    fixed = dict(shuffle=False, verbose=0, **given, **({} if source else {"batch_size": 10}))
    data = source or (lambda: (x, y))
    got = accum_train.fit(ours, *data(), subdivisions=3, callbacks=[events[0]], **fixed).history
    want = keras_own.fit(*data(), callbacks=[events[1]], **fixed).history
    apart = {key: max(abs(a / b - 1) for a, b in zip(got[key], want[key])) for key in want}
    out[name] = [gap(ours, keras_own), apart, sorted(got), events[0].seen == events[1].seen, len(events[0].seen)]
"""


CASES = (
    r"""
"""
    + BLOCKED
    + r"""
import json, numpy as np, keras, accum_train
from accum_train import keras_private
from accum_train.backends import Engine, active
from accum_train.errors import UserError

def mlp(loss="mse", outputs=3, extra=()):
    keras.utils.set_random_seed(1)
    layers = [keras.Input((5,)), keras.layers.Dense(16, activation="tanh"), *extra, keras.layers.Dense(outputs)]
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=loss)
    return model

rng = np.random.default_rng(0)
x = rng.normal(size=(23, 5)).astype("float32")  # 3 updates of 10, 10, 3: a ragged last batch
y = rng.normal(size=(23, 3)).astype("float32")
labels = rng.integers(0, 4, size=(23,))
weights = rng.uniform(0.1, 3.0, size=(23,)).astype("float32")

def oracle(name, make, targets, **cut):
    ours, keras_own = make(), make()
    got = accum_train.fit(ours, x, targets, batch_size=10, sample_weight=weights, shuffle=False, verbose=0, **cut)
    want = keras_own.fit(x, targets, batch_size=10, sample_weight=weights, shuffle=False, verbose=0)
    apart = max(float(np.max(np.abs(a - b))) for a, b in zip(ours.get_weights(), keras_own.get_weights()))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(ours.get_weights(), make().get_weights()))
    out[name] = [apart, moved, got.history["loss"][0], want.history["loss"][0]]
    return ours

oracle("mse k=3", mlp, y, subdivisions=3)  # 3, 3, 4 and 1, 1, 1: k divides neither 10 nor 3
weighted_mean = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
classifier = lambda: mlp(weighted_mean, 4)
oracle("weighted mean k=4", classifier, labels, subdivisions=4)  # 2, 3, 2, 3 and 0, 1, 1, 1: an empty micro-batch
trained = oracle("micro_batch_size=4", mlp, y, micro_batch_size=4)
# a second call on the same compiled model reuses the first's engine and its compiled update, as Keras reuses its
# train function: no update traced again; a compile() makes a new one
from accum_train.backends.jax import engine as jax_engine
traced, real_update = [], jax_engine.Accumulator._update_fn
jax_engine.Accumulator._update_fn = lambda self, *args: traced.append(1) or real_update(self, *args)
accum_train.fit(trained, x, y, batch_size=10, micro_batch_size=4, shuffle=False, verbose=0)
again = len(traced)
trained.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
accum_train.fit(trained, x, y, batch_size=10, micro_batch_size=4, shuffle=False, verbose=0)
out["traced again"] = [again, len(traced) > again]
jax_engine.Accumulator._update_fn = real_update
backend = active()
engine = backend.accumulator_for(trained, backend.KerasObjective(trained), trained.optimizer, subdivisions=2)
out["answers Engine"] = [backend.NAME, isinstance(engine, Engine), engine.k]
state = [*trained.trainable_variables, *trained.optimizer.variables]
before = [v.numpy() for v in state]
halves = [(x[s:e], y[s:e], weights[s:e]) for s, e in ((0, 5), (5, 10))]
engine.update_from(iter(halves), 10, 2)
in_one_call = trained.get_weights()
for variable, value in zip(state, before):
    variable.assign(value)
for part_x, part_y, part_weights in halves:
    engine.accumulate(part_x, part_y, 10, sample_weight=part_weights)
engine.finish()
out["accumulate, finish"] = max(float(np.max(np.abs(a - b))) for a, b in zip(in_one_call, trained.get_weights()))

# shuffle=True and "batch" (seed 9): 2 epochs of 4 updates of 5 examples, each in 3 micro-batches (1, 2, 2), against
# shuffle=False on the two epochs' arrays in one call, each epoch in the order trainer/data/order.py draws for it
from accum_train.trainer.data.order import epoch_order

gap = lambda a, b: max(float(np.max(np.abs(u - v))) for u, v in zip(a.get_weights(), b.get_weights()))
for shuffle in (True, "batch"):
    ours, stored, orders = mlp(), mlp(), [epoch_order(9, epoch, 20, shuffle, 5) for epoch in range(2)]
    accum_train.fit(ours, x[:20], y[:20], batch_size=5, sample_weight=weights[:20], epochs=2, shuffle=shuffle, seed=9,
                    subdivisions=3, verbose=0)
    rows = np.concatenate(orders)
    accum_train.fit(stored, x[rows], y[rows], batch_size=5, sample_weight=weights[rows], shuffle=False, subdivisions=3,
                    verbose=0)
    out[f"shuffle={shuffle!r}"] = [gap(ours, stored), gap(ours, mlp()), [rows.tolist() for rows in orders]]
drawn = mlp()  # fit's defaults: shuffle=True, seed=None (a seed drawn afresh)
loss = accum_train.fit(drawn, x[:20], y[:20], batch_size=5, subdivisions=3, verbose=0).history["loss"][0]
out["seed=None"] = [gap(drawn, mlp()), loss]

# non-trainable variables, carried through the micro-steps: a frozen layer kept to the bit while the rest trains to
# model.fit's weights; a Dropout's seed state moved on once per micro-step (k=1: model.fit's masks, to the bit)
def held(frozen=False, rate=None):
    keras.utils.set_random_seed(1)
    layers = [keras.Input((5,)), keras.layers.Dense(16, activation="tanh", trainable=not frozen)]
    layers += [keras.layers.Dropout(rate, seed=4)] if rate else []
    model = keras.Sequential([*layers, keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model

# the update's traces counted: the last batch of 3 padded to the micro-batches of 10 (one compiled update), but for a
# model that draws random numbers
jax_engine.Accumulator._update_fn = lambda self, *args: traced.append(1) or real_update(self, *args)
for name, options, k in (("frozen k=3", {"frozen": True}, 3), ("dropout k=1", {"rate": 0.3}, 1),
                         ("dropout k=3", {"rate": 0.3}, 3)):  # fmt: skip
    ours, keras_own, start = held(**options), held(**options), held(**options)
    before = len(traced)
    accum_train.fit(ours, x, y, batch_size=10, shuffle=False, verbose=0, subdivisions=k)  # 3 updates
    out[f"{name} traces"] = len(traced) - before
    keras_own.fit(x, y, batch_size=10, shuffle=False, verbose=0)
    first = [float(np.max(np.abs(a - b))) for a, b in zip(ours.layers[0].get_weights(), start.layers[0].get_weights())]
    seeds = [v.numpy().tolist() for v in ours.non_trainable_variables if v.dtype == "uint32"]
    out[name] = [gap(ours, keras_own), gap(ours, start), max(first), seeds]
jax_engine.Accumulator._update_fn = real_update

# compiled metrics, updated by each micro-step with its valid rows (the padding of ragged micro-batches weighted 0):
# 2 epochs of updates of 10, 10, 3 in 4 micro-batches, with sample weights, History's every log against model.fit's
def metered():
    model = mlp(weighted_mean, 4)
    metrics = ["accuracy", keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="entropy")]
    weighted = [keras.metrics.SparseCategoricalAccuracy(name="weighted_accuracy")]
    model.compile(keras.optimizers.Adam(0.05), weighted_mean, metrics=metrics, weighted_metrics=weighted)
    return model

logged = {}
for door in ("accum_train.fit", "model.fit"):
    model, data = metered(), dict(batch_size=10, sample_weight=weights, epochs=2, shuffle=False, verbose=0)
    if door == "model.fit":
        logged[door] = model.fit(x, labels, **data).history
    else:
        logged[door] = accum_train.fit(model, x, labels, **data, subdivisions=4).history
out["metrics"] = logged

def two_outputs():  # model.fit logs each output's own unweighted loss (<output>_loss) beside the weighted total
    keras.utils.set_random_seed(1)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    heads = {"a": keras.layers.Dense(3, name="a")(hidden), "b": keras.layers.Dense(4, name="b")(hidden)}
    model = keras.Model(inputs, heads)
    losses = {"a": "mse", "b": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
    model.compile(keras.optimizers.Adam(0.05), losses, loss_weights={"a": 1.0, "b": 0.5})
    return model

data = dict(x=x, y={"a": y, "b": labels}, batch_size=10, sample_weight=weights, epochs=2, shuffle=False, verbose=0)
out["per-output losses"] = {
    "accum_train.fit": accum_train.fit(two_outputs(), **data, subdivisions=3).history,
    "model.fit": two_outputs().fit(**data).history,
}

def tagged():  # a per-token output whose mask the loss sees and model.fit's metrics on JAX do not
    keras.utils.set_random_seed(1)
    layers = [keras.Input((6,)), keras.layers.Embedding(7, 8, mask_zero=True), keras.layers.Dense(3)]
    model, top2 = keras.Sequential(layers), keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")
    model.compile(keras.optimizers.Adam(0.05), sce_loss, metrics=["accuracy", top2])
    return model

sce_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
tokens = rng.integers(1, 7, size=(23, 6)) * (np.arange(6) < rng.integers(1, 7, size=(23, 1)))
tags = rng.integers(0, 3, size=(23, 6))
data = dict(batch_size=10, epochs=2, shuffle=False, verbose=0)
out["tagger metrics"] = {
    "accum_train.fit": accum_train.fit(tagged(), tokens, tags, **data, subdivisions=4).history,
    "model.fit": tagged().fit(tokens, tags, **data).history,
}

# BatchNormalization (a Dense without bias before it: a bias's gradient there is 0 but for rounding, which Adam would
# turn into steps): each micro-step normalises by its own rows, the moving statistics move once per update by the
# whole batch's (norm.py). At k=1 the weights are model.fit's; at k=4 (with an empty micro-batch in the last batch)
# and only BatchNorm trainable under SGD(0), the moving statistics are; moved k times per update (Keras' own call in
# each micro-step: the counterfactual) they are not. A batch with a NaN target is skipped: its statistics too.
from accum_train.backends.jax.norm import Pooled

def normed(only_norm=False, optimizer=None):
    keras.utils.set_random_seed(1)
    layers = [keras.Input((5,)), keras.layers.Dense(16, use_bias=False), keras.layers.BatchNormalization(momentum=0.8)]
    model = keras.Sequential([*layers, keras.layers.Activation("tanh"), keras.layers.Dense(3)])
    for layer in model.layers if only_norm else ():
        layer.trainable = isinstance(layer, keras.layers.BatchNormalization)
    model.compile(optimizer=optimizer or keras.optimizers.Adam(0.05), loss="mse")
    return model

def moving(model):
    norm = next(layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization))
    return [norm.moving_mean.numpy(), norm.moving_variance.numpy()]

stats_gap = lambda a, b: max(float(np.max(np.abs(u - v))) for u, v in zip(moving(a), moving(b)))
ours, keras_own = normed(), normed()
accum_train.fit(ours, x * 3 + 1, y, batch_size=10, shuffle=False, verbose=0)
keras_own.fit(x * 3 + 1, y, batch_size=10, shuffle=False, verbose=0)
out["batchnorm k=1"] = [gap(ours, keras_own), gap(ours, normed()), stats_gap(ours, keras_own)]
frozen = lambda: normed(True, keras.optimizers.SGD(0.0))
ours, keras_own, each_micro = frozen(), frozen(), frozen()
accum_train.fit(ours, x * 3 + 1, y, batch_size=10, subdivisions=4, shuffle=False, verbose=0)
keras_own.fit(x * 3 + 1, y, batch_size=10, shuffle=False, verbose=0)
pooled = Pooled.kept, Pooled.fold
Pooled.kept, Pooled.fold = (lambda self, before, after: after), (lambda self, values, pending, finite: values)
accum_train.fit(each_micro, x * 3 + 1, y, batch_size=10, subdivisions=4, shuffle=False, verbose=0)
Pooled.kept, Pooled.fold = pooled
out["batchnorm stats k=4"] = [stats_gap(ours, keras_own), stats_gap(ours, frozen()), stats_gap(each_micro, keras_own)]
bad, first = y[:20].copy(), normed()
bad[15, 0] = np.nan  # the second update's gradient is not finite: skipped whole
skipped = normed()
accum_train.fit(skipped, x[:20] * 3 + 1, bad, batch_size=10, subdivisions=2, shuffle=False, verbose=0)
accum_train.fit(first, x[:10] * 3 + 1, y[:10], batch_size=10, subdivisions=2, shuffle=False, verbose=0)
out["batchnorm skipped"] = [stats_gap(skipped, first), gap(skipped, first), stats_gap(first, normed())]

# the gradient noise scale's record of one update of 10 examples in 4 micro-batches (2, 3, 2, 3): sum |g_i|^2 of the
# micro-batches' own mean gradients, sum 1/b_i, k, and |G_B|^2 of the whole batch's, against jax.grad of each mean loss
import jax, jax.numpy as jnp
from accum_train.trainer.data.batching import pieces

def squared_gradient(model, rows, weighted):
    def loss(values):
        out, _ = model.stateless_call(values, [v.value for v in model.non_trainable_variables], x[rows])
        errors = jnp.mean(jnp.square(out - y[rows]), axis=-1)
        return jnp.sum(errors * weights[rows]) / jnp.sum(weights[rows]) if weighted else jnp.mean(errors)
    return float(sum(jnp.vdot(g, g) for g in jax.grad(loss)([v.value for v in model.trainable_variables])))

for weighted in (False, True):
    reduction = "mean_with_sample_weight" if weighted else "sum_over_batch_size"
    model = mlp(keras.losses.MeanSquaredError(reduction=reduction))
    keras_private.symbolic_build(model, (x[:10], y[:10], None))
    engine = backend.accumulator_for(model, backend.KerasObjective(model), model.optimizer, subdivisions=4)
    cuts, given = list(pieces(10, 4, 1, [0])), weights if weighted else None
    direct = [squared_gradient(model, slice(s, e), weighted) for s, e in cuts]
    sizes = [float(weights[s:e].sum()) if weighted else e - s for s, e in cuts]
    whole = squared_gradient(model, slice(0, 10), weighted)
    parts = iter([(x[s:e], y[s:e], None if given is None else given[s:e]) for s, e in cuts])
    record = engine.update_from(parts, 10, 4)
    recorded = [np.asarray(record[key]).tolist() for key in ("noise", "noise_batch")]
    out[f"noise weighted={weighted}"] = [*recorded, [sum(direct), sum(1 / b for b in sizes), 4, whole, sum(sizes)]]

# max_bad_steps: NaN targets in the second and third batches make their updates non-finite (skipped): the call stops
# at the third with the TensorFlow door's line, at the first update's weights
bad_targets, stopped, first_only = y.copy(), mlp(), mlp()
bad_targets[12, 0] = bad_targets[21, 1] = np.nan
try:
    accum_train.fit(stopped, x, bad_targets, batch_size=10, subdivisions=2, shuffle=False, verbose=0, max_bad_steps=2)
except Exception as err:
    out["max_bad_steps"] = [type(err).__name__, str(err)]
accum_train.fit(first_only, x[:10], y[:10], batch_size=10, subdivisions=2, shuffle=False, verbose=0)
out["max_bad_steps"].append(gap(stopped, first_only))

# the noise scale logged as TensorFlow's door logs it: the test trains the same weights on TensorFlow and compares
noisy = mlp()
out["noise start"] = [w.tolist() for w in noisy.get_weights()]
noisy_history = accum_train.fit(noisy, x, y, batch_size=10, epochs=3, subdivisions=3, shuffle=False, verbose=0)
out["noise history"] = noisy_history.history

# precision= for one call: fit's door sets the layers' policies around it (models/precision.py), as on TensorFlow;
# model.fit under the same policies is the oracle, float32 model.fit the counterfactual (bfloat16 compute moves it)
from accum_train.models.precision import call_precision

for precision in ("mixed_bfloat16",):
    ours, keras_own, float32 = mlp(), mlp(), mlp()
    accum_train.fit(ours, x, y, batch_size=10, subdivisions=3, shuffle=False, verbose=0, precision=precision)
    with call_precision(keras_own, precision):
        keras_own.fit(x, y, batch_size=10, shuffle=False, verbose=0)
    float32.fit(x, y, batch_size=10, shuffle=False, verbose=0)
    policies = sorted({layer.dtype_policy.name for layer in ours.layers})
    out[f"precision={precision}"] = [gap(ours, keras_own), gap(ours, float32), gap(keras_own, float32), policies]

def refusal(name, make, **given):
    try:
        accum_train.fit(make(), x, y, batch_size=10, shuffle=given.pop("shuffle", False), verbose=0, **given)
    except UserError as err:
        out[name] = str(err)

refusal("renorm", lambda: mlp(extra=[keras.layers.BatchNormalization(renorm=True, name="renormed")]), subdivisions=2)
refusal("memory_limit", mlp, memory_limit="1GB")
refusal("shuffle", mlp, shuffle="yes")
refusal("subdivisions=0", mlp, subdivisions=0)  # fit's own checks, as on TensorFlow
refusal("class_weight, sample_weight", mlp, class_weight={0: 2.0}, sample_weight=weights)
refusal("class_weight list", mlp, class_weight=[2.0, 1.0])
try:
    active().Scorer
except UserError as err:
    out["Scorer"] = str(err)
"""
)


# issue 76's oracle matrix, each case two updates (batches of 10 and 9, each in 4 micro-batches: 2, 3, 2, 3 and 2, 2,
# 2, 3, stacked to one shape, so one trace serves both) against Keras' own whole-batch model.fit on JAX. With the
# argument "counterfactual" each case is trained a second time the way that should fail it: without the option it
# tests (one model serves the three clippings), or under Keras' own accumulation (each micro-batch's mean, averaged:
# the objective below), which must land more than 1e-5 from model.fit.
MATRIX = r"""
import json, sys, jax.numpy as jnp, numpy as np, keras, accum_train
from accum_train.backends.jax import backend as door

rng = np.random.default_rng(2)
x = rng.normal(size=(19, 5)).astype("float32")
y = rng.normal(size=(19, 3)).astype("float32")
labels = rng.integers(0, 4, size=(19,))
weights = rng.uniform(0.1, 3.0, size=(19,)).astype("float32")
tokens = rng.integers(1, 7, size=(19, 6)) * (np.arange(6) < rng.integers(1, 7, size=(19, 1)))  # 1 to 6 tokens, 0 pads
tags = rng.integers(0, 3, size=(19, 6))
token_weights = rng.uniform(0.1, 3.0, size=(19, 6)).astype("float32")
sce = lambda reduction: keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
adam = lambda rate=0.05, **options: (lambda: keras.optimizers.Adam(rate, **options))
decay = lambda steps: keras.optimizers.schedules.ExponentialDecay(0.05, steps, 0.5)

def net(loss="mse", optimizer=adam(), head="a", **compiled):
    def make():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((5,))
        hidden = keras.layers.Dense(16, activation="tanh")(inputs)
        heads = {"a": keras.layers.Dense(3, name="a")(hidden), "b": keras.layers.Dense(4, name="b")(hidden)}
        model = keras.Model(inputs, heads if head == "both" else heads[head])
        model.compile(optimizer=optimizer(), loss=loss, **compiled)
        return model
    return make

def tagger(loss):  # an Embedding with mask_zero feeding a per-token Dense: Keras carries the mask to the loss
    def make():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((6,), dtype="int32")
        hidden = keras.layers.Dense(8, activation="tanh")(keras.layers.Embedding(7, 8, mask_zero=True)(inputs))
        model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
        model.compile(optimizer=adam()(), loss=loss)
        return model
    return make

def convnet():  # a Conv1D: on a CPU its micro-steps run unrolled, not in a lax.scan (engine.unrolled_here)
    keras.utils.set_random_seed(1)
    inputs = keras.Input((5, 1))
    hidden = keras.layers.Flatten()(keras.layers.Conv1D(4, 3, padding="same", activation="tanh")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    model.compile(optimizer=adam()(), loss="mse")
    return model

class Averaged(door.KerasObjective):
    def parts(self, *args, **kwargs):
        sums, counts, held, extra = super().parts(*args, **kwargs)
        return jnp.sum(sums / jnp.where(counts == 0, 1.0, counts))[None], jnp.ones(1), held, extra

plain = net()
by_class = {"class_weight": {0: 0.2, 1: 3.0, 3: 0.5}}
two = {"a": "mse", "b": sce("mean_with_sample_weight")}
MATRIX = {  # name: (model, x, y, fit's arguments, counterfactual: "averaged" or a model without the case)
    "clipnorm": (net(optimizer=adam(clipnorm=0.05)), x, y, {"sample_weight": weights}, plain),
    "clipvalue": (net(optimizer=adam(clipvalue=0.002)), x, y, {"sample_weight": weights}, plain),
    "global_clipnorm": (net(optimizer=adam(global_clipnorm=0.05)), x, y, {"sample_weight": weights}, plain),
    "schedule": (net(optimizer=adam(decay(1))), x, y, {}, net(optimizer=adam(decay(1 / 4)))),  # in micro-steps
    "sum": (net(keras.losses.MeanSquaredError(reduction="sum"), lambda: keras.optimizers.SGD(0.01)), x, y,
            {"sample_weight": weights}, "averaged"),
    "class_weight": (net(sce("mean_with_sample_weight"), head="b"), x, labels, by_class, "averaged"),
    "outputs": (net(two, head="both", loss_weights={"a": 0.3, "b": 2.0}), x, {"a": y, "b": labels},
                {"sample_weight": weights}, "averaged"),
    "convolution, unrolled": (convnet, x[..., None], y, {"sample_weight": weights}, "averaged"),
    "mask": (tagger(sce("sum_over_batch_size")), tokens, tags, {}, "averaged"),
    "mask mean_with_sample_weight": (tagger(sce("mean_with_sample_weight")), tokens, tags,
                                     {"sample_weight": token_weights}, "averaged"),
}
apart = lambda a, b: max(float(np.max(np.abs(u - v))) for u, v in zip(a, b))
without = {}
for name, (make, data, targets, given, counter) in MATRIX.items():
    if sys.argv[1:] != ["counterfactual"] and name not in QUICK:  # the rest in the slow suite's run, exact too
        continue
    runs = ["exact", "counterfactual"] if sys.argv[1:] == ["counterfactual"] else ["exact"]
    keras_own = make()
    keras_own.fit(data, targets, batch_size=10, shuffle=False, verbose=0, **given)
    for run in runs:
        if run == "counterfactual" and counter in without:
            out[name].append(apart(without[counter], keras_own.get_weights()))
            continue
        model = make() if run == "exact" or counter == "averaged" else counter()
        start = model.get_weights()
        door.KerasObjective = Averaged if run == "counterfactual" and counter == "averaged" else Averaged.__base__
        accum_train.fit(model, data, targets, batch_size=10, subdivisions=4, shuffle=False, verbose=0, **given)
        if run == "exact":  # to Keras' weights, moved from the start, in 2 optimizer steps
            out[name] = [apart(model.get_weights(), keras_own.get_weights()), apart(model.get_weights(), start),
                         int(model.optimizer.iterations)]
        else:
            if counter != "averaged":
                without[counter] = model.get_weights()
            out[name].append(apart(model.get_weights(), keras_own.get_weights()))
from accum_train.backends.jax.engine import unrolled_here
out["unrolled"] = [unrolled_here(convnet()), unrolled_here(plain())]
"""


# issue 76's install without TensorFlow: a finder put in place before accum_train is imported refuses tensorflow and
# tensorlayer as if neither were installed; accum_train.fit then trains on arrays, against Keras' own model.fit
MEMORY = r"""
# the update's buffers as XLA compiled them (its own analysis: nothing runs), for nets whose activations outweigh their
# weights: a batch whole, the same batch as micro-batches of 8, and one micro-batch of 8 alone; the dense net's
# micro-steps run in a lax.scan, the convnet's unrolled (engine.unrolled_here)
from accum_train import keras_private
from accum_train.backends.jax.engine import stacked

NETS = {
    "dense": lambda: [keras.Input((128, 16)), keras.layers.Dense(64, activation="relu"),
                      keras.layers.Dense(64, activation="relu"), keras.layers.GlobalAveragePooling1D()],
    "conv": lambda: [keras.Input((128, 16)), *(keras.layers.Conv1D(64, 3, padding="same", activation="relu")
                                                for _ in range(2)), keras.layers.GlobalAveragePooling1D()],
}

def compiled(batch, k, kind="dense"):
    keras.utils.set_random_seed(0)
    net = keras.Sequential([*NETS[kind](), keras.layers.Dense(4)])
    net.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images, classes = np.zeros((batch, 128, 16), "float32"), np.zeros((batch,), "int32")
    keras_private.symbolic_build(net, (images[:8], classes[:8], None))
    engine = backend.accumulator_for(net, backend.KerasObjective(net), net.optimizer, subdivisions=k)
    micro = batch // k
    parts = [(images[i * micro : (i + 1) * micro], classes[i * micro : (i + 1) * micro], None) for i in range(k)]
    analysis = engine._update.lower(*engine._state(), stacked(parts), np.float32(batch)).compile().memory_analysis()
    state = sum(v.numpy().nbytes for v in [*net.trainable_variables, *net.optimizer.variables])
    cache = 4 * sum(int(np.prod(v.shape)) for v in net.trainable_variables)  # float32, one normaliser group
    return [analysis.temp_size_in_bytes, analysis.alias_size_in_bytes, state, cache]

SIZES = {"memory": ("dense", 64, 8), "memory, unrolled": ("conv", 32, 4)}  # the convnet's unrolled steps compile apart
for name, (kind, batch, k) in SIZES.items():
    shapes = {"whole": (batch, 1), "cut": (batch, k), "one": (8, 1)}
    out[name] = {key: compiled(*shape, kind) for key, shape in shapes.items()}
"""

WITHOUT_TENSORFLOW = (
    r"""
# after the rest, in the same process: none of it, nor this, loaded TensorFlow (CASES blocks its import)
from accum_train.config import ModelConfig
from accum_train.errors import UserError
from accum_train.models import build_model

"""
    + PLAIN
    + r"""
ours, keras_own = mlp(), mlp()
accum_train.fit(ours, x, y, batch_size=10, subdivisions=3, epochs=2, shuffle=False, verbose=0)
keras_own.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0)
out["arrays"] = [float(np.max(np.abs(a - b))) for a, b in zip(ours.get_weights(), keras_own.get_weights())]
out["moved"] = max(float(np.max(np.abs(a - b))) for a, b in zip(ours.get_weights(), mlp().get_weights()))

try:
    build_model(ModelConfig(name="mlp"), 0, (5,), 3)
except UserError as err:
    out["built-in net"] = str(err)
out["tensorflow loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "tensorlayer"))
"""
)


# sources of batches on JAX without TensorFlow, in the slow suite (a process of their own: six fits compile)
SOURCES = (
    BLOCKED
    + r"""
import json, numpy as np, keras, accum_train
"""
    + PLAIN
    + r"""
class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 3

    def __getitem__(self, i):
        return x[10 * i : 10 * i + 10], y[10 * i : 10 * i + 10]

# sources of batches, read without TensorFlow: each trained as model.fit trains on the same batches
tens = lambda: ((x[i : i + 10], y[i : i + 10]) for i in (0, 10, 20))  # a generator of batches of 10, 10 and 3
sources = {
    "generator": (tens, dict()),
    "generator, steps_per_epoch": (tens, dict(steps_per_epoch=1, epochs=3)),
    "PyDataset": (Batches, dict(epochs=2)),
}
for name, (source, given) in sources.items():
    ours, keras_own = mlp(), mlp()
    accum_train.fit(ours, source(), subdivisions=2, shuffle=False, verbose=0, **given)
    keras_own.fit(source(), shuffle=False, verbose=0, **given)
    out[name] = [float(np.max(np.abs(a - b))) for a, b in zip(ours.get_weights(), keras_own.get_weights())]
out["tensorflow loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "tensorlayer"))
"""
)


# the rest of the loop's cases on JAX, in the slow suite (a process of their own: their fits compile for seconds)
LOOP = (
    r"""
import contextlib, io, json, numpy as np, keras, accum_train

"""
    + PLAIN
    + r"""
gap = lambda a, b: max(float(np.max(np.abs(u - v))) for u, v in zip(a.get_weights(), b.get_weights()))
"""
    + LOOP_DEFS
    + r"""
logged("validation_data", validation_data=(vx, vy), validation_freq=2, validation_batch_size=4, epochs=4)
logged("validation_split", validation_split=0.3, epochs=2)
logged("stop_training, initial_epoch", validation_data=(vx, vy), initial_epoch=1, epochs=5, stop_after=2)

# a tf.data.Dataset read on from epoch to epoch (steps_per_epoch: 3 epochs of 2 updates over batches of 10, 10, 3
# repeated), validated on a PyDataset; a dataset validated on a dataset
import tensorflow as tf

class Validation(keras.utils.PyDataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return vx[4 * i : 4 * i + 4], vy[4 * i : 4 * i + 4]

batches = lambda: (tf.data.Dataset.from_tensor_slices((x, y)).batch(10),)
logged("a dataset read on, a PyDataset's validation", source=lambda: (batches()[0].repeat(),), steps_per_epoch=2,
       epochs=3, validation_data=Validation())
logged("a dataset's validation", source=batches, epochs=2,
       validation_data=tf.data.Dataset.from_tensor_slices((vx, vy)).batch(4))

# batch_schedule on JAX, with tests/test_fit_batch_schedule.py's data, model and schedules: each epoch one pass at the
# batch in force (micro-batches of 4), the call ending where model.fit ends called once per batch size; the
# noise-scale rule growing the batch as its lines say
r11 = np.random.default_rng(11)
X48, Y48 = r11.random((48, 5), dtype=np.float32), r11.random((48, 1), dtype=np.float32)

def small():
    keras.utils.set_random_seed(5)
    built = keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)])
    built.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return built

def rule_phases(lines, epochs=4, first=8):  # (first epoch, end, batch size) of each size the lines name
    changes = [line for line in lines if "->" in line]  # "... batch_size 8 -> 12 from epoch 3"
    starts = [(0, first)] + [(int(line.split()[-1]) - 1, int(line.split("-> ")[1].split()[0])) for line in changes]
    return tuple((start, end, size) for (start, size), (end, _) in zip(starts, starts[1:] + [(epochs, None)]))

for name, schedule, phases in (
    ("batch_schedule", [{"epoch": 1, "batch_size": 8}, {"epoch": 3, "batch_size": 20}], ((0, 2, 8), (2, 4, 20))),
    ("noise rule", {"rule": "noise_scale", "max_batch_size": 24}, None),  # the sizes its lines name
):
    ours, keras_own, said = small(), small(), io.StringIO()
    with contextlib.redirect_stdout(said):
        accum_train.fit(ours, X48, Y48, epochs=4, batch_size=None if phases else 8, micro_batch_size=4,
                        batch_schedule=schedule, shuffle=False, verbose=2)
    lines = [line for line in said.getvalue().splitlines() if line.startswith("noise scale")]
    for first, end, size in phases or rule_phases(lines):
        keras_own.fit(X48, Y48, batch_size=size, epochs=end, initial_epoch=first, shuffle=False, verbose=0)
    out[name] = [gap(ours, keras_own), lines, [size for _, _, size in phases or rule_phases(lines)]]

# micro_batch_size="auto" on JAX: a device that fits micro-batches of 3 examples or fewer (XLA's out-of-memory error
# otherwise, as the engine's jitted update raises it): each update retried at twice the micro-batches until it fits,
# to model.fit's weights; a fixed k that does not fit ends the call in one line
import jax
from accum_train.backends.jax import engine as jax_engine
from accum_train.errors import OutOfMemory
real_retrace = jax_engine.Accumulator.retrace

def small_device(self):
    real_retrace(self)
    jitted = self._update

    def update(trainable, held, optimizer_values, batches, n):
        if batches[0].shape[1] > 3:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB")
        return jitted(trainable, held, optimizer_values, batches, n)

    self._update = update

jax_engine.Accumulator.retrace = small_device
ours, keras_own, said = metered_mlp(), metered_mlp(), io.StringIO()
with contextlib.redirect_stdout(said):
    accum_train.fit(ours, x, y, batch_size=10, micro_batch_size="auto", epochs=2, shuffle=False, verbose=2)
keras_own.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0)
said = [line for line in said.getvalue().splitlines() if line.startswith(("update", "micro"))]  # the guard's
out["auto"] = [gap(ours, keras_own), said]
try:
    accum_train.fit(mlp(), x, y, batch_size=10, subdivisions=2, verbose=0)
except OutOfMemory as err:
    out["auto, fixed k"] = str(err)
jax_engine.Accumulator.retrace = real_retrace

"""
)


# trim_padding on JAX: a masked tagger (Embedding(mask_zero=True), LSTM) on sequences of 1 to 24 steps, its padding
# weighted 0, each update's micro-batches cut after the batch's longest sequence rounded up to the multiple: model.fit's
# weights and History (validation too) uncut, for a loss that averages every position and one that divides by its
# weights; the update's shapes compiled, one per length a batch rounds to; what the cut would change, refused
TRIM = r"""
import json, numpy as np, keras, accum_train
from accum_train.backends.jax import engine as jax_engine
from accum_train.errors import UserError

rng = np.random.default_rng(2)
lengths = np.sort(rng.integers(1, 25, size=40))  # in order: each batch of 10 has a longest of its own
tokens = rng.integers(1, 30, size=(40, 24)) * (np.arange(24) < lengths[:, None])
tags, w = rng.integers(0, 3, size=(40, 24)), (tokens != 0).astype("float32")

def tagger(reduction="sum_over_batch_size", metrics=None, masked=True, steps_apart=False):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((None,), dtype="int32")
    h = keras.layers.Embedding(30, 8, mask_zero=masked)(inputs)
    if steps_apart:  # no mask, each step on its own: the padding's weight 0 keeps it out of the sum, not the count
        h = keras.layers.Dense(8, activation="tanh")(h)
    else:
        h = keras.layers.LSTM(8, return_sequences=True)(h) if masked else keras.layers.Conv1D(8, 3, padding="same")(h)
    model = keras.Model(inputs, keras.layers.Dense(3)(h))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=loss, weighted_metrics=["accuracy"], metrics=metrics)
    return model

shapes = set()  # the micro-steps' inputs as they were traced: one compile each
real_micro = jax_engine.Accumulator._micro_fn
def seen(self, trainable, held, cache, totals, batch, *rest):
    shapes.add(batch[0].shape)
    return real_micro(self, trainable, held, cache, totals, batch, *rest)
jax_engine.Accumulator._micro_fn = seen
fixed = dict(sample_weight=w, batch_size=10, epochs=2, shuffle=False, verbose=0)
val = (tokens[::5], tags[::5], w[::5])
for reduction in ("sum_over_batch_size", "mean_with_sample_weight", "every position"):
    for multiple in (1, 8):
        make = lambda: tagger(masked=False, steps_apart=True) if reduction == "every position" else tagger(reduction)
        ours, keras_own = make(), make()
        shapes.clear()
        got = accum_train.fit(ours, tokens, tags, subdivisions=2, trim_padding=multiple, validation_data=val, **fixed)
        updates = sorted(shapes)
        want = keras_own.fit(tokens, tags, validation_data=val, **fixed)
        apart = max(float(np.max(np.abs(a - b))) for a, b in zip(ours.get_weights(), keras_own.get_weights()))
        logs = max(abs(got.history[k][-1] / want.history[k][-1] - 1) for k in want.history)
        out[f"{reduction} {multiple}"] = [apart, logs, [list(shape) for shape in updates]]

class Batches(keras.utils.PyDataset):  # the same batches of 10 as a stream, long and short sequences interleaved
    def __len__(self):
        return 4

    def __getitem__(self, i):
        rows = 10 * i + np.array([0, 9, 1, 8, 2, 7, 3, 6, 4, 5])
        return tokens[rows], tags[rows], w[rows]

for multiple in (1, 8):
    ours, keras_own = tagger(), tagger()
    shapes.clear()
    accum_train.fit(ours, Batches(), subdivisions=2, trim_padding=multiple, epochs=2, shuffle=False, verbose=0)
    updates = sorted(shapes)
    keras_own.fit(Batches(), epochs=2, shuffle=False, verbose=0)
    apart = max(float(np.max(np.abs(a - b))) for a, b in zip(ours.get_weights(), keras_own.get_weights()))
    out[f"stream {multiple}"] = [apart, [list(shape) for shape in updates]]
jax_engine.Accumulator._micro_fn = real_micro
out["longest"] = [int(lengths[i]) for i in range(4, 40, 5)]  # each micro-batch's: 5 of each batch of 10
for name, model in (("unweighted metric", tagger(metrics=["accuracy"])), ("unmasked", tagger(masked=False))):
    try:
        accum_train.fit(model, tokens, tags, subdivisions=2, trim_padding=4, **fixed)
    except UserError as err:
        out[name] = str(err).replace(model.name, "NAME")
"""


def child(code, *args):
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    code = f'out = {{}}\n{code}\nprint("CASES " + json.dumps(out))'  # what the code leaves in ``out``, as JSON
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env)
    line = next((line for line in done.stdout.splitlines() if line.startswith("CASES ")), None)
    assert line is not None, done.stderr[-3000:]
    return json.loads(line.removeprefix("CASES "))


@pytest.fixture(scope="module")
def cases():
    quick = f"QUICK = {QUICK_MATRIX!r}\n"  # the matrix's cases this process runs
    return child(CASES + quick + MATRIX + MEMORY + WITHOUT_TENSORFLOW)  # one process: each start costs seconds


@pytest.mark.parametrize("case", ["mse k=3", "weighted mean k=4", "micro_batch_size=4"])
def test_three_updates_equal_keras_whole_batch_fit_on_jax(cases, case):
    apart, moved, loss, keras_loss = cases[case]
    assert apart < 1e-5 and moved > 1e-2  # trained, and to Keras' own weights
    assert loss == pytest.approx(keras_loss, rel=1e-5)


LATER = "is not on Keras' JAX backend yet (issue 76): train it with KERAS_BACKEND=tensorflow"


@pytest.mark.parametrize(
    "case, message",
    [
        ("renorm", f"accum_train.fit: BatchNormalization with renorm=True (renormed) {LATER}"),
        ("memory_limit", f"accum_train.fit: memory_limit='1GB' {LATER}"),
        ("subdivisions=0", "accum_train.fit: subdivisions=0 must be an integer >= 1"),
        (
            "class_weight, sample_weight",  # model.fit refuses the pair: TensorFlow's door's line
            "accum_train.fit: class_weight and sample_weight together, which model.fit refuses: pass sample_weight "
            "alone, each example's weight times its class's",
        ),
        (
            "class_weight list",  # fit's door checks it before either backend's
            "accum_train.fit: class_weight is a list: pass a dict of class index to weight, such as {0: 1.0, 1: 5.0}",
        ),
        ("Scorer", f"accum-train's 'Scorer' {LATER}"),  # a name of the seam the backend has not yet (the CLI's)
    ],
)
def test_what_the_jax_backend_does_not_cover_yet_is_refused_in_one_line(cases, case, message):
    assert cases[case] == message


@pytest.mark.parametrize(
    "case, names",
    [
        ("metrics", ["accuracy", "entropy", "loss", "weighted_accuracy"]),
        ("tagger metrics", ["accuracy", "loss", "top2"]),
        ("per-output losses", ["a_loss", "b_loss", "loss"]),
    ],
)
def test_compiled_metrics_on_jax_log_model_fit_s_values(cases, case, names):
    """Each epoch's logs in History as model.fit's on JAX, the ragged micro-batches' padding counted nowhere: sample
    weights in ``weighted_metrics`` alone, and a per-token output's mask not in the metrics (Keras' JAX trainer hands
    its metrics the outputs without it, so that every token counts, the masked ones too)."""
    ours, keras_own = cases[case]["accum_train.fit"], cases[case]["model.fit"]
    assert sorted(ours) == sorted([*keras_own, "noise_scale"])  # model.fit's keys, and the noise scale (k=4)
    assert sorted(keras_own) == names
    for name, values in keras_own.items():
        assert ours[name] == pytest.approx(values, rel=1e-5, abs=1e-6), name
    if case == "metrics":
        assert ours["accuracy"] != ours["weighted_accuracy"]  # the sample weights reach the weighted metric alone


@pytest.fixture(scope="module")
def loop_cases():
    return child(LOOP)


KEYS = ["loss", "mae", "noise_scale", "val_loss", "val_mae"]


@pytest.mark.parametrize(
    "case, events",
    [
        # 4 epochs of 3 updates, 2 events around them, the validation of epochs 2 and 4 in 2 batches
        pytest.param("validation_data", 2 + 4 * (3 + 2) + 2 * (1 + 2), marks=pytest.mark.slow),
        pytest.param("validation_split", 2 + 2 * (2 + 2) + 2 * (1 + 1), marks=pytest.mark.slow),
        # epochs 2 and 3 (1-based) of 5: stopped after the second
        pytest.param("stop_training, initial_epoch", 2 + 2 * (3 + 2 + 1 + 1), marks=pytest.mark.slow),
        # 3 epochs of 2 updates, each validated on 2 batches
        pytest.param(
            "a dataset read on, a PyDataset's validation", 2 + 3 * (2 + 2) + 3 * (1 + 2), marks=pytest.mark.slow
        ),
        pytest.param("a dataset's validation", 2 + 2 * (3 + 2) + 2 * (1 + 2), marks=pytest.mark.slow),
    ],
)
def test_fit_on_jax_runs_model_fit_s_callbacks_validation_and_history(request, case, events):
    """The one loop (keras_fit/fit_hooks.py) driving the JAX engine: the weights, every History value (to 1e-5,
    relative) and every callback event with its logs' keys in model.fit's order, the validation only on the epochs
    validation_freq names, a callback's stop_training and initial_epoch honoured as model.fit honours them."""
    found = request.getfixturevalue("loop_cases")
    apart, history, got_keys, same_events, seen = found[case]
    assert apart < 1e-5 and max(history.values()) < 1e-5
    assert (got_keys, same_events, seen) == (KEYS, True, events)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["batch_schedule", "noise rule"])
def test_a_batch_schedule_on_jax_ends_where_model_fit_ends_at_each_batch_size(loop_cases, case):
    """Each epoch one pass at the batch in force: model.fit's weights called once per batch size. The noise rule's
    sizes are those its lines name (one a decision at each epoch's end but the last), which grew the batch; its
    estimate is the TensorFlow door's for the same weights and batches (below), and Keras draws other first weights
    on JAX, so its lines are JAX's own."""
    apart, lines, sizes = loop_cases[case]
    assert apart < 1e-5
    if case == "noise rule":
        assert len(lines) == 3 and sizes[-1] > sizes[0] == 8 and sizes == sorted(sizes)


@pytest.mark.slow
def test_micro_batch_size_auto_on_jax_retries_an_update_that_runs_out_of_memory_at_twice_the_micro_batches(
    loop_cases,
):
    """A device that fits 3 examples a micro-batch: the first update tried as 1, 2 and 4 micro-batches (of 10, 5 and
    3 examples), nothing applied until it fits, the call then at model.fit's weights; a fixed k ends in one line."""
    apart, lines = loop_cases["auto"]
    assert apart < 1e-5
    assert lines == [
        'micro_batch_size="auto": no memory_limit, so nothing is measured before training: the first update runs as '
        "one micro-batch per replica, and an update that runs out of memory is retried at twice the micro-batches (a "
        "GPU reports running out; a CPU's memory is the machine's)",
        "update 1 ran out of memory with subdivisions=1: retrying the same batch with subdivisions=2",
        "update 1 ran out of memory with subdivisions=2: retrying the same batch with subdivisions=4",
    ]
    assert loop_cases["auto, fixed k"] == (
        "update 1 ran out of memory with subdivisions=2 (RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        "1.00GiB): pass a smaller micro_batch_size, or micro_batch_size='auto'"
    )


@pytest.fixture(scope="module")
def trim_cases():
    return child(TRIM)


@pytest.mark.slow
# "every position": sum_over_batch_size unmasked, which divides by every step, the ones cut away too (24 a sequence)
@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "mean_with_sample_weight", "every position"])
@pytest.mark.parametrize("multiple", [1, 8])
def test_trim_padding_on_jax_is_model_fit_uncut_and_compiles_one_update_per_rounded_length(
    trim_cases, reduction, multiple
):
    """Batches of 10 sequences in order of length: 2 micro-batches of 5 each, each cut to its own longest rounded up
    to the multiple, its micro-step compiled once per length: 8 micro-batches give 8 shapes at a multiple of 1 and
    3 at 8 (their longest: 3 to 24 steps)."""
    apart, logs, shapes = trim_cases[f"{reduction} {multiple}"]
    assert apart < 1e-5 and logs < 1e-5
    rounded = sorted({-(-longest // multiple) * multiple for longest in trim_cases["longest"]})
    assert shapes == [[5, length] for length in rounded] and len(shapes) == {1: 8, 8: 3}[multiple]


@pytest.mark.slow
@pytest.mark.parametrize("multiple", [1, 8])
def test_trim_padding_on_jax_cuts_a_stream_s_micro_batches_as_it_cuts_arrays(trim_cases, multiple):
    """The same batches from a PyDataset, long and short sequences interleaved: each batch ordered by length and
    each micro-batch cut to its own longest, the arrays' shapes; Keras' weights, uncut."""
    apart, shapes = trim_cases[f"stream {multiple}"]
    assert apart < 1e-5
    rounded = sorted({-(-longest // multiple) * multiple for longest in trim_cases["longest"]})
    assert shapes == [[5, length] for length in rounded]


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, message",
    [
        (
            "unweighted metric",
            "accum_train.fit: trim_padding changes the compiled metric 'accuracy' of model 'NAME' on Keras' JAX "
            "backend, whose trainer gives metrics the outputs without their mask, so that they count the padding "
            "steps the cut takes away: weigh the padding 0 (sample_weight, and the metric in weighted_metrics), or "
            "leave trim_padding out",
        ),
        (
            "unmasked",
            "accum_train.fit: trim_padding changes the loss summed of model 'NAME' (a micro-batch cut from 24 to 4 "
            "steps): padding must change nothing, so mask it (Embedding(mask_zero=True), Masking) and keep layers "
            "that mix time steps masked, or leave trim_padding out",
        ),
    ],
)
def test_what_trim_padding_would_change_on_jax_is_refused_in_one_line(trim_cases, case, message):
    assert trim_cases[case] == message


def test_batchnorm_on_jax_at_k_1_is_model_fit_s_to_the_weights_and_statistics(cases):
    apart, moved, statistics = cases["batchnorm k=1"]
    assert apart < 1e-5 and moved > 1e-2 and statistics < 1e-5


def test_batchnorm_on_jax_moves_its_statistics_once_per_update_from_the_pooled_batch(cases):
    apart, moved, moved_per_micro_step = cases["batchnorm stats k=4"]
    assert apart < 1e-5 and moved > 1e-2
    assert moved_per_micro_step > 1e-2  # the counterfactual: Keras' own call moving them in each micro-step


def test_a_skipped_update_on_jax_leaves_batchnorm_statistics_as_they_were(cases):
    statistics, weights, moved = cases["batchnorm skipped"]
    assert statistics == 0.0 and weights == 0.0 and moved > 1e-2


@pytest.mark.parametrize("weighted", [False, True])
def test_an_update_on_jax_records_the_noise_scale_s_terms_of_its_micro_batches(cases, weighted):
    """The record the noise scale's estimate folds in (trainer/noise.py): each micro-batch's own mean gradient's squared
    norm, summed, and its size (its examples, or its sample weights' sum under mean_with_sample_weight), from the one
    jitted update, equal to jax.grad of each micro-batch's mean loss taken apart."""
    noise, batch, (squares, inverses, k, whole, total) = cases[f"noise weighted={weighted}"]
    assert noise == pytest.approx([squares, inverses, k], rel=1e-5)
    assert batch == pytest.approx([whole, total], rel=1e-5)
    assert squares > 2 * whole  # micro-batches' gradients are noisier than the batch's: the terms are not vacuous


def test_max_bad_steps_on_jax_stops_the_call_with_tensorflow_s_line_at_the_last_good_weights(cases):
    kind, message, apart = cases["max_bad_steps"]
    assert (kind, message) == (
        "TrainingStopped",
        "2 updates in a row had a non-finite loss or gradient (max_bad_steps=2), the last at update 3; the weights "
        "are those of the last good update: lower the optimizer's learning rate or compile it with an optimizer that "
        "clips (clipnorm)",
    )
    assert apart == 0.0


def test_the_noise_scale_on_jax_is_tensorflow_s_for_the_same_weights_and_batches(cases):
    """History's noise_scale per epoch, from the same first weights and the same 3 epochs of 3 updates in 3
    micro-batches, on JAX (the child) and on TensorFlow (this process): the same estimate, to float rounding."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    model.set_weights([np.asarray(w, "float32") for w in cases["noise start"]])
    rng = np.random.default_rng(0)  # the child's x and y
    x, y = rng.normal(size=(23, 5)).astype("float32"), rng.normal(size=(23, 3)).astype("float32")
    history = accum_train.fit(model, x, y, batch_size=10, epochs=3, subdivisions=3, shuffle=False, verbose=0).history
    jax_history = cases["noise history"]
    assert list(jax_history) == list(history) == ["loss", "noise_scale"]
    assert all(value > 0 for value in history["noise_scale"])
    assert jax_history["noise_scale"] == pytest.approx(history["noise_scale"], rel=1e-3)
    assert jax_history["loss"] == pytest.approx(history["loss"], rel=1e-5)


def test_a_call_s_precision_on_jax_trains_as_model_fit_under_those_policies_and_restores_them(cases):
    """precision="mixed_bfloat16" for one call: within 3e-3 of model.fit under the same policies (bfloat16 rounds each
    micro-batch's sums: TOLERANCE's figure), further from float32 model.fit than that, the policies float32 after."""
    to_policy, to_float32, keras_to_float32, policies = cases["precision=mixed_bfloat16"]
    assert to_policy <= 3e-3 and keras_to_float32 > to_policy and to_float32 > 1e-4
    assert policies == ["float32"]


def test_a_frozen_layer_on_jax_stays_to_the_bit_while_the_rest_trains_to_keras_weights(cases):
    apart, moved, frozen_moved, _ = cases["frozen k=3"]
    assert apart < 1e-5 and moved > 1e-2 and frozen_moved == 0.0


@pytest.mark.parametrize("case, traces", [("frozen k=3", 1), ("dropout k=1", 2), ("dropout k=3", 2)])
def test_a_short_last_batch_on_jax_is_padded_to_the_compiled_update_but_for_a_model_that_draws(cases, case, traces):
    """Batches of 10, 10 and 3: the last one's micro-batches padded to the others' rows, weighted 0, so one update is
    compiled for the three. A model with a Dropout draws its mask for the shape it is given, so its last batch keeps
    its own shape (a second compile) and at k=1 its draws stay model.fit's (the dropout cases' test)."""
    assert cases[f"{case} traces"] == traces


@pytest.mark.parametrize("k, masks", [(1, "model.fit's"), (3, "one per micro-step")])
def test_a_dropout_on_jax_draws_a_mask_per_micro_step_from_its_seed_state(cases, k, masks):
    """The seed state (seed 4) moves on once per micro-step: 3 updates of k micro-steps leave its counter at 3k. At
    k=1 that is model.fit's draw, so the weights are model.fit's to the bit; at k=3 each micro-batch has its own mask,
    other than the whole batch's, so the weights are not."""
    apart, moved, _, seeds = cases[f"dropout k={k}"]
    assert seeds == [[4, 3 * k]] and moved > 1e-2
    assert apart == 0.0 if k == 1 else apart > 1e-3


@pytest.mark.parametrize("shuffle", [True, "batch"])
def test_a_shuffled_fit_on_jax_trains_on_each_epoch_in_tensorflow_s_order(cases, shuffle):
    """Two shuffled epochs equal shuffle=False on the arrays permuted per epoch by order.py, and that order is the one
    TensorFlow's door trains on (its ArrayFeed's): with the same seed both backends visit the examples alike."""
    apart, moved, orders = cases[f"shuffle={shuffle!r}"]
    assert apart < 1e-6 and moved > 1e-2
    feed = ArrayFeed(np.zeros((20, 5)), np.zeros((20, 3)), None, None, batch_size=5, shuffle=shuffle, seed=9,
                     steps_per_epoch=None)  # fmt: skip
    assert [feed._pass_order(epoch).tolist() for epoch in range(2)] == orders
    assert orders[0] != orders[1] and list(range(20)) not in orders


def test_a_fit_on_jax_with_fit_s_defaults_shuffles_by_a_drawn_seed(cases):
    """shuffle=True and seed=None, as a Keras user's first call: it trains."""
    moved, loss = cases["seed=None"]
    assert moved > 1e-2 and np.isfinite(loss)


def test_a_bad_shuffle_is_refused_on_jax_in_tensorflow_s_door_s_line(cases):
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    with pytest.raises(UserError) as raised:
        accum_train.fit(model, np.zeros((4, 5)), np.zeros((4, 3)), shuffle="yes")
    assert cases["shuffle"] == str(raised.value) == "accum_train.fit: shuffle='yes' must be True, False or 'batch'"


@pytest.mark.parametrize("loop", ["memory", "memory, unrolled"])
def test_an_update_s_memory_on_jax_follows_the_micro_batch_and_its_state_is_donated(cases, loop):
    """Issue 76's "buffers donated so that memory follows the micro-batch", in XLA's own analysis of the compiled
    update: a batch as micro-batches of 8 (64 as 8, in a scan; a convnet's 32 as 4, unrolled on a CPU) needs the
    temporary memory of one micro-batch of 8 plus the float32 cache, far under the whole batch's; and the weights and
    the optimizer's slots are written in place (donated). Unrolled, engine.after runs the micro-steps one after
    another; without it XLA runs them side by side and holds every micro-batch's activations."""
    memory = cases[loop]
    (whole, _, state, cache), (cut, donated, _, _), (one, _, _, _) = (memory[key] for key in ("whole", "cut", "one"))
    # beside a micro-step's own: the cache, the carry, XLA's scratch; unrolled, XLA keeps a little of one micro-step
    # beside the next
    assert cut <= (1.1 if loop == "memory" else 1.3) * one + cache, memory
    assert whole > 2.5 * cut, memory
    assert donated == state, memory


def test_a_later_fit_call_reuses_the_engine_and_its_compiled_update_until_a_compile(cases):
    assert cases["traced again"] == [0, True]


def test_the_jax_accumulator_answers_the_engine_protocol(cases):
    assert cases["answers Engine"] == ["jax", True, 2]


def test_an_update_accumulated_and_finished_in_two_calls_is_the_one_call_s_bits(cases):
    assert cases["accumulate, finish"] == 0.0


# the quick suite's cases of the matrix (each also in the slow suite's run of all of them, with its counterfactual)
QUICK_MATRIX = ("class_weight", "outputs", "convolution, unrolled", "mask mean_with_sample_weight")
MATRIX_CASES = [
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "schedule",
    "sum",
    "class_weight",
    "outputs",
    "convolution, unrolled",
    "mask",
    "mask mean_with_sample_weight",
]


def test_a_model_with_convolutions_runs_its_micro_steps_unrolled_on_a_cpu_and_others_in_a_scan(cases):
    assert cases["unrolled"] == [True, False]  # the convnet's case of the matrix is the unrolled path's oracle


@pytest.mark.parametrize("case", QUICK_MATRIX)
def test_the_oracle_matrix_on_jax_equals_keras_whole_batch_fit(cases, case):
    """Optimizer options on the accumulated gradient, a schedule counted in updates, the sum reduction, class
    weights, several outputs with loss weights, masks: two ragged updates, each Keras' whole-batch update."""
    apart, moved, steps = cases[case]
    assert apart < 1e-5 and moved > 1e-2 and steps == 2


@pytest.fixture(scope="module")
def counterfactuals():
    return child(MATRIX + PRECISION, "counterfactual")


# mixed precision on JAX (slow suite: its process is the counterfactuals'): 2 updates in 4 micro-batches against
# float32 model.fit and model.fit under the same policy. Under mixed_float16 Keras' compile wraps the optimizer in a
# LossScaleOptimizer: each micro-step's loss is scaled by its dynamic scale, its stateless_apply unscales the summed
# gradient once. Targets of 1e-4 give float16 gradients that underflow unscaled (the counterfactual: scale 1).
PRECISION = r"""
from accum_train.backends.jax import engine as jax_engine

door.KerasObjective = Averaged.__base__  # the matrix's last counterfactual may have left Keras' averaging in place
OPTIMIZERS = {"mixed_bfloat16": adam(0.01), "mixed_float16": adam(0.01), "bfloat16": lambda: keras.optimizers.SGD(0.1)}

def mixed(policy, like=None):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)])
    model.compile(optimizer=OPTIMIZERS[like or policy](), loss="mse")
    keras.mixed_precision.set_global_policy("float32")
    return model

def reference(policy, targets):  # float32 from the policy's first weights (a bfloat16 model's are drawn apart)
    model = mixed("float32", like=policy)
    model.set_weights([w.astype("float32") for w in mixed(policy).get_weights()])
    model.fit(x, targets, batch_size=10, shuffle=False, verbose=0)
    return model

gap = lambda a, b: max(float(np.max(np.abs(np.float32(u) - np.float32(v)))) for u, v in zip(a, b))
for policy in OPTIMIZERS:
    for scale in (1.0, 1e-4):
        targets = y * scale
        float32, same, ours = reference(policy, targets), mixed(policy), mixed(policy)
        same.fit(x, targets, batch_size=10, shuffle=False, verbose=0)
        engines = []
        built = jax_engine.Accumulator.__init__
        def keep(self, *args, **kwargs):
            built(self, *args, **kwargs)
            engines.append(self)
        jax_engine.Accumulator.__init__ = keep
        accum_train.fit(ours, x, targets, batch_size=10, subdivisions=4, shuffle=False, verbose=0)
        jax_engine.Accumulator.__init__ = built
        engine = engines[0]
        engine.accumulate(x[:5], targets[:5], 5)  # the cache as a micro-step leaves it
        cache = str(engine._cache[0].dtype)
        engine.reset()
        state = lambda model: [float(v.numpy()) for v in model.optimizer.variables[:2]]
        weights = lambda model: model.get_weights()
        case = {"v float32": gap(weights(ours), weights(float32)),
                "v the policy's model.fit": gap(weights(ours), weights(same)),
                "model.fit v float32": gap(weights(same), weights(float32)),
                "moved": gap(weights(ours), weights(mixed(policy))),
                "cache": cache, "weights": str(ours.get_weights()[0].dtype),
                "optimizer": type(ours.optimizer).__name__}
        if policy == "mixed_float16":  # the scale and its step counter as model.fit leaves them; then unscaled
            case["loss scale"] = [state(ours), state(same)]
            ours = mixed(policy)
            engine_scale = jax_engine.Accumulator._scale
            jax_engine.Accumulator._scale = lambda self, values: 1.0
            accum_train.fit(ours, x, targets, batch_size=10, subdivisions=4, shuffle=False, verbose=0)
            jax_engine.Accumulator._scale = engine_scale
            case["unscaled v float32"] = gap(weights(ours), weights(float32))
        out[f"{policy} targets x{scale:g}"] = case
"""


# each policy's stated tolerance, relative to the targets' scale: the largest weight difference after 2 updates of
# Adam(0.01) from float32 model.fit's weights, and from model.fit's under the same policy (measured: bfloat16's
# 8-bit mantissa rounds each micro-batch's sum where model.fit rounds the batch's once)
TOLERANCE = {"mixed_bfloat16": (5e-3, 3e-3), "mixed_float16": (1e-3, 3e-4), "bfloat16": (3e-2, 2e-2)}


@pytest.mark.slow
@pytest.mark.parametrize("policy", sorted(TOLERANCE))
@pytest.mark.parametrize("scale", ["1", "0.0001"])
def test_mixed_precision_on_jax_stays_within_its_stated_tolerance_with_a_float32_cache(counterfactuals, policy, scale):
    got, (to_float32, to_policy) = counterfactuals[f"{policy} targets x{scale}"], TOLERANCE[policy]
    assert got["moved"] > 1e-2
    assert got["v float32"] <= to_float32 and got["model.fit v float32"] <= to_float32, got
    assert got["v the policy's model.fit"] <= to_policy, got
    assert got["cache"] == "float32"  # a micro-step's gradient summed in float32 whatever the variables' dtype
    assert got["weights"] == ("bfloat16" if policy == "bfloat16" else "float32")
    if policy == "mixed_float16":
        assert got["optimizer"] == "LossScaleOptimizer"
        ours, keras_own = got["loss scale"]
        assert ours == keras_own  # the step counter and the dynamic scale, as model.fit moved them
        if scale == "0.0001":  # unscaled, float16 gradients of 1e-4 targets underflow: the weights stay off
            assert got["unscaled v float32"] > 10 * to_float32, got


@pytest.mark.slow
@pytest.mark.parametrize("case", MATRIX_CASES)
def test_each_oracle_case_on_jax_fails_when_trained_the_way_it_guards_against(counterfactuals, case):
    """The counterfactual of each case (see MATRIX): the same comparison, more than 1e-5 off, so the matrix can fail."""
    apart, _, _, counterfactual = counterfactuals[case]
    assert apart < 1e-5 and counterfactual > 1e-5


@pytest.fixture(scope="module")
def without_tensorflow(cases):
    return cases  # the quick cases' one process, where TensorFlow cannot be imported


def test_fit_trains_on_jax_where_tensorflow_is_not_installed(without_tensorflow):
    """Two epochs of three updates on arrays, each of 3 micro-batches: Keras' own whole-batch model.fit's weights."""
    assert max(without_tensorflow["arrays"]) < 1e-5 and without_tensorflow["moved"] > 1e-2
    assert without_tensorflow["tensorflow loaded"] == []


@pytest.fixture(scope="module")
def sources_cases():
    return child(SOURCES)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["generator", "generator, steps_per_epoch", "PyDataset"])
def test_a_generator_and_a_pydataset_train_on_jax_as_model_fit_without_tensorflow(sources_cases, case):
    """Batches of 10, 10 and 3, each in 2 micro-batches: a generator read once (three epochs of one update each with
    steps_per_epoch=1), a PyDataset read each epoch; model.fit's weights on the same batches, TensorFlow never
    loaded."""
    assert max(sources_cases[case]) < 1e-5 and sources_cases["tensorflow loaded"] == []


def test_a_built_in_net_is_refused_on_jax_in_one_line(without_tensorflow):
    message = "model.name=mlp is a TensorLayer net, which only TensorFlow runs: train it with KERAS_BACKEND=tensorflow"
    assert without_tensorflow["built-in net"] == message
