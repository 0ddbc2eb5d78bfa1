"""The accumulation engine's semantics, asserted with numbers.

1. the applied gradient is that of the mean loss over the whole batch, ragged
   micro-batches weighted by their example counts;
2. with no batch-dependent layer, weights after k-way accumulation equal
   whole-batch training to 1e-5 (SGD, Adam; k dividing the batch or not; a
   short last batch);
3. optimizer steps, schedules and Adam's bias correction count updates;
4. the cache is empty after every update;
5. clipping acts on the accumulated gradient, once per update;
and the engine works on a plain Keras model as well as a TensorLayer one.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.backends.tensorflow.gradient_cache import GradientCache
from accum_train.backends.tensorflow.objective import sparse_softmax_loss
from accum_train.config import ModelConfig, OptimizerConfig, ScheduleConfig
from accum_train.from_config.optim import make_optimizer, make_schedule
from accum_train.models import build_model
from accum_train.trainer.data.batching import micro_bounds
from helpers import max_difference

RNG = np.random.default_rng(1234)
X = RNG.random((64, 28, 28, 1), dtype=np.float32)
Y = RNG.integers(0, 10, 64).astype(np.int32)
# Three updates: two full batches of 24, then a short last batch of 16.
BATCHES = [(0, 24), (24, 48), (48, 64)]


def tl_model(name="mlp", norm="none"):
    model = build_model(ModelConfig(name=name, width=0.0625, norm=norm, hidden=32), 7, (28, 28, 1), 10)
    return model.trainable_variables, sparse_softmax_loss(model.forward), model


def keras_model():
    keras.utils.set_random_seed(7)
    net = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(10),
        ]
    )

    def loss_fn(x, y):
        return keras.losses.sparse_categorical_crossentropy(y, net(x, training=True), from_logits=True)

    return net.trainable_variables, loss_fn, net


def train(make, k, optimizer="sgd", lr=0.05, clip_norm=None, schedule=None):
    variables, loss_fn, model = make()
    schedule = make_schedule(lr, schedule or ScheduleConfig(), 3)
    opt = make_optimizer(OptimizerConfig(name=optimizer, learning_rate=lr), schedule, variables)
    norm_layers = getattr(model, "norm_layers", [])
    if k is None:
        engine = Accumulator(loss_fn, variables, opt, clip_norm=clip_norm, norm_layers=norm_layers, one_pass=True)
    else:
        engine = Accumulator(loss_fn, variables, opt, subdivisions=k, clip_norm=clip_norm, norm_layers=norm_layers)
    for start, end in BATCHES:
        engine.update(tf.constant(X[start:end]), tf.constant(Y[start:end]))
    return [v.numpy() for v in variables], opt, engine


@pytest.fixture(scope="module")
def whole_batch():
    """``whole_batch(make, optimizer, lr)``: the weights and update count of whole-batch training (one pass),
    trained once per (model, optimizer, rate) and shared by every test that compares with it: the k-way cases
    differ only in k, and tracing a fresh engine costs more than its three updates."""
    done = {}

    def get(make, optimizer="sgd", lr=0.05):
        if (make, optimizer, lr) not in done:
            weights, opt, _ = train(make, None, optimizer, lr)
            done[make, optimizer, lr] = weights, int(opt.iterations.numpy())
        return done[make, optimizer, lr]

    return get


@pytest.mark.parametrize(
    "n, k, sizes",
    [
        (10, 3, [3, 3, 4]),
        (40, 3, [13, 13, 14]),
        (8, 8, [1] * 8),
        (7, 2, [3, 4]),
        (5, 5, [1] * 5),
    ],
)
def test_micro_bounds_cover_the_batch_with_sizes_differing_by_at_most_one(n, k, sizes):
    bounds = [micro_bounds(i, n, k) for i in range(k)]
    assert [end - start for start, end in bounds] == sizes
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(k - 1))


@pytest.mark.parametrize("k", [2, 3, 5, 7])
def test_accumulated_gradient_is_the_full_batch_mean_gradient(k):
    variables, loss_fn, _ = tl_model()
    x, y = tf.constant(X[:40]), tf.constant(Y[:40])
    with tf.GradientTape() as tape:
        full = tape.gradient(tf.reduce_mean(loss_fn(x, y)), variables)
    engine = Accumulator(loss_fn, variables, keras.optimizers.SGD(0.0), subdivisions=k)
    naive = [tf.zeros_like(v) for v in variables]
    for i in range(k):
        start, end = micro_bounds(i, 40, k)
        engine.accumulate(x[start:end], y[start:end], 40)
        with tf.GradientTape() as tape:
            micro_mean = tf.reduce_mean(loss_fn(x[start:end], y[start:end]))
        naive = [a + g / k for a, g in zip(naive, tape.gradient(micro_mean, variables))]
    cached = [g.numpy() for g in engine.accumulated()]
    assert max_difference(cached, full) < 1e-6
    if 40 % k:
        # Averaging micro-batch means as equals (Keras' gradient_accumulation_steps,
        # the seed's divide-by-subdivisions) is measurably off for ragged splits.
        assert max_difference([g.numpy() for g in naive], full) > 1e-4


@pytest.mark.parametrize("make", [tl_model, keras_model], ids=["tensorlayer", "keras"])
@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.05), ("adam", 0.001), ("momentum", 0.05)])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 24])
def test_k_way_accumulation_equals_whole_batch_training(whole_batch, make, optimizer, lr, k):
    reference, reference_updates = whole_batch(make, optimizer, lr)
    weights, opt, _ = train(make, k, optimizer, lr)
    assert max_difference(weights, reference) < 1e-5
    assert int(opt.iterations.numpy()) == reference_updates == len(BATCHES)
    assert max_difference(weights, [v.numpy() for v in make()[0]]) > 1e-3  # it did train


@pytest.mark.parametrize("make", [tl_model, keras_model], ids=["tensorlayer", "keras"])
@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.05), ("adam", 0.001)])
def test_the_baseline_on_one_device_is_the_whole_batch_mean_step_to_the_bit(whole_batch, make, optimizer, lr):
    """The baseline differentiates sum(loss) / n, as a replica's share of a global batch must; on one
    device that gives the bits of reduce_mean's step (what it computed before it ran on strategies)."""
    weights, _ = whole_batch(make, optimizer, lr)
    variables, loss_fn, _ = make()
    opt = make_optimizer(
        OptimizerConfig(name=optimizer, learning_rate=lr), make_schedule(lr, ScheduleConfig(), 3), variables
    )

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(x, y))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    for start, end in BATCHES:
        step(tf.constant(X[start:end]), tf.constant(Y[start:end]))
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(weights, variables))
    assert max_difference(weights, [v.numpy() for v in make()[0]]) > 1e-3  # it did train


