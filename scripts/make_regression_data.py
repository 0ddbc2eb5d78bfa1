"""Write a small regression task, no download: an .npz of noisy targets and a compiled Keras model for it.

python scripts/make_regression_data.py --out regression
accum-train run configs/regression.yaml

regression/data.npz holds x_train [8000, 8] float32 (and x_test [2000, 8]), y_train [8000, 1] float32 and per
example weights w_train: the target is a smooth function of the 8 features plus noise whose size grows with
the first feature, and each example is weighted by the inverse of its noise variance (the weighted mean
squared error is then the right loss). regression/model.keras is an MLP saved after
compile(loss="mse", metrics=["mae"]): accum-train trains it with that loss and reports that metric.
"""

import argparse
from pathlib import Path

import keras
import numpy as np

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", type=Path, default=Path("regression"), help="folder to write data.npz and model.keras to")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)

rng = np.random.default_rng(args.seed)


def examples(n):
    x = rng.uniform(-1.0, 1.0, (n, 8)).astype(np.float32)
    clean = np.sin(3 * x[:, 0]) + x[:, 1] * x[:, 2] + 0.5 * x[:, 3] ** 2 - 0.3 * x[:, 4:].sum(axis=1)
    noise_scale = 0.05 + 0.25 * (x[:, 0] + 1.0)  # from 0.05 to 0.55: some examples are far noisier
    y = clean + noise_scale * rng.normal(size=n)
    weights = 1.0 / noise_scale**2
    return x, y[:, None].astype(np.float32), (weights / weights.mean()).astype(np.float32)


x_train, y_train, w_train = examples(8000)
x_test, y_test, w_test = examples(2000)
splits = dict(x_train=x_train, y_train=y_train, w_train=w_train, x_test=x_test, y_test=y_test, w_test=w_test)
np.savez(args.out / "data.npz", **splits)

keras.utils.set_random_seed(args.seed)
inputs = keras.Input(shape=(8,))
hidden = keras.layers.Dense(64, activation="relu")(inputs)
hidden = keras.layers.Dense(64, activation="relu")(hidden)
model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
model.compile(loss="mse", metrics=["mae"])
model.save(args.out / "model.keras")
print(f"wrote {args.out / 'data.npz'} (8000 train, 2000 test examples) and {args.out / 'model.keras'}")
