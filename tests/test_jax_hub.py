"""KerasHub tasks through accum_train.fit on Keras' JAX backend (fit's door preprocesses, accum/backends/jax/backend.py
trains; issue 76 item 3): raw texts batched and preprocessed as ``Task.fit`` feeds them, each update the whole
preprocessed batch's, exact against ``Task.fit`` on JAX (1e-5) with the ragged last batch cut into k micro-batches;
LoRA's frozen weights untouched to the bit; what a task cannot take refused in one line. A plain model on a
tf.data.Dataset of batches takes the same path.

The tiny tasks of hub_tasks.py (built offline, dropout 0). As in test_jax_backend.py, the cases run in one child
process with KERAS_BACKEND=jax, which leaves each outcome in ``out``; each exact case is trained a second time under
Keras' own accumulation (each micro-batch's mean, averaged: the ``Averaged`` objective), which must land more than
1e-5 from Task.fit, so the comparison can fail. Slow: the process compiles each task several times (a minute).
"""

import pathlib

import pytest
from test_jax_backend import LATER, child

pytest.importorskip("jax")
pytest.importorskip("keras_hub")
pytestmark = pytest.mark.slow

CASES = r"""
import sys
sys.path.insert(0, TESTS)
import json, jax.numpy as jnp, keras, numpy as np, tensorflow as tf, accum_train
from accum_train.backends.jax import backend as door
from accum_train.errors import UserError
from hub_tasks import causal_lm, text_classifier, texts

TEXTS = texts(23, seed=1)  # 1 to 12 words, most short; batches of 10, 10, 3 (or 9, 9, 5): the last ragged
LABELS = np.arange(23) % 3
WEIGHTS = np.random.default_rng(0).uniform(0.1, 3.0, size=(23,)).astype("float32")
sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

class Averaged(door.KerasObjective):  # Keras' own accumulation: each micro-batch's mean, averaged
    def parts(self, *args, **kwargs):
        sums, counts, held, extra = super().parts(*args, **kwargs)
        return jnp.sum(sums / jnp.where(counts == 0, 1.0, counts))[None], jnp.ones(1), held, extra

def lm(lora=False):
    keras.utils.set_random_seed(3)
    model = causal_lm()
    if lora:
        model.backbone.enable_lora(2)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=sce, weighted_metrics=["accuracy"])
    return model

def classifier():
    keras.utils.set_random_seed(3)
    model = text_classifier()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=sce, metrics=["accuracy"])
    return model

def raw_batches():
    return tf.data.Dataset.from_tensor_slices(TEXTS).batch(10)

def plain():  # not a task: a plain model on a tf.data.Dataset of (x, y) batches, which the JAX door reads as a task's
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=sce, metrics=["accuracy"])
    return model

FEATURES = np.random.default_rng(4).normal(size=(23, 5)).astype("float32")
plain_batches = tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(9)

apart = lambda a, b: max((float(np.max(np.abs(u - v))) for u, v in zip(a, b)), default=0.0)
values = lambda variables: [v.numpy() for v in variables]
EXACT = {  # name: (the task, Task.fit's data, accum_train.fit's own arguments)
    "causal LM k=3": (lm, dict(x=TEXTS, batch_size=10), dict(subdivisions=3)),
    "causal LM, a dataset of raw batches, k=2": (lm, dict(x=raw_batches()), dict(subdivisions=2)),
    "classifier k=2": (classifier, dict(x=list(TEXTS), y=LABELS, sample_weight=WEIGHTS, batch_size=9),
                       dict(subdivisions=2)),
    "causal LM with LoRA k=3": (lambda: lm(lora=True), dict(x=TEXTS, batch_size=10), dict(micro_batch_size=4)),
    # each update's micro-batches cut after the batch's longest sequence, rounded up to 4: Task.fit's, uncut
    "causal LM, trim_padding=4, k=3": (lm, dict(x=TEXTS, batch_size=10), dict(subdivisions=3, trim_padding=4)),
    "a plain model on a tf.data.Dataset k=2": (plain, dict(x=plain_batches), dict(subdivisions=2)),
}
for name, (make, data, ours) in EXACT.items():
    keras_own, start = make(), make()
    logs = keras_own.fit(**data, epochs=2, verbose=0).history
    got = {}
    for objective in (Averaged.__base__, Averaged):
        door.KerasObjective, model = objective, make()
        fit_data = {**data, "x": raw_batches()} if name.startswith("causal LM, a dataset") else data
        history = accum_train.fit(model, **fit_data, **ours, epochs=2, shuffle=False, verbose=0).history
        got[objective.__name__] = [apart(values(model.trainable_variables), values(keras_own.trainable_variables)),
                                   {key: [a - b for a, b in zip(history[key], logs[key])] for key in logs}]
    door.KerasObjective = Averaged.__base__
    trainable = [v.path for v in model.trainable_variables]
    out[name] = {"exact": got["KerasObjective"], "averaged": got["Averaged"][0],
                 "moved": apart(values(keras_own.trainable_variables), values(start.trainable_variables)),
                 "frozen moved": apart(values(model.non_trainable_variables), values(start.non_trainable_variables)),
                 "frozen": len(model.non_trainable_variables), "trainable": len(trainable),
                 "lora": sum("lora" in path for path in trainable), "steps": int(model.optimizer.iterations)}

# raw validation texts, given or split off, preprocessed as Task.fit preprocesses them: both against Task.fit given
# the split's last 7 of 23 (validation_split=0.3 keeps int(23 * 0.7) = 16 to train on)
keras_own, held = classifier(), (list(TEXTS[16:]), LABELS[16:])
fixed = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
logs = keras_own.fit(list(TEXTS[:16]), LABELS[:16], validation_data=held, **fixed).history
for name, given in (("validation_data", dict(x=list(TEXTS[:16]), y=LABELS[:16], validation_data=held)),
                    ("validation_split", dict(x=list(TEXTS), y=LABELS, validation_split=0.3))):
    model = classifier()
    history = accum_train.fit(model, **given, subdivisions=2, **fixed).history
    out[name] = [apart(values(model.trainable_variables), values(keras_own.trainable_variables)),
                 {key: [a - b for a, b in zip(history[key], logs[key])] for key in logs}]

REFUSED = {
    "class_weight": dict(x=list(TEXTS), y=LABELS, class_weight={0: 2.0}),
    "batch_schedule": dict(x=list(TEXTS), y=LABELS, batch_schedule=[{"epoch": 1, "batch_size": 8}]),
    "an iterator": dict(x=iter([TEXTS[:10]])),
    "a dataset and batch_size": dict(x=raw_batches(), batch_size=10),
    "no x": dict(),
    "no labels": dict(x=TEXTS),
}
for case, given in REFUSED.items():
    model = classifier() if case in ("class_weight", "batch_schedule", "no labels") else lm()
    try:
        accum_train.fit(model, **given, verbose=0)
    except UserError as err:
        out[case] = str(err).replace(model.name, "NAME")  # a name Keras numbers per process
"""


