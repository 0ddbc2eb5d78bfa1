"""model.norm=groupnorm for the built-ins: per-example normalisation, so a
subdivided update equals the whole batch exactly (SGD and Adam, ragged
micro-batches), and the layer computes what keras.layers.GroupNormalization
computes (what export maps it to)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorlayer as tl
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.backends.tensorflow.norm import GroupNorm
from accum_train.backends.tensorflow.objective import sparse_softmax_loss
from accum_train.config import ModelConfig, OptimizerConfig, load_config
from accum_train.errors import ConfigError
from accum_train.from_config.optim import make_optimizer
from accum_train.models import build_model

RNG = np.random.default_rng(8)


@pytest.mark.parametrize("shape, groups", [((5, 6, 6, 12), 4), ((5, 12), 3), ((5, 6, 6, 12), 1), ((5, 12), 6)])
def test_layer_equals_keras_group_normalization(shape, groups):
    inputs = tl.layers.Input([None, *shape[1:]])
    layer = GroupNorm(groups, name=f"gn_test_{len(shape)}_{groups}")
    net = tl.models.Model(inputs=inputs, outputs=layer(inputs))
    net.eval()
    rng = np.random.default_rng(8)  # the case's own draws, whichever cases ran before it in this process
    gamma, beta = rng.normal(1.0, 0.5, shape[-1]), rng.normal(0.0, 0.5, shape[-1])
    layer.gamma.assign(gamma.astype(np.float32))
    layer.beta.assign(beta.astype(np.float32))
    ref = keras.layers.GroupNormalization(groups, epsilon=1e-5)
    ref.build(shape)
    ref.set_weights([gamma, beta])
    x = rng.normal(3.0, 2.0, shape).astype(np.float32)
    ours = net(tf.constant(x)).numpy()
    # float32: a group of two values around 3 loses digits to the variance's cancellation, computed in another
    # order by Keras (up to 6e-6 relative seen)
    np.testing.assert_allclose(ours, ref(x).numpy(), rtol=1e-5, atol=2e-6)
    # per example: the first example alone gives what it gives inside the batch
    np.testing.assert_allclose(net(tf.constant(x[:1])).numpy(), ours[:1], atol=1e-6)


def train(cfg, k, optimizer, lr):
    model = build_model(cfg, 3, (28, 28, 1), 10)
    variables = model.trainable_variables
    opt = make_optimizer(OptimizerConfig(name=optimizer, learning_rate=lr), lr, variables)
    loss_fn = sparse_softmax_loss(model.forward)
    engine = (
        Accumulator(loss_fn, variables, opt, norm_layers=model.norm_layers, one_pass=True)
        if k == 1
        else Accumulator(loss_fn, variables, opt, subdivisions=k, norm_layers=model.norm_layers)
    )
    rng = np.random.default_rng(0)
    for n in (30, 30, 30, 13):  # k=4: micro-batches of 7-8; the short last batch as 3-4
        x = tf.constant(rng.random((n, 28, 28, 1), dtype=np.float32))
        y = tf.constant(rng.integers(0, 10, n).astype(np.int32))
        engine.update(x, y)
    return model.named_weights(), model


@pytest.mark.parametrize(
    "model_cfg",
    [ModelConfig(width=0.0625, norm="groupnorm"), ModelConfig(name="mlp", hidden=32, norm="groupnorm", groups=4)],
)
# Adam divides each step by the gradient's own size, so a rounding-level difference in a near-zero component
# becomes a visible step; four steps at 0.01 amplify the rounding of batched against micro-batched
# convolutions to 3.5e-5 in this conv net on an AVX2 CPU (2.9e-6 with AVX-512). At 0.003, the configs'
# rate, it is 1.2e-6 there; SGD, whose step is the gradient itself, stays at 2e-8.
@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.1), pytest.param("adam", 0.003, marks=pytest.mark.slow)])
def test_subdivided_equals_whole_batch(model_cfg, optimizer, lr):
    whole, model = train(model_cfg, 1, optimizer, lr)
    parts, _ = train(model_cfg, 4, optimizer, lr)
    assert model.norm_layers == []  # nothing batch-dependent to commit
    assert any(name.startswith("gn") for name in whole)
    diff = max(float(np.max(np.abs(whole[n].numpy() - parts[n].numpy()))) for n in whole)
    assert diff < 1e-5  # measured: 1.5e-8 (SGD), 1.2e-6 (Adam)
    initial = build_model(model_cfg, 3, (28, 28, 1), 10).named_weights()
    assert max(float(np.max(np.abs(whole[n].numpy() - v.numpy()))) for n, v in initial.items()) > 1e-3


def test_seed_convnet_with_groupnorm_has_conv_without_bias_and_gamma_beta():
    model = build_model(ModelConfig(width=0.0625, norm="groupnorm"), 0, (28, 28, 1), 10)
    names = list(model.named_weights())
    assert names[:3] == ["conv1/filters", "gn1/gamma", "gn1/beta"]
    assert (
        sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        == 9 * (1 * 8 + 8 * 16 + 16 * 24 + 24 * 32 + 32 * 40) + 2 * (8 + 16 + 24 + 32 + 40) + 40 * 10 + 10
    )


@pytest.mark.parametrize(
    "sets, message",
    [
        (
            ["model.norm=groupnorm", "model.width=0.1"],
            "--set: model.groups=8 must divide the channels of every normalised layer of seed_convnet "
            "(model.width=0.1: 13, 26, 38, 51, 64): set model.groups=1 or change model.width",
        ),
        (
            ["model.norm=groupnorm", "model.name=mlp", "model.hidden=100"],
            "--set: model.groups=8 must divide the channels of every normalised layer of mlp (model.hidden=100: 100): "
            "set model.groups=5 or change model.hidden",
        ),
        (
            ["model.groups=4"],
            "--set: model.groups is only for model.norm=groupnorm, not batchnorm: remove it or set "
            "model.norm=groupnorm",
        ),
        (["model.norm=groupnorm", "model.groups=0"], "--set: model.groups=0 must be >= 1 and <= 65536"),
    ],
)
def test_groups_must_divide_the_channels(sets, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, sets)
    assert str(err.value) == message


def test_default_width_divides_by_default_groups():
    assert load_config(None, ["model.norm=groupnorm"]).model.norm_channels == (32, 64, 96, 128, 160)
