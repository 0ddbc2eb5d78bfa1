"""One ``accum_train.fit(..., output_dir=...)`` call in a process of its own, for test_kills.py.

``python fit_kill_runner.py OUTPUT_DIR RESULT`` trains a small MLP on seeded arrays (3 epochs of 4 updates:
batches of 16, 16, 16 and 2 examples, each as 3 micro-batches) into OUTPUT_DIR, then writes the model's
weights to RESULT.npz and the returned History (``epoch``, ``history``) to RESULT.json. The model, data and
order are the same in every process, so a call that resumes OUTPUT_DIR must end where one never stopped does.

KERAS_BACKEND picks the backend it runs on (TensorFlow or JAX). ACCUM_FIT_HOLD=WHERE:N (with ACCUM_FIT_MARK=PATH)
holds the process still at a known point for the parent to kill with SIGKILL: it writes PATH, then sleeps. WHERE is
  update  after the Nth update of the call, before fit logs it to metrics.jsonl (updates 1 to N-1 are there)
  save    as the Nth checkpoint is about to be written (fit saves one after each epoch, its metrics.jsonl
          record written first)
"""

import json
import os
import sys
import time
from pathlib import Path

import accum_train  # first: it sets the allocator mode before TensorFlow loads
import keras
import numpy as np
import tensorflow as tf

# Before any op, as tests/conftest.py sets the test processes' pools: every process of a case computes alike.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

N, BATCH, K, EPOCHS, SEED = 50, 16, 3, 3, 5
UPDATES = EPOCHS * -(-N // BATCH)  # 12: the last batch of each epoch is the 2 examples left over


def hold(mark):
    """Say where it is (the mark file), then sleep: the parent's kill -9 lands at this point, not wherever a
    timer happens to fall."""
    Path(mark).write_text(str(os.getpid()))
    time.sleep(600)  # the parent kills it long before; should it not, the parent's timeout fails the test
    raise SystemExit("fit_kill_runner: held for 600 s and nobody killed it")


class HoldAfterUpdate(keras.callbacks.Callback):
    def __init__(self, n, mark):
        super().__init__()
        self.n, self.mark, self.updates = n, mark, 0

    def on_train_batch_end(self, batch, logs=None):
        self.updates += 1
        if self.updates == self.n - 1:
            # fit buffers its metrics.jsonl records for up to FLUSH_SECONDS: waiting that long here makes it write
            # those up to this update, so that the kill finds them on disk, as it would in a longer run
            from accum_train.defaults import FLUSH_SECONDS

            time.sleep(FLUSH_SECONDS + 0.5)
        if self.updates == self.n:
            hold(self.mark)


def hold_before_save(n, mark):
    """TensorFlow's CheckpointManager.save is wrapped, not fit's own code: the point stays put whatever fit's
    private names become. On JAX, the backend's own checkpoint writer (accum/backends/jax/checkpoints.py)."""
    if keras.config.backend() == "jax":
        from accum_train.backends.jax.checkpoints import Checkpoints as owner
    else:
        owner = tf.train.CheckpointManager
    real, saves = owner.save, [0]

    def save(self, *args, **kwargs):
        saves[0] += 1
        if saves[0] == n:
            hold(mark)
        return real(self, *args, **kwargs)

    owner.save = save


def main(output_dir, result):
    rng = np.random.default_rng(11)
    x = rng.random((N, 6), dtype=np.float32)
    y = rng.random((N, 1), dtype=np.float32)
    keras.utils.set_random_seed(1)  # the same initial weights in every process: a call with no checkpoint to go on
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    callbacks = []
    if os.environ.get("ACCUM_FIT_HOLD"):
        where, _, n = os.environ["ACCUM_FIT_HOLD"].partition(":")
        if where == "update":
            callbacks.append(HoldAfterUpdate(int(n), os.environ["ACCUM_FIT_MARK"]))
        elif where == "save":
            hold_before_save(int(n), os.environ["ACCUM_FIT_MARK"])
        else:
            raise SystemExit(f"fit_kill_runner: unknown hold point {where!r}")
    order = {"batch_size": BATCH, "subdivisions": K, "epochs": EPOCHS, "seed": SEED, "verbose": 0}
    history = accum_train.fit(model, x, y, callbacks=callbacks, output_dir=output_dir, **order)
    np.savez(f"{result}.npz", *model.get_weights())
    Path(f"{result}.json").write_text(json.dumps({"epoch": history.epoch, "history": history.history}))


if __name__ == "__main__":
    tf.get_logger().setLevel("ERROR")
    main(sys.argv[1], sys.argv[2])