@pytest.fixture(scope="module")
def cases():
    return child(f"TESTS = {str(pathlib.Path(__file__).parent)!r}\n{CASES}")


@pytest.mark.parametrize(
    "case, trainable, steps",
    [
        ("causal LM k=3", 20, 6),  # 2 epochs of 10, 10, 3 raw texts in 3 micro-batches (the last 1, 1, 1)
        ("causal LM, a dataset of raw batches, k=2", 20, 6),
        ("classifier k=2", 25, 6),  # 9, 9, 5 labelled texts, sample-weighted, in 2 (4/5, 4/5, 2/3)
        ("causal LM with LoRA k=3", 6, 6),  # micro_batch_size=4: 3 micro-batches of 10, 3 of the last 3
        ("causal LM, trim_padding=4, k=3", 20, 6),
        ("a plain model on a tf.data.Dataset k=2", 4, 6),  # the dataset's batches of 9, 9, 5
    ],
)
def test_a_kerashub_task_on_jax_ends_at_task_fit_s_weights_and_logs(cases, case, trainable, steps):
    """Each update the whole preprocessed batch's: Task.fit's weights to 1e-5, its History's loss and accuracy for
    both epochs; Keras' averaged micro-batch means (the counterfactual) land more than 1e-5 off."""
    got = cases[case]
    weights, logs = got["exact"]
    assert weights < 1e-5 and got["moved"] > 1e-2 and got["averaged"] > 1e-5, got
    assert sorted(logs) == ["accuracy", "loss"] and all(abs(d) < 1e-5 for key in logs for d in logs[key]), got
    assert (got["trainable"], got["steps"]) == (trainable, steps)


def test_lora_on_jax_trains_the_lora_matrices_alone_and_leaves_the_frozen_weights_to_the_bit(cases):
    got = cases["causal LM with LoRA k=3"]
    assert (got["lora"], got["trainable"]) == (4, 6)  # the attention's query and value: their a, b and bias (Keras'
    # enable_lora leaves a bias trainable)
    assert got["frozen"] > 10 and got["frozen moved"] == 0.0


@pytest.mark.parametrize("case", ["validation_data", "validation_split"])
def test_a_task_s_raw_validation_on_jax_is_preprocessed_as_task_fit_preprocesses_it(cases, case):
    """Validation texts, given or split off the raw examples, batched and preprocessed as on TensorFlow's door:
    Task.fit's weights and every History value, val_ ones too, to 1e-5."""
    weights, logs = cases[case]
    assert weights < 1e-5
    assert sorted(logs) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert all(abs(d) < 1e-5 for key in logs for d in logs[key]), logs


@pytest.mark.parametrize(
    "case, message",
    [
        ("class_weight", f"accum_train.fit: class_weight for model 'NAME', which preprocesses its "
         f"inputs in fit, {LATER}"),
        ("batch_schedule", "accum_train.fit: batch_schedule re-cuts arrays into batches each epoch, and model "
         "'NAME' preprocesses whole batches of raw examples: leave batch_schedule out, or preprocess the data "
         "yourself and pass the model with preprocessor=None"),
        ("an iterator", "accum_train.fit: x is a list_iterator, and model 'NAME' preprocesses its inputs in "
         "fit: pass arrays or lists of raw examples, or a tf.data.Dataset of raw batches"),
        ("a dataset and batch_size", "accum_train.fit: x is a tf.data.Dataset of raw batches for model "
         "'NAME''s preprocessor: leave batch_size out (batch the dataset, and put targets and weights in "
         "its elements)"),
        ("no x", "accum_train.fit: x is missing: pass raw examples (a list or array) or a tf.data.Dataset"),
        ("no labels", "accum_train.fit: model 'NAME''s preprocessor gives no targets for x: pass y"),
    ],
)  # fmt: skip
def test_what_a_task_cannot_take_on_jax_is_refused_in_one_line(cases, case, message):
    assert cases[case] == message
