"""The BatchNorm fix and the model registry.

TensorLayer 2.2.5's BatchNorm fails inside tf.function on current TensorFlow;
AccumBatchNorm must work there, match Keras' BatchNormalization, leave the
moving statistics untouched by TL's build pass, and (deferred) fold the
statistics of a whole subdivided update into them exactly once.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorlayer as tl
from accum_train.backends.tensorflow.builtin import NORM_LAYERS
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.backends.tensorflow.norm import AccumBatchNorm
from accum_train.backends.tensorflow.objective import sparse_softmax_loss
from accum_train.config import MODEL_NAMES, NORM_NAMES, ModelConfig, OptimizerConfig
from accum_train.from_config.optim import make_optimizer
from accum_train.models import BUILDERS, build_model

RNG = np.random.default_rng(5)


def bn_net(momentum=0.9):
    inputs = tl.layers.Input([None, 6, 6, 3])
    bn = AccumBatchNorm(decay=momentum, name="bn_test")
    return tl.models.Model(inputs=inputs, outputs=bn(inputs)), bn


def test_build_pass_leaves_moving_statistics_at_their_init():
    _, bn = bn_net()
    np.testing.assert_array_equal(bn.moving_mean.numpy(), np.zeros(3))
    np.testing.assert_array_equal(bn.moving_var.numpy(), np.ones(3))  # TL 2.2.5 would start at zeros


def test_batchnorm_in_graph_mode_matches_keras():
    net, bn = bn_net()
    bn.gamma.assign(tf.ones(3))
    ref = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)
    ref.build((None, 6, 6, 3))

    @tf.function
    def train_step(x):
        return net(x, is_train=True), ref(x, training=True)

    @tf.function
    def eval_step(x):
        return net(x, is_train=False), ref(x, training=False)

    for _ in range(5):
        x = tf.constant(RNG.normal(2.0, 3.0, (8, 6, 6, 3)).astype(np.float32))
        ours, theirs = train_step(x)
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-5)
    np.testing.assert_allclose(bn.moving_mean.numpy(), ref.moving_mean.numpy(), atol=1e-5)
    np.testing.assert_allclose(bn.moving_var.numpy(), ref.moving_variance.numpy(), rtol=1e-5)
    ours, theirs = eval_step(x)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-4)
    assert float(tf.reduce_max(tf.abs(bn.moving_mean))) > 0.5  # the statistics did move


@pytest.mark.parametrize("momentum", [0.9, 0.5, 0.0])
def test_deferred_statistics_equal_one_pass_over_the_whole_batch(momentum):
    net, bn = bn_net(momentum)
    bn.deferred = True
    whole = RNG.normal(1.0, 2.0, (30, 6, 6, 3)).astype(np.float32)

    @tf.function
    def micro(x):
        return net(x, is_train=True)

    for start, end in [(0, 7), (7, 19), (19, 30)]:  # ragged on purpose
        micro(tf.constant(whole[start:end]))
    np.testing.assert_array_equal(bn.moving_mean.numpy(), np.zeros(3))  # nothing moves before commit
    bn.fold(bn.pending.values())
    bn.discard()
    mean = whole.mean(axis=(0, 1, 2))
    var = whole.var(axis=(0, 1, 2))
    np.testing.assert_allclose(bn.moving_mean.numpy(), (1 - momentum) * mean, atol=1e-5)
    np.testing.assert_allclose(bn.moving_var.numpy(), momentum + (1 - momentum) * var, rtol=1e-5)
    assert float(bn.pending.count.numpy()) == 0.0


@pytest.mark.parametrize("momentum", [0.9, 0.3])
def test_bn_momentum_reaches_every_batchnorm_layer(momentum):
    for name in ("seed_convnet", "mlp"):
        model = build_model(ModelConfig(name=name, width=0.0625, bn_momentum=momentum), 0, (8, 8, 1), 3)
        assert [layer.decay for layer in model.norm_layers] == [momentum] * (5 if name == "seed_convnet" else 1)


def test_subdivided_update_moves_first_bn_like_the_whole_batch_and_differs_after():
    x = tf.constant(RNG.random((40, 28, 28, 1), dtype=np.float32))
    y = tf.constant(RNG.integers(0, 10, 40).astype(np.int32))
    results = {}
    for k in (None, 4):
        model = build_model(ModelConfig(width=0.0625, norm="batchnorm"), 3, (28, 28, 1), 10)
        opt = make_optimizer(OptimizerConfig(name="sgd", learning_rate=0.1), 0.1, model.trainable_variables)
        loss_fn = sparse_softmax_loss(model.forward)
        engine = (
            Accumulator(loss_fn, model.trainable_variables, opt, norm_layers=model.norm_layers, one_pass=True)
            if k is None
            else Accumulator(loss_fn, model.trainable_variables, opt, subdivisions=k, norm_layers=model.norm_layers)
        )
        engine.update(x, y)
        results[k] = model.named_weights()
    # The first BatchNorm sees the same inputs either way: its moving statistics,
    # pooled over the 4 micro-batches, are those of the whole batch.
    for name in ("bn1/moving_mean", "bn1/moving_var"):
        np.testing.assert_allclose(results[4][name].numpy(), results[None][name].numpy(), atol=1e-6)
    # Normalising with micro-batch statistics is the one documented difference.
    assert np.max(np.abs(results[4]["conv1/filters"].numpy() - results[None]["conv1/filters"].numpy())) > 1e-5


# width 1/16: channels 8, 16, 24, 32, 40; 3x3 kernels.
CONV = 9 * (1 * 8 + 8 * 16 + 16 * 24 + 24 * 32 + 32 * 40)  # 23112


@pytest.mark.parametrize(
    "name, norm, params",
    [
        ("seed_convnet", "batchnorm", CONV + 2 * (8 + 16 + 24 + 32 + 40) + 40 * 10 + 10),  # gamma, beta
        ("seed_convnet", "none", CONV + (8 + 16 + 24 + 32 + 40) + 40 * 10 + 10),  # conv biases
        ("mlp", "none", 784 * 32 + 32 + 32 * 10 + 10),
        ("mlp", "batchnorm", 784 * 32 + 2 * 32 + 32 * 10 + 10),
    ],
)
def test_registry_builds_every_model(name, norm, params):
    assert tuple(BUILDERS) == MODEL_NAMES
    model = build_model(ModelConfig(name=name, norm=norm, width=0.0625, hidden=32), 0, (28, 28, 1), 10)
    assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == params
    logits = model.forward(tf.zeros([3, 28, 28, 1]), False)
    assert logits.shape == (3, 10)
    names = list(model.named_weights())
    assert len(names) == len(set(names)) and all(":" not in n for n in names)
    assert len(model.norm_layers) == (0 if norm == "none" else (5 if name == "seed_convnet" else 1))


def test_same_seed_same_weights():
    a = build_model(ModelConfig(width=0.0625), 11, (28, 28, 1), 10).named_weights()
    b = build_model(ModelConfig(width=0.0625), 11, (28, 28, 1), 10).named_weights()
    c = build_model(ModelConfig(width=0.0625), 12, (28, 28, 1), 10).named_weights()
    assert list(a) == list(b)
    assert all(np.array_equal(a[n].numpy(), b[n].numpy()) for n in a)
    assert not np.array_equal(a["conv1/filters"].numpy(), c["conv1/filters"].numpy())


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16])
def test_the_built_in_leaky_relu_has_tensorflow_s_values_and_gradient_bits_from_one_fused_op(dtype):
    """builtin.leaky_relu's gradient (the TensorFlow backend's) reads its output: the bits of tf.nn.leaky_relu's own
    gradient (zero and negative inputs included, in every compute precision), and one LeakyReluGrad op, no compare
    and select."""
    from accum_train.backends.tensorflow.builtin import leaky_relu

    x = tf.constant(np.concatenate([RNG.normal(size=997), [0.0, -0.0, 1e-30, -1e-30, 3.0]]), dtype)
    upstream = tf.constant(RNG.normal(size=1002), dtype)

    def gradient_of(fn):
        @tf.function
        def run(x, upstream):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = fn(x)
            return y, tape.gradient(y, x, output_gradients=upstream)

        return run

    ours, theirs = gradient_of(leaky_relu), gradient_of(lambda t: tf.nn.leaky_relu(t, 0.2))
    for got, expected in zip(ours(x, upstream), theirs(x, upstream)):
        np.testing.assert_array_equal(got.numpy().view(np.uint8), expected.numpy().view(np.uint8))
    graph = ours.get_concrete_function(x, upstream).graph.as_graph_def()
    ops = [node.op for f in graph.library.function for node in f.node_def] + [node.op for node in graph.node]
    assert "LeakyReluGrad" in ops and "Greater" not in ops and "SelectV2" not in ops


def test_the_backend_builds_every_norm_the_config_names():
    # the registry check that stood beside the nets: the backend takes no config, so the test holds the two together
    assert tuple(NORM_LAYERS) == NORM_NAMES