def test_seed_convnet_without_norm_matches_whole_batch():
    make = lambda: tl_model("seed_convnet", "none")  # noqa: E731
    reference, _, _ = train(make, None, "adam", 0.001)
    weights, _, _ = train(make, 5, "adam", 0.001)
    assert max_difference(weights, reference) < 1e-5


def test_short_last_batch_with_fewer_examples_than_subdivisions(whole_batch):
    # 24 + 24 + 16 examples with k=20: the last update has 16 one-example micro-batches.
    reference, _ = whole_batch(tl_model)
    weights, _, engine = train(tl_model, 20)
    assert max_difference(weights, reference) < 1e-5
    assert int(engine.subdivisions.numpy()) == 20


def test_schedule_and_adam_count_updates_not_micro_batches():
    schedule = ScheduleConfig(name="exponential", decay_steps=1, decay_rate=0.5)
    reference, _, _ = train(tl_model, None, "adam", 0.01, schedule=schedule)
    weights, opt, _ = train(tl_model, 8, "adam", 0.01, schedule=schedule)
    assert int(opt.iterations.numpy()) == 3  # 3 updates of 8 micro-batches each
    # Three updates halve the rate three times, not 24 times.
    assert float(opt.learning_rate.numpy()) == pytest.approx(0.01 * 0.5**3)
    assert max_difference(weights, reference) < 1e-5


def test_cache_is_empty_after_every_update():
    variables, loss_fn, _ = tl_model()
    engine = Accumulator(loss_fn, variables, keras.optimizers.SGD(0.1), subdivisions=3)
    for start, end in BATCHES:
        engine.update(tf.constant(X[start:end]), tf.constant(Y[start:end]))
        held = [*engine.caches[0].gradients(), *engine.totals.values()["sums"], engine.noise.read_value()]
        assert all(float(tf.reduce_max(tf.abs(g))) == 0.0 for g in held)


def test_clipping_applies_once_to_the_accumulated_gradient():
    variables, loss_fn, _ = tl_model()
    before = [v.numpy() for v in variables]
    x, y = tf.constant(X[:24]), tf.constant(Y[:24])
    with tf.GradientTape() as tape:
        full = tape.gradient(tf.reduce_mean(loss_fn(x, y)), variables)
    norm = float(tf.linalg.global_norm(full))
    clip = norm / 4  # the clip must bite
    engine = Accumulator(loss_fn, variables, keras.optimizers.SGD(1.0), subdivisions=4, clip_norm=clip)
    out = engine.update(x, y)
    expected = [b - g.numpy() * clip / norm for b, g in zip(before, full)]
    assert max_difference([v.numpy() for v in variables], expected) < 1e-6
    assert float(out["grad_norm"]) == pytest.approx(norm, rel=1e-5)  # reported before clipping
    # Clipping each micro-batch instead would give another result entirely.
    assert max_difference(train(tl_model, 4, clip_norm=clip)[0], train(tl_model, None, clip_norm=clip)[0]) < 1e-5


