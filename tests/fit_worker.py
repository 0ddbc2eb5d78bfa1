"""One process of test_fit_distribute.py: accum_train.fit on a masked per-token model, the way a user's script
runs it (the strategy first, the model built and compiled in its scope), printing what the test checks.

    python fit_worker.py mirrored K      two replicas (logical CPUs) in this process, k micro-batches each
    python fit_worker.py single K        one device
    python fit_worker.py multi_worker K  one replica per process, TF_CONFIG naming the cluster
    ... K OUTPUT_DIR                      also keep a run directory there (the chief writes it)

The last line of stdout is JSON: the weights (lists), the history, and for each update the graph calls made
and the collectives traced while it ran."""

import json
import sys

import tensorflow as tf

mode, k = sys.argv[1], int(sys.argv[2])
output_dir = sys.argv[3] if len(sys.argv) > 3 else None
if mode == "mirrored":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from accum_train.backends.tensorflow.distribute import CountingCrossDeviceOps  # noqa: E402

ops = CountingCrossDeviceOps()
if mode == "mirrored":
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=ops)
elif mode == "multi_worker":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any other op
else:
    strategy = tf.distribute.get_strategy()

import accum_train  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from accum_train.backends.tensorflow.engine import Accumulator  # noqa: E402
from tensorflow.python.eager.polymorphic_function import atomic_function  # noqa: E402

N, BATCH, VOCABULARY, STEPS = 40, 16, 20, 7
rng = np.random.default_rng(7)
lengths = np.array([[7, 7, 7, 7, 6, 6, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1][i % 16] for i in range(N)])
tokens = rng.integers(1, VOCABULARY, (N, STEPS))
tokens[np.arange(STEPS)[None, :] >= lengths[:, None]] = 0
tags = rng.integers(0, 5, (N, STEPS))

with strategy.scope():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((STEPS,), dtype="int32")
    hidden = keras.layers.Embedding(VOCABULARY, 8, mask_zero=True)(inputs)
    hidden = keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.01))(hidden)
    model = keras.Model(inputs, keras.layers.Dense(5)(hidden))
    model.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )

calls, per_update = [0], []
real_call = atomic_function.AtomicFunction.call_flat


def counted(*args, **kwargs):
    calls[0] += 1
    return real_call(*args, **kwargs)


atomic_function.AtomicFunction.call_flat = counted
real_update = Accumulator.update_from


traced = {}


def update(self, iterator, n, pulls, stop=0, size=None):
    before = (calls[0], ops.batch_reduce_calls + ops.reduce_calls)
    out = real_update(self, iterator, n, pulls, stop, size)
    per_update.append([calls[0] - before[0], ops.batch_reduce_calls + ops.reduce_calls - before[1]])
    if not traced:  # the collective ops in the update's graph (under multi-worker a collective is an op there)
        args = [tf.constant(int(v), tf.int32) for v in (n, pulls, stop)]
        graph = self._update_pulled.get_concrete_function(iterator, *args, size).graph.as_graph_def()
        nodes = list(graph.node) + [node for f in graph.library.function for node in f.node_def]
        for node in nodes:
            if node.op.startswith("Collective"):
                traced[node.op] = traced.get(node.op, 0) + 1
    return out


Accumulator.update_from = update
history = accum_train.fit(
    model,
    tokens,
    tags,
    batch_size=BATCH,
    subdivisions=k,
    epochs=2,
    shuffle=False,
    verbose=0,
    validation_data=(tokens[:11], tags[:11]),
    output_dir=output_dir,
    strategy=strategy if mode == "mirrored" else None,  # given, as a script may; else the model's own
)
print(
    json.dumps(
        {
            "weights": [w.tolist() for w in model.get_weights()],
            "history": history.history,
            "per_update": per_update,
            "collective_ops": traced,
            "replicas": strategy.num_replicas_in_sync,
        }
    )
)
