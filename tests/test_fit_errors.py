"""accum_train.fit's bad calls: each one line of the library's own UserError, word for word, naming the argument at
fault and what it may be, raised before anything trains (the weights and the optimizer as they were) and before
anything is written (output_dir not created). Tiny models, so the table runs in seconds."""

import os

import accum_train
import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train import UserError

N, BATCH = 50, 16
RNG = np.random.default_rng(3)
X = RNG.random((N, 6), dtype=np.float32)
Y = RNG.random((N, 1), dtype=np.float32)
LABELS = RNG.integers(0, 4, N)  # four classes: 0 to 3
PAIRS = tf.data.Dataset.from_tensor_slices((X, Y))


def quantized(model, mode):
    model.quantize(mode)
    return model


def masked_norm():  # a BatchNormalization after an Embedding(mask_zero=True): given the mask, issue 77
    keras.utils.set_random_seed(1)
    tokens = keras.Input((None,), dtype="int32")
    hidden = keras.layers.BatchNormalization(name="norm")(keras.layers.Embedding(10, 4, mask_zero=True)(tokens))
    model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(hidden)), name="masked")
    model.compile(optimizer="sgd", loss="mse")
    return model


def regression(optimizer="sgd", loss="mse", **compile_options):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)], name="regression"
    )
    model.compile(optimizer=optimizer, loss=loss, **compile_options)
    return model


def classifier(loss="sparse_categorical_crossentropy", compiled=True):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.Dense(4)(inputs), name="classifier")
    if compiled:
        model.compile(optimizer="sgd", loss=loss)
    return model


def compiled_with_accuracy(model):
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["acc"])
    return model


def sequence_tagger():
    """5 steps of 3 classes from 6 inputs, sparse cross-entropy: a per-step loss, weighted per step."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.Reshape((5, 3))(keras.layers.Dense(15)(inputs)), name="tagger")
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def two_outputs():
    inputs = keras.Input((6,))
    outputs = [keras.layers.Dense(1, name="a")(inputs), keras.layers.Dense(1, name="b")(inputs)]
    model = keras.Model(inputs, outputs, name="two_outputs")
    model.compile(optimizer="sgd", loss=["mse", "mse"])
    return model


def tagged_and_scored():
    """Two outputs by name: 'tag' (4 classes, sparse cross-entropy) and 'score' (mse)."""
    inputs = keras.Input((6,))
    outputs = {"tag": keras.layers.Dense(4, name="tag")(inputs), "score": keras.layers.Dense(1, name="score")(inputs)}
    model = keras.Model(inputs, outputs, name="tagged")
    model.compile(optimizer="sgd", loss={"tag": "sparse_categorical_crossentropy", "score": "mse"})
    return model


def two_inputs():
    a, b = keras.Input((6,), name="a"), keras.Input((3,), name="b")
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])), name="two_inputs")
    model.compile(optimizer="sgd", loss="mse")
    return model


class OwnStep(keras.Model):
    def train_step(self, data):
        return super().train_step(data)


def own_step_model():
    inputs = keras.Input((6,))
    model = OwnStep(inputs, keras.layers.Dense(1)(inputs), name="own_step")
    model.compile(optimizer="sgd", loss="mse")
    return model


def batches():
    """A Python generator of the arrays' batches."""
    yield from ((X[i : i + BATCH], Y[i : i + BATCH]) for i in range(0, N, BATCH))


def labels_with(changes: dict):
    """LABELS with the given rows changed: labels_with({7: 4}) puts class 4 in row 7."""
    labels = LABELS.copy()
    for row, value in changes.items():
        labels[row] = value
    return labels


