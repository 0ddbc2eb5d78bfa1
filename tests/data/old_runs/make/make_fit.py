"""Leave an interrupted accum_train.fit output_dir (release 0.2.0 on PYTHONPATH): 96 examples, batch 8,
2 micro-batches, 3 epochs (36 updates); a callback sends this process SIGINT after update 5, the release's
handler checkpoints that update and the call raises accum_train.errors.Interrupted.
tests/test_old_run_dirs.py loads this file for ``model_and_data`` and makes the same call.

    PYTHONPATH=/tmp/oldroot-0.2.0 python make_fit.py ../fit-0.2.0
"""

import os
import signal
import sys

import keras
import numpy as np

CALL = {"batch_size": 8, "subdivisions": 2, "epochs": 3, "shuffle": False, "verbose": 0}
UPDATES = 36  # 12 per epoch (96 / 8)


def model_and_data():
    """The compiled model (the same initial weights on every call) and the training arrays."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(3)])
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    rng = np.random.default_rng(7)
    x = rng.normal(size=(96, 5)).astype("float32")
    y = rng.integers(0, 3, size=96).astype("int32")
    return model, x, y


class SignalAfter(keras.callbacks.Callback):
    def __init__(self, update):
        super().__init__()
        self.update, self.seen = update, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.update:
            os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    import accum_train
    from accum_train.errors import Interrupted

    print(f"accum_train {accum_train.__version__} from {accum_train.__file__}")
    model, x, y = model_and_data()
    try:
        accum_train.fit(model, x, y, **CALL, output_dir=sys.argv[1], callbacks=[SignalAfter(5)])
    except Interrupted as stopped:
        print(f"interrupted at update {stopped.step} (signal {stopped.signum})")
    else:
        sys.exit("the call was not interrupted")