def test_gradient_cache_clear_add_gradients():
    v = [tf.Variable(tf.ones([2, 2])), tf.Variable(tf.ones([3]))]
    cache = GradientCache(v)
    cache.add([tf.fill([2, 2], 2.0), None])
    cache.add([tf.fill([2, 2], 0.5), tf.fill([3], 1.0)])
    np.testing.assert_array_equal(cache.gradients()[0].numpy(), np.full([2, 2], 2.5))
    np.testing.assert_array_equal(cache.gradients()[1].numpy(), np.ones(3))
    cache.clear()
    assert all(float(tf.reduce_sum(tf.abs(g))) == 0.0 for g in cache.gradients())


def test_non_finite_micro_batch_skips_the_whole_update():
    variables, loss_fn, _ = tl_model()
    opt = keras.optimizers.Adam(0.01)
    engine = Accumulator(loss_fn, variables, opt, subdivisions=3)
    engine.update(tf.constant(X[:24]), tf.constant(Y[:24]))
    before = [v.numpy() for v in variables]
    slots = [s.numpy() for s in opt.variables]
    bad = X[:24].copy()
    bad[20] = np.nan  # only the last micro-batch is poisoned
    out = engine.update(tf.constant(bad), tf.constant(Y[:24]))
    assert not bool(out["applied"])
    assert max_difference([v.numpy() for v in variables], before) == 0.0
    assert max_difference([s.numpy() for s in opt.variables], slots) == 0.0  # iterations and moments too
    assert all(float(tf.reduce_sum(tf.abs(g))) == 0.0 for g in engine.caches[0].gradients())
    assert bool(engine.update(tf.constant(X[:24]), tf.constant(Y[:24]))["applied"])


@pytest.mark.parametrize(
    "k, parallel", [(None, 1), (3, 1), (3, 2)], ids=["plain", "one-micro-step-at-a-time", "two-in-flight"]
)
def test_a_skipped_update_leaves_batchnorm_statistics_and_everything_else_unchanged(k, parallel):
    """Two in flight is the default on a CPU: its loop carries the sums as tensors, and a NaN there must
    leave every weight, optimizer slot and moving statistic as bit-identical as one at a time does."""
    variables, loss_fn, model = tl_model("seed_convnet", "batchnorm")
    opt = keras.optimizers.Adam(0.01)
    engine = (
        Accumulator(loss_fn, variables, opt, norm_layers=model.norm_layers, one_pass=True)
        if k is None
        else Accumulator(loss_fn, variables, opt, subdivisions=k, norm_layers=model.norm_layers, parallel=parallel)
    )
    engine.update(tf.constant(X[:24]), tf.constant(Y[:24]))  # a good update: statistics and moments have moved
    state = {v.name: v.numpy() for v in model.variables}
    assert {"bn1/moving_mean:0", "bn5/moving_var:0"} <= set(state)
    assert float(np.max(np.abs(state["bn1/moving_var:0"] - 1.0))) > 1e-4  # it did move from its initial ones
    slots = {s.path: s.numpy() for s in opt.variables}
    assert len(slots) == len(opt.variables) == 2 * len(variables) + 2  # m and v per weight, iterations, rate
    bad = X[24:48].copy()
    bad[20] = np.nan  # in the last micro-batch only
    out = engine.update(tf.constant(bad), tf.constant(Y[24:48]))
    assert not bool(out["applied"]) and np.isnan(float(out["learning_rate"]))
    for v in model.variables:
        np.testing.assert_array_equal(v.numpy(), state[v.name], err_msg=v.name)
    for s in opt.variables:
        np.testing.assert_array_equal(s.numpy(), slots[s.path], err_msg=s.path)
    # nothing pending from the bad batch leaks into the next update's statistics
    assert all(float(layer.pending.count.numpy()) == 0.0 for layer in model.norm_layers)
    assert (int(engine.bad_updates_in_a_row.numpy()), int(engine.skipped_updates.numpy())) == (1, 1)
    assert bool(engine.update(tf.constant(X[:24]), tf.constant(Y[:24]))["applied"])
    assert (int(engine.bad_updates_in_a_row.numpy()), int(engine.skipped_updates.numpy())) == (0, 1)


def test_one_replica_of_a_strategy_trains_as_the_default_strategy_does():
    """MirroredStrategy on one device (a machine with one GPU, or `strategy.name: mirrored` on a CPU): its
    replica-local variables are written in replica context, pulled micro-batches too; the same bits."""
    from accum_train.trainer.data.feed import distribute

    def trained(strategy):
        with strategy.scope():
            variables, loss_fn, _ = tl_model(norm="batchnorm")
            opt = keras.optimizers.SGD(0.05)
        engine = Accumulator(loss_fn, variables, opt, subdivisions=3, norm_layers=_.norm_layers, strategy=strategy)
        engine.update(tf.constant(X[:24]), tf.constant(Y[:24]))
        elements = tf.data.Dataset.from_tensor_slices((X[24:48], Y[24:48])).batch(8)
        engine.update_from(distribute(engine.strategy, elements), 24, 3)
        return [v.numpy() for v in variables]

    one = trained(tf.distribute.MirroredStrategy(["/cpu:0"]))
    assert max_difference(one, trained(tf.distribute.get_strategy())) == 0.0