# (id, the model (or what is passed as one), fit's arguments after the model, its keywords, the exact message)
BAD = [
    # arguments that are numbers
    ("batch_size 0", regression, (X, Y), {"batch_size": 0}, "batch_size=0 must be an integer >= 1"),
    ("batch_size negative", regression, (X, Y), {"batch_size": -3}, "batch_size=-3 must be an integer >= 1"),
    (
        "subdivisions 0",
        regression,
        (X, Y),
        {"batch_size": BATCH, "subdivisions": 0},
        "subdivisions=0 must be an integer >= 1",
    ),
    (
        "subdivisions over the batch",
        regression,
        (X, Y),
        {"batch_size": BATCH, "subdivisions": 17},
        "subdivisions=17 must be <= batch_size=16 (a micro-batch holds at least one example)",
    ),
    (
        "subdivisions and micro_batch_size",
        regression,
        (X, Y),
        {"batch_size": BATCH, "subdivisions": 2, "micro_batch_size": 4},
        "give subdivisions or micro_batch_size, not both (subdivisions=2, micro_batch_size=4)",
    ),
    (
        "micro_batch_size 0",
        regression,
        (X, Y),
        {"batch_size": BATCH, "micro_batch_size": 0},
        "micro_batch_size=0 must be an integer >= 1 or 'auto' (the largest that fits)",
    ),
    (
        "validation_freq 0",
        regression,
        (X, Y),
        {"batch_size": BATCH, "validation_data": (X, Y), "validation_freq": 0},
        "validation_freq=0 must be an integer >= 1 (validate every that many epochs) or a list of the 1-based "
        "epochs to validate after",
    ),
    (
        "validation_steps 0",
        regression,
        (X, Y),
        {"batch_size": BATCH, "validation_data": (X, Y), "validation_steps": 0},
        "validation_steps=0 must be an integer >= 1 (None: all of the validation data)",
    ),
    (
        "validation_batch_size 0",
        regression,
        (X, Y),
        {"batch_size": BATCH, "validation_data": (X, Y), "validation_batch_size": 0},
        "validation_batch_size=0 must be an integer >= 1 (None: batch_size)",
    ),
    (
        "validation_split above 1",
        regression,
        (X, Y),
        {"batch_size": BATCH, "validation_split": 1.5},
        "validation_split=1.5 needs arrays and a fraction in (0, 1): pass validation_data for a dataset",
    ),
    (
        "string targets",
        regression,
        (X, np.array(["a"] * len(X))),
        {"batch_size": BATCH},
        "y holds strings, and the loss model 'regression' is compiled with takes numbers: turn them into numbers "
        "first (class ids, e.g. np.unique(labels, return_inverse=True)[1])",
    ),
    (
        "validation_split as text",
        regression,
        (X, Y),
        {"batch_size": BATCH, "validation_split": "0.2"},
        "validation_split='0.2' needs arrays and a fraction in (0, 1): pass validation_data for a dataset",
    ),
    (
        "validation_split of a generator",
        regression,
        (batches(),),
        {"validation_split": 0.2},
        "validation_split=0.2 needs arrays and a fraction in (0, 1): pass validation_data for a dataset",
    ),
    (
        "validation_split and validation_data",
        regression,
        (X, Y),
        {"batch_size": BATCH, "validation_split": 0.2, "validation_data": (X, Y)},
        "give validation_data or validation_split, not both",
    ),
    (
        "seed a string",
        regression,
        (X, Y),
        {"batch_size": BATCH, "seed": "x"},
        "seed='x' must be None or an integer from 0 to 2**32 - 1",
    ),
    (
        "callbacks not a list",
        regression,
        (X, Y),
        {"batch_size": BATCH, "callbacks": 5},
        "callbacks is a int: pass a list of keras.callbacks.Callback",
    ),
    # the data against itself
    (
        "y shorter",
        regression,
        (X, Y[:10]),
        {"batch_size": BATCH},
        "x holds 50 examples but y 10: every array needs one row per example",
    ),
    (
        "sample_weight shorter",
        regression,
        (X, Y),
        {"batch_size": BATCH, "sample_weight": np.ones(7, np.float32)},
        "x holds 50 examples but sample_weight 7: every array needs one row per example",
    ),
    (
        "validation_data's y shorter",
        regression,
        (X, Y),
        {"batch_size": BATCH, "validation_data": (X, Y[:10])},
        "validation_data's x holds 50 examples but validation_data's y 10: every array needs one row per example",
    ),
    (
        "validation_data of one array",
        regression,
        (X, Y),
        {"batch_size": BATCH, "validation_data": (X,)},
        "validation_data must be (x_val, y_val), (x_val, y_val, sample_weight_val) or a dataset",
    ),
    # the data against the model
    (
        "x of the wrong width",
        regression,
        (X[:, :4], Y),
        {"batch_size": BATCH},
        "x holds examples of shape (4,), and model 'regression' takes examples of shape (6,)",
    ),
    (
        "x of one value per example",
        regression,
        (X[:, 0], Y),
        {"batch_size": BATCH},
        "x holds examples of shape (), and model 'regression' takes examples of shape (6,)",
    ),
    (
        "x of one axis too many",
        regression,
        (np.stack([X, X], axis=-1), Y),
        {"batch_size": BATCH},
        "x holds examples of shape (6, 2), and model 'regression' takes examples of shape (6,)",
    ),
    (
        "x of text for a model of numbers",
        regression,
        (np.full((N, 6), "a"), Y),
        {"batch_size": BATCH},
        "x holds string values, and model 'regression' takes float32",
    ),
    (
        "validation_data's x of the wrong width",
        regression,
        (X, Y),
        {"batch_size": BATCH, "validation_data": (X[:, :4], Y)},
        "validation_data's x holds examples of shape (4,), and model 'regression' takes examples of shape (6,)",
    ),
    (
        "a dict x without an input",
        two_inputs,
        ({"a": X}, Y),
        {"batch_size": BATCH},
        "x has no input 'b' (it has 'a'): model 'two_inputs' takes 'a', 'b'",
    ),
    (
        "a dict x of the wrong width",
        two_inputs,
        ({"a": X, "b": X}, Y),
        {"batch_size": BATCH},
        "x['b'] holds examples of shape (6,), and model 'two_inputs' takes examples of shape (3,)",
    ),
    (
        "no y",
        regression,
        (X,),
        {"batch_size": BATCH},
        "y is missing: model 'regression' is compiled with a loss, which takes them",
    ),
    (
        "y=None with a compiled metric",
        lambda: compiled_with_accuracy(classifier(compiled=False)),
        (X, None),
        {"batch_size": BATCH},
        "y is missing: model 'classifier' is compiled with a loss, which takes them",
    ),
    (
        "a dataset of inputs alone",
        regression,
        (tf.data.Dataset.from_tensor_slices(X).batch(8),),
        {},
        "x gives no targets: model 'regression' is compiled with a loss, which takes them",
    ),
    (
        "targets of another structure",
        two_outputs,
        (X, Y),
        {"batch_size": BATCH},
        "the compiled loss of model 'two_outputs' cannot take y with its outputs: y_true and y_pred have different "
        "structures.",
    ),
    (
        "targets of the wrong width",
        lambda: classifier("mse"),
        (X, np.ones((N, 3), np.float32)),
        {"batch_size": BATCH},
        "the compiled loss of model 'classifier' cannot take y with its outputs: Dimensions must be equal, but are 3 "
        "and 4 with input shapes: [?,3], [?,4].",
    ),
    (
        "y as a Python list",
        regression,
        (X, Y[:, 0].tolist()),
        {"batch_size": BATCH},
        "y is a Python list of numbers, which Keras takes as that many separate inputs, not as rows: pass "
        "np.asarray(y), an array [N, ...] with one row per example",
    ),
    (
        "x as a Python list of lists",
        regression,
        (X.tolist(), Y),
        {"batch_size": BATCH},
        "x is a Python list of numbers, which Keras takes as that many separate inputs, not as rows: pass "
        "np.asarray(x), an array [N, ...] with one row per example",
    ),
    (
        "sample weights of the wrong width",
        sequence_tagger,
        (X, np.zeros((N, 5), np.int64)),
        {"batch_size": BATCH, "sample_weight": np.ones((N, 4), np.float32)},
        "the compiled loss of model 'tagger' cannot take sample_weight with its outputs: Dimensions must be equal, "
        "but are 5 and 4 with input shapes: [?,5], [?,4].",
    ),
    (
        "sample weights of one axis more than the loss values",
        classifier,
        (X, LABELS),
        {"batch_size": BATCH, "sample_weight": np.ones((N, 3), np.float32)},
        "the compiled loss of model 'classifier' cannot take sample_weight with its outputs: sample weights of "
        "shape (batch, 3) do not fit the loss values of shape (batch,): give one weight per example, or one per "
        "loss value",
    ),
    (
        "a label past the last class",
        classifier,
        (X, labels_with({7: 4})),
        {"batch_size": BATCH},
        "y[7] holds class 4, and model 'classifier' outputs 4 classes: its sparse categorical cross-entropy takes "
        "labels 0 to 3",
    ),
    (
        "a negative label",
        lambda: classifier(keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        (X, labels_with({3: -1})),
        {"batch_size": BATCH},
        "y[3] holds class -1, and model 'classifier' outputs 4 classes: its sparse categorical cross-entropy takes "
        "labels 0 to 3",
    ),
    (
        "a label past the last class besides ignore_class",
        lambda: classifier(keras.losses.SparseCategoricalCrossentropy(ignore_class=-1)),
        (X, labels_with({3: -1, 9: 12})),
        {"batch_size": BATCH},
        "y[9] holds class 12, and model 'classifier' outputs 4 classes: its sparse categorical cross-entropy takes "
        "labels 0 to 3 (or ignore_class=-1)",
    ),
    (
        "regression targets for an uncompiled model",
        lambda: classifier(compiled=False),
        (X, np.full((N, 1), 0.25, np.float32)),
        {"batch_size": BATCH},
        "y holds values that are not class labels (0.25), and model 'classifier' is not compiled, so it would train "
        "with sparse categorical cross-entropy, which takes class labels: compile it with your loss first, e.g. "
        "model.compile(optimizer='adam', loss='mse')",
    ),
    (
        "a label past the last class of an uncompiled model",
        lambda: classifier(compiled=False),
        (X, labels_with({40: 7})),
        {"batch_size": BATCH},
        "y[40] holds class 7, and model 'classifier' outputs 4 classes: its sparse categorical cross-entropy takes "
        "labels 0 to 3",
    ),
    (
        "a label past the last class in the part validation_split keeps",
        classifier,
        (X, labels_with({45: 4})),
        {"batch_size": BATCH, "validation_split": 0.2},
        "y[45] holds class 4, and model 'classifier' outputs 4 classes: its sparse categorical cross-entropy takes "
        "labels 0 to 3",
    ),
    (
        "a label past the last class in validation_data",
        classifier,
        (X, LABELS),
        {"batch_size": BATCH, "validation_data": (X[:10], labels_with({2: 4})[:10])},
        "validation_data's y[2] holds class 4, and model 'classifier' outputs 4 classes: its sparse categorical "
        "cross-entropy takes labels 0 to 3",
    ),
    (
        "a label past the last class of one output by name",
        tagged_and_scored,
        (X, {"tag": labels_with({5: 4}), "score": Y}),
        {"batch_size": BATCH},
        "y['tag'][5] holds class 4, and model 'tagged' outputs 4 classes: its sparse categorical cross-entropy takes "
        "labels 0 to 3",
    ),
    (
        "class_weight of an unknown class",
        classifier,
        (X, LABELS),
        {"batch_size": BATCH, "class_weight": {0: 1.0, 9: 2.0}},
        "class_weight names class 9, and model 'classifier' outputs 4 classes: its keys are 0 to 3",
    ),
    (
        "class_weight a list",
        classifier,
        (X, LABELS),
        {"batch_size": BATCH, "class_weight": [1.0, 2.0]},
        "class_weight is a list: pass a dict of class index to weight, such as {0: 1.0, 1: 5.0}",
    ),
    (
        "class_weight keyed by name",
        classifier,
        (X, LABELS),
        {"batch_size": BATCH, "class_weight": {"cat": 2.0}},
        "class_weight has the key 'cat': its keys are class indices, integers >= 0",
    ),
    (
        "class_weight with sample_weight",
        classifier,
        (X, LABELS),
        {"batch_size": BATCH, "class_weight": {0: 2.0}, "sample_weight": np.ones(N, np.float32)},
        "class_weight and sample_weight together, which model.fit refuses: pass sample_weight alone, each "
        "example's weight times its class's",
    ),
    (
        "class_weight with several outputs",
        two_outputs,
        (X, [Y, Y]),
        {"batch_size": BATCH, "class_weight": {0: 1.0}},
        "class_weight is only supported for a model with one output (this one has 2): pass sample_weight per output "
        "instead",
    ),
    # the model and how it is compiled
    (
        "not a model",
        lambda: "model.keras",
        (X, Y),
        {"batch_size": BATCH},
        "model is a str, not a keras.Model: pass a Keras 3 model",
    ),
    (
        "an optimizer for a compiled model",
        regression,
        (X, Y),
        {"batch_size": BATCH, "optimizer": "adam"},
        "model 'regression' is compiled: it trains with its own optimizer; leave optimizer and learning_rate out (or "
        "compile it with the optimizer you want)",
    ),
    (
        "an optimizer name that is none",
        lambda: classifier(compiled=False),
        (X, LABELS),
        {"batch_size": BATCH, "optimizer": "adamx"},
        "optimizer.name='adamx' is not one of adam, sgd, momentum, rmsprop, lars, lamb; did you mean 'adam'?",
    ),
    (
        "Keras' own gradient accumulation",
        lambda: regression(keras.optimizers.Adam(gradient_accumulation_steps=4)),
        (X, Y),
        {"batch_size": BATCH},
        "the model's optimizer has gradient_accumulation_steps=4: accum_train.fit accumulates exactly itself; compile "
        "without it",
    ),
    (
        "float8 training",
        lambda: quantized(regression(), "float8"),
        (X, Y),
        {"batch_size": BATCH},
        "model 'regression' trains in float8 (quantize('float8')), whose scale variables (as 'inputs_scale') take "
        "each step's new value in place of a gradient, which micro-batches cannot add up: train it before "
        "quantizing, or with model.fit",
    ),
    (
        "its own train_step",
        own_step_model,
        (X, Y),
        {"batch_size": BATCH},
        "model 'own_step' overrides train_step, which accum_train.fit does not call (it differentiates the "
        "compiled loss itself, micro-batch by micro-batch): compile the loss with compile(loss=...), or train with "
        "model.fit",
    ),
    (
        "a loss without reduction",
        lambda: regression(loss=keras.losses.MeanSquaredError(reduction=None)),
        (X, Y),
        {"batch_size": BATCH},
        "loss 'mean_squared_error' has reduction=None: give it 'sum_over_batch_size' (the mean, model.fit's default) "
        "or 'sum', whose gradients add up over micro-batches",
    ),
    (
        "steps_per_execution",
        lambda: regression(steps_per_execution=4),
        (X, Y),
        {"batch_size": BATCH},
        "model 'regression' is compiled with steps_per_execution=4: accum_train.fit runs one update per graph call "
        "(its micro-steps inside it); compile with steps_per_execution=1",
    ),
    # the call's own keywords
    (
        "strategy a name",
        regression,
        (X, Y),
        {"batch_size": BATCH, "strategy": "mirrored"},
        "strategy is a str, not a tf.distribute.Strategy",
    ),
    (
        "precision float16",
        regression,
        (X, Y),
        {"batch_size": BATCH, "precision": "float16"},
        "precision='float16' is not one of float32, mixed_bfloat16, mixed_float16 (None: the model's)",
    ),
    # sources that give their own batches
    (
        "a dataset of batches with batch_size",
        regression,
        (PAIRS.batch(8),),
        {"batch_size": BATCH},
        "x is a dataset of batches (its elements have a leading axis of unknown size) and batch_size=16 is given: "
        "leave batch_size out to train on its batches, or pass dataset.unbatch()",
    ),
    (
        "a dataset of examples without batch_size",
        regression,
        (PAIRS,),
        {},
        "x gives single examples (its inputs have shape (6,), the model takes (None, 6)): pass batch_size, or batch "
        "the dataset",
    ),
    (
        "an endless dataset without steps_per_epoch",
        regression,
        (PAIRS.batch(8).repeat(),),
        {},
        "x is an infinite dataset (it repeats): pass steps_per_epoch, the updates of one epoch",
    ),
    (
        "a dataset and y",
        regression,
        (PAIRS.batch(8), Y),
        {},
        "x is a tf.data.Dataset: leave y out (put it in its elements)",
    ),
    (
        "a generator of lists",
        regression,
        (iter([[X, Y]]),),
        {},
        "x yielded a list: a generator of batches yields tuples (x,), (x, y) or (x, y, sample_weight)",
    ),
    (
        "a generator of weights without targets",
        regression,
        (iter([(X[:8], None, np.ones(8, np.float32))] * 4),),
        {},
        "x yielded (x, None, sample_weight): sample weights without targets are not supported; yield (x, y, "
        "sample_weight)",
    ),
    (
        "an empty generator",
        regression,
        (iter([]),),
        {},
        "x is a generator that yields no batch: it must yield at least one",
    ),
    ("a generator and y", regression, (batches(), Y), {}, "x is a generator, which gives its own batches: leave y out"),
    (
        "a generator with micro_batch_size auto",
        regression,
        (batches(),),
        {"micro_batch_size": "auto"},
        "micro_batch_size='auto' retries an update that runs out of memory from the same batch, which a generator "
        "cannot give again: pass subdivisions or a micro_batch_size in examples",
    ),
    (
        "BatchNormalization given a mask",
        masked_norm,
        (np.arange(80).reshape(16, 5) % 10, np.zeros((16, 1), "float32")),
        {"batch_size": 8, "subdivisions": 2},
        "model 'masked': BatchNormalization 'norm' is given a mask (Embedding(mask_zero=True) or Masking before it), "
        "which accum-train's pooled statistics do not take: move it before the masking layer, use "
        "LayerNormalization, or train with model.fit",
    ),
    (
        "a generator as validation_data",
        regression,
        (X, Y),
        {"batch_size": BATCH, "validation_data": batches()},
        "validation_data is a generator, which the validation of every epoch would read again: pass arrays, a "
        "tf.data.Dataset or a keras.utils.PyDataset",
    ),
]


@pytest.mark.parametrize(("make", "args", "keywords", "message"), [case[1:] for case in BAD], ids=[c[0] for c in BAD])
def test_a_bad_call_is_one_line_naming_the_argument_and_nothing_trains_or_is_written(
    make, args, keywords, message, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # nothing may be written here either
    model = make()
    before = model.get_weights() if isinstance(model, keras.Model) else None
    with pytest.raises(UserError) as caught:
        accum_train.fit(model, *args, output_dir=tmp_path / "run", verbose=0, **keywords)
    assert str(caught.value) == f"accum_train.fit: {message}"
    assert "\n" not in str(caught.value)
    if before is not None:
        assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))
        if getattr(model, "optimizer", None) is not None and model.optimizer.built:
            assert int(model.optimizer.iterations.numpy()) == 0
    assert os.listdir(tmp_path) == []


def test_the_cli_trains_a_file_compiled_with_keras_accumulation_with_its_config_s_optimizer(tmp_path):
    """The CLI has no refusal of gradient_accumulation_steps to make: it loads a keras_file uncompiled and takes
    only its loss and metrics (the optimizer is the config's), so Keras' accumulation never runs a second time.
    Had it, the two updates here would leave the weights as they were (Keras applies every 4th)."""
    from helpers import run_keras_file

    run_dir = run_keras_file(
        tmp_path,
        regression(keras.optimizers.Adam(gradient_accumulation_steps=4)),
        {"x_train": X[:8], "y_train": Y[:8], "x_test": X[:2], "y_test": Y[:2]},
        "batch_size: 4\nsubdivisions: 2\nepochs: 1\noptimizer: {name: sgd, learning_rate: 0.1}\n",
    )
    before = regression().get_weights()
    after = np.load(run_dir / "weights.npz")
    assert [after[name].shape for name in after.files] == [w.shape for w in before]  # the same weights, in order
    assert all(not np.array_equal(after[name], w) for name, w in zip(after.files, before))
