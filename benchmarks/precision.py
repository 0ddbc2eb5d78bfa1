"""k=1 against k=4 under each precision: how far apart the weights are after 10 updates.

The same 640 Fashion-MNIST training images in 10 batches of 64, the same initial weights; the
relative L2 distance of all variables (weights and moving statistics) between 1 and 4
subdivisions. BatchNorm is left out: it normalises each micro-batch with its own statistics, so
k changes what it computes in any precision. mixed_float16 runs at a fixed loss scale of 4096.

    python benchmarks/precision.py         # a few minutes on 2 cores (float16 is slow on CPUs)
"""

from __future__ import annotations

import accum_train  # noqa: F401
import numpy as np


def main():
    from accum_train.backends.tensorflow.engine import Accumulator
    from accum_train.backends.tensorflow.objective import sparse_softmax_loss
    from accum_train.config import DataConfig, ModelConfig, OptimizerConfig
    from accum_train.datasets import load
    from accum_train.from_config.optim import make_optimizer
    from accum_train.models import build_model

    data = load(DataConfig(train_limit=640, test_limit=1))
    batches = list(data.train.batches(np.arange(640), 64))

    def weights_after(name, norm, precision, k, optimizer, lr):
        model = build_model(
            ModelConfig(name=name, width=0.125, norm=norm, hidden=64), 3, data.input_shape, data.num_classes, precision
        )
        opt = make_optimizer(OptimizerConfig(name=optimizer, learning_rate=lr), lr, model.trainable_variables)
        engine = Accumulator(
            sparse_softmax_loss(model.forward),
            model.trainable_variables,
            opt,
            subdivisions=k,
            norm_layers=model.norm_layers,
            loss_scale=4096.0 if precision == "mixed_float16" else None,
        )
        for x, y in batches:
            if not bool(engine.update(x, y)["applied"]):
                raise SystemExit(f"{name} {precision}: an update was skipped")
        return np.concatenate([v.numpy().ravel() for v in model.variables])

    print(f"{'model':<28} {'optimizer':<9} {'precision':<15} {'rel L2 k=1 vs k=4':>18} {'max abs':>10}")
    for name, norm in (("mlp", "none"), ("seed_convnet", "groupnorm")):
        for optimizer, lr in (("sgd", 0.1), ("adam", 1e-3)):
            for precision in ("float32", "mixed_bfloat16", "mixed_float16"):
                a = weights_after(name, norm, precision, 1, optimizer, lr)
                b = weights_after(name, norm, precision, 4, optimizer, lr)
                rel = float(np.linalg.norm(a - b) / np.linalg.norm(a))
                label = name if norm == "none" else f"{name} x1/8 {norm}"
                print(
                    f"{label:<28} {optimizer:<9} {precision:<15} {rel:>18.2e} {float(np.max(np.abs(a - b))):>10.2e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
