"""LARS and LAMB (accum_train.trainer.optim) against the papers' update rules, written again here in numpy (float64);
LAMB against keras.optimizers.Lamb where the two coincide; the config keys through make_optimizer; and (slow)
a CLI run resumed after its first epoch against one that ran both epochs.

The numpy rules are the papers' algorithms, per variable w with gradient g at 0-based update t (rate lr_t):

LARS (You, Gitman, Ginsburg 2017, Algorithm 1), momentum m, weight decay beta, trust coefficient eta:
    local = eta ||w|| / (||g|| + beta ||w||)   (||w|| / (||g|| + beta ||w||) taken as 1 when ||w|| or the
                                                denominator is 0: local = eta)
    v = m v + lr_t local (g + beta w);  w = w - v
LAMB (You et al. 2019, Algorithm 2), beta_1 0.9, beta_2 0.999, eps 1e-7, weight decay beta:
    m = beta_1 m + (1 - beta_1) g;  v = beta_2 v + (1 - beta_2) g^2
    r = m / (1 - beta_1^(t+1)) / (sqrt(v / (1 - beta_2^(t+1))) + eps) + beta w
    w = w - lr_t (||w|| / ||r||) r          (the ratio taken as 1 when ||w|| or ||r|| is 0)
Variables left out of adaptation take the plain step without decay: v = m v + lr_t g, w = w - v (LARS);
w = w - lr_t m^ / (sqrt(v^) + eps) (LAMB, Adam).

The optimizers compute in float32, the rules here in float64; after 5 updates the two agree to 1e-6 in
``difference``: |got - want| / max(1, |want|), absolute for |want| <= 1 and relative above (the weights here
are of order 1); measured: 3.4e-7 at most. Every case also checks that the weights moved by far more than that
(> 1e-3), so that a wrong rule cannot hide under the tolerance.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train.config import as_config
from accum_train.from_config.optim import make_optimizer
from accum_train.trainer.optim import LAMB, LARS

STEPS = 5
TOLERANCE = 1e-6
MOVED = 1e-3  # the least a variable has to move in any case: 1000 x the tolerance

# The variables: a dense kernel, a conv kernel, a bias, and a kernel at zero (the ratio's "||w|| = 0" path).
# The names are TensorLayer's (a tf.Variable's name, which the exclusion patterns are searched in).
SHAPES = {"dense/kernel": (6, 4), "conv/filters": (3, 3, 2, 4), "dense/bias": (4,), "zero/kernel": (5, 3)}
# dense/kernel's gradient is 0 at this update: with weight decay 0, LARS's denominator ||g|| + beta ||w|| is 0.
ZERO_GRADIENT_AT = 2

LARS_RATES = [1.0, 0.5, 2.0, 0.25, 1.5]  # the rate of each update where it varies
LAMB_RATES = [0.1 * rate for rate in LARS_RATES]
LARS_SETTINGS = {"momentum": 0.8, "trust_coefficient": 0.05}


def initial_weights():
    rng = np.random.default_rng(1)
    weights = {name: rng.normal(size=shape).astype(np.float32) for name, shape in SHAPES.items()}
    weights["zero/kernel"][...] = 0.0
    return weights


def gradients():
    """STEPS dicts of float32 gradients, of different scales per variable."""
    rng = np.random.default_rng(2)
    scale = {"dense/kernel": 1.0, "conv/filters": 0.3, "dense/bias": 0.1, "zero/kernel": 2.0}
    steps = [
        {name: (scale[name] * rng.normal(size=shape)).astype(np.float32) for name, shape in SHAPES.items()}
        for _ in range(STEPS)
    ]
    steps[ZERO_GRADIENT_AT]["dense/kernel"][...] = 0.0
    return steps


def norm(x):
    return float(np.sqrt(np.sum(np.square(x))))


def lars_reference(weights, grads, rates, excluded, momentum, trust_coefficient, weight_decay):
    """LARS, Algorithm 1 of You, Gitman, Ginsburg 2017, in float64 (see the module docstring)."""
    w = {name: value.astype(np.float64) for name, value in weights.items()}
    velocity = {name: np.zeros_like(value) for name, value in w.items()}
    for rate, g in zip(rates, grads):
        for name in w:
            grad = g[name].astype(np.float64)
            if name in excluded:
                velocity[name] = momentum * velocity[name] + rate * grad
            else:
                w_norm = norm(w[name])
                denominator = norm(grad) + weight_decay * w_norm
                ratio = w_norm / denominator if w_norm > 0 and denominator > 0 else 1.0
                local = trust_coefficient * ratio
                velocity[name] = momentum * velocity[name] + rate * local * (grad + weight_decay * w[name])
            w[name] = w[name] - velocity[name]
    return w


def correction32(beta, t):
    """1 - beta^t as float32 computes it, as every float32 Adam does (keras.optimizers.Adam and Lamb too).

    The subtraction cancels: float32's 0.999 is 0.99900001287, which makes 1 - 0.999^1 1.3e-5 smaller (Adam's
    step 6.4e-6 larger) than in float64, and the rounding of 0.999^t adds as much again. With float64's 1 - beta^t
    here the LAMB cases differ by up to 3.7e-6 after 5 updates; with this one by 1.9e-7 at most."""
    return float(np.float32(1.0) - np.float32(beta) ** np.float32(t))


def lamb_reference(weights, grads, rates, excluded, weight_decay, beta_1=0.9, beta_2=0.999, eps=1e-7):
    """LAMB, Algorithm 2 of You et al. 2019, in float64 (see the module docstring)."""
    w = {name: value.astype(np.float64) for name, value in weights.items()}
    m = {name: np.zeros_like(value) for name, value in w.items()}
    v = {name: np.zeros_like(value) for name, value in w.items()}
    for t, (rate, g) in enumerate(zip(rates, grads), start=1):
        for name in w:
            grad = g[name].astype(np.float64)
            m[name] = beta_1 * m[name] + (1 - beta_1) * grad
            v[name] = beta_2 * v[name] + (1 - beta_2) * grad**2
            m_hat, v_hat = m[name] / correction32(beta_1, t), v[name] / correction32(beta_2, t)
            r = m_hat / (np.sqrt(v_hat) + eps)
            if name not in excluded:
                r = r + weight_decay * w[name]
                w_norm, r_norm = norm(w[name]), norm(r)
                r = (w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0) * r
            w[name] = w[name] - rate * r
    return w


class TableSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """rates[step]: a rate that changes at every update."""

    def __init__(self, rates):
        self.rates = tf.constant(rates, tf.float32)

    def __call__(self, step):
        return tf.gather(self.rates, tf.cast(step, tf.int32))


def learning_rate(kind, rates):
    """The optimizer's learning_rate argument, the rates the reference uses, and a per-update setter."""
    rates32 = [float(np.float32(rate)) for rate in rates]
    if kind == "constant":
        return rates32[0], [rates32[0]] * STEPS, lambda t: None
    if kind == "schedule":
        return TableSchedule(rates), rates32, lambda t: None
    current = tf.Variable(rates[0], dtype=tf.float32)  # "callable": a no-argument callable read at each update
    return current.read_value, rates32, lambda t: current.assign(rates[t])


def keras_variable(value, name):
    """A keras.Variable whose path is ``name`` (LAYER/WEIGHT) and whose name is only WEIGHT."""
    layer, weight = name.split("/")
    with keras.name_scope(layer):
        return keras.Variable(value, name=weight)


def run_steps(optimizer, weights, grads, before_step=lambda t: None, compiled=False, make_variable=tf.Variable):
    """The weights after one apply_gradients per entry of grads, on variables named as the keys (tf.Variables,
    as the engine hands TensorLayer's and a keras_file model's, or keras.Variables)."""
    variables = [make_variable(value, name=name) for name, value in weights.items()]
    optimizer.build(variables)

    def step(values):
        optimizer.apply_gradients(zip(values, variables))

    step = tf.function(step) if compiled else step
    for t, g in enumerate(grads):
        before_step(t)
        step([tf.constant(g[name]) for name in weights])
    assert int(optimizer.iterations.numpy()) == len(grads)
    return {name: variable.numpy() for name, variable in zip(weights, variables)}


def difference(got, want):
    """max over the variables of |got - want| / max(1, |want|)."""
    return max(float(np.max(np.abs(got[k] - want[k]) / np.maximum(1.0, np.abs(want[k])))) for k in want)


def least_movement(final, initial):
    """The smallest, over the variables, of the largest change of one element."""
    return min(float(np.max(np.abs(final[k] - initial[k]))) for k in initial)


ONE_AXIS = {"dense/bias"}  # exclude None: the variables with one axis
CASES = [
    # (exclude, the variables it leaves out, weight decay, learning rate kind, under tf.function)
    pytest.param(None, ONE_AXIS, 0.0, "constant", False, id="one-axis-excluded"),
    pytest.param(None, ONE_AXIS, 0.1, "constant", False, id="one-axis-excluded-decay"),
    pytest.param([], set(), 0.0, "constant", False, id="none-excluded"),
    pytest.param([], set(), 0.1, "constant", False, id="none-excluded-decay"),
    pytest.param([r"^conv/"], {"conv/filters"}, 0.1, "constant", False, id="conv-kernel-excluded-by-name"),
    pytest.param(["bias", "^zero/"], {"dense/bias", "zero/kernel"}, 0.1, "constant", False, id="two-patterns"),
    pytest.param(None, ONE_AXIS, 0.1, "schedule", False, id="schedule"),
    pytest.param([r"^conv/"], {"conv/filters"}, 0.0, "callable", False, id="callable"),
    pytest.param(None, ONE_AXIS, 0.1, "schedule", True, id="schedule-tf.function"),
]


@pytest.mark.parametrize(("exclude", "excluded", "weight_decay", "rate_kind", "compiled"), CASES)
def test_lars_follows_algorithm_1(exclude, excluded, weight_decay, rate_kind, compiled):
    """LARS's 5 updates equal Algorithm 1's (trust ratio and decay on the adapted variables, plain momentum SGD
    on the excluded ones, the zero kernel's first step at ratio 1, dense/kernel's zero-gradient step finite)
    to 1e-6, for each exclusion rule, with and without weight decay, at a constant rate, a schedule's and a
    callable's."""
    weights, grads = initial_weights(), gradients()
    rate, rates, before_step = learning_rate(rate_kind, LARS_RATES)
    optimizer = LARS(rate, weight_decay=weight_decay, exclude=exclude, **LARS_SETTINGS)
    got = run_steps(optimizer, weights, grads, before_step, compiled)
    want = lars_reference(weights, grads, rates, excluded, weight_decay=weight_decay, **LARS_SETTINGS)
    assert difference(got, want) <= TOLERANCE
    assert least_movement(want, weights) > MOVED


@pytest.mark.parametrize(("exclude", "excluded", "weight_decay", "rate_kind", "compiled"), CASES)
def test_lamb_follows_algorithm_2(exclude, excluded, weight_decay, rate_kind, compiled):
    """LAMB's 5 updates equal Algorithm 2's (bias-corrected Adam moments, decay inside the trust ratio on the
    adapted variables, plain Adam on the excluded ones, the zero kernel's first step at ratio 1) to 1e-6, for
    each exclusion rule, with and without weight decay, at a constant rate, a schedule's and a callable's."""
    weights, grads = initial_weights(), gradients()
    rate, rates, before_step = learning_rate(rate_kind, LAMB_RATES)
    got = run_steps(LAMB(rate, weight_decay=weight_decay, exclude=exclude), weights, grads, before_step, compiled)
    want = lamb_reference(weights, grads, rates, excluded, weight_decay=weight_decay)
    assert difference(got, want) <= TOLERANCE
    assert least_movement(want, weights) > MOVED


@pytest.mark.parametrize(
    ("optimizer", "reference", "rate"),
    [
        pytest.param(
            lambda: LARS(1.0, weight_decay=0.1, exclude=["^dense/"], **LARS_SETTINGS),
            lambda *args: lars_reference(*args, weight_decay=0.1, **LARS_SETTINGS),
            1.0,
            id="lars",
        ),
        pytest.param(
            lambda: LAMB(0.1, weight_decay=0.1, exclude=["^dense/"]),
            lambda *args: lamb_reference(*args, weight_decay=0.1),
            0.1,
            id="lamb",
        ),
    ],
)
def test_patterns_are_searched_in_a_keras_variables_path(optimizer, reference, rate):
    """keras.Variables (what model.fit would hand over) are matched by their path: "^dense/" leaves out
    dense/kernel and dense/bias, whose names are only "kernel" and "bias", and the 5 updates follow the paper's
    rule with those two excluded to 1e-6. (Under the TensorFlow backend update_step sees the tf.Variable under
    each, named by the path: "dense/kernel:0".)"""
    weights, grads = initial_weights(), gradients()
    got = run_steps(optimizer(), weights, grads, make_variable=keras_variable)
    want = reference(weights, grads, [float(np.float32(rate))] * STEPS, {"dense/kernel", "dense/bias"})
    assert difference(got, want) <= TOLERANCE
    assert least_movement(want, weights) > MOVED


@pytest.mark.parametrize("rate_kind", ["constant", "schedule"])
def test_lamb_without_decay_or_exclusion_is_keras_lamb(rate_kind):
    """With weight_decay 0 and nothing excluded, LAMB's 5 updates are keras.optimizers.Lamb's to 1e-6 (the same
    float32 rule, its moments summed in another order: measured 1.4e-7 apart), the zero kernel included."""
    weights, grads = initial_weights(), gradients()
    rate, _, _ = learning_rate(rate_kind, LAMB_RATES)
    got = run_steps(LAMB(rate, weight_decay=0.0, exclude=[]), weights, grads)
    want = run_steps(keras.optimizers.Lamb(rate), weights, grads)
    assert difference(got, want) <= TOLERANCE
    assert least_movement(want, weights) > MOVED


MAKE_CASES = [
    # (optimizer config, the rule it must give: optimizer, its settings, the variables left out)
    pytest.param(
        {"name": "lars"},
        ("lars", {"momentum": 0.9, "trust_coefficient": 0.001, "weight_decay": 0.0}, ONE_AXIS),
        id="lars-defaults",
    ),
    pytest.param(
        {"name": "lars", "momentum": 0.5, "trust_coefficient": 0.01, "weight_decay": 0.2},
        ("lars", {"momentum": 0.5, "trust_coefficient": 0.01, "weight_decay": 0.2}, ONE_AXIS),
        id="lars-momentum-trust-decay",
    ),
    pytest.param(
        {"name": "lars", "exclude_from_adaptation": []},
        ("lars", {"momentum": 0.9, "trust_coefficient": 0.001, "weight_decay": 0.0}, set()),
        id="lars-none-excluded",
    ),
    pytest.param(
        {"name": "lars", "weight_decay": 0.1, "exclude_from_adaptation": ["^conv/", "bias"]},
        ("lars", {"momentum": 0.9, "trust_coefficient": 0.001, "weight_decay": 0.1}, {"conv/filters", "dense/bias"}),
        id="lars-patterns",
    ),
    pytest.param({"name": "lamb"}, ("lamb", {"weight_decay": 0.0}, ONE_AXIS), id="lamb-defaults"),
    pytest.param(
        {"name": "lamb", "weight_decay": 0.3, "exclude_from_adaptation": ["^zero/"]},
        ("lamb", {"weight_decay": 0.3}, {"zero/kernel"}),
        id="lamb-decay-pattern",
    ),
    pytest.param(
        {"name": "lamb", "exclude_from_adaptation": []}, ("lamb", {"weight_decay": 0.0}, set()), id="lamb-none-excluded"
    ),
]


@pytest.mark.parametrize(("optimizer_config", "rule"), MAKE_CASES)
def test_make_optimizer_passes_the_config_keys(optimizer_config, rule):
    """make_optimizer on the optimizer section of a checked config gives the optimizer whose 5 updates follow
    the paper's rule with the config's momentum, trust_coefficient, weight_decay and exclude_from_adaptation
    (the defaults where a key is left out) to 1e-6."""
    name, settings, excluded = rule
    weights, grads = initial_weights(), gradients()
    rate = 2.0 if name == "lars" else 0.05
    cfg = as_config({"optimizer": {**optimizer_config, "learning_rate": rate}}).optimizer
    variables = [tf.Variable(value, name=key) for key, value in weights.items()]
    optimizer = make_optimizer(cfg, rate, variables)
    assert type(optimizer) is {"lars": LARS, "lamb": LAMB}[name]
    for g in grads:
        optimizer.apply_gradients(zip([tf.constant(g[key]) for key in weights], variables))
    got = {key: variable.numpy() for key, variable in zip(weights, variables)}
    reference = {"lars": lars_reference, "lamb": lamb_reference}[name]
    want = reference(weights, grads, [rate] * STEPS, excluded, **settings)
    assert difference(got, want) <= TOLERANCE
    assert least_movement(want, weights) > MOVED


RESUME_CASES = [
    # (the optimizer settings, as --set)
    pytest.param(
        [
            "optimizer.name=lars",
            "optimizer.learning_rate=0.5",
            "optimizer.trust_coefficient=0.02",
            "optimizer.weight_decay=0.0001",
        ],
        id="lars",
    ),
    pytest.param(["optimizer.name=lamb", "optimizer.learning_rate=0.003", "optimizer.weight_decay=0.01"], id="lamb"),
]


@pytest.mark.slow
@pytest.mark.parametrize("settings", RESUME_CASES)
def test_resumed_after_epoch_one_ends_at_the_uninterrupted_weights(tmp_path, repo_root, data_dir, settings):
    """configs/smoke.yaml on 640 examples (10 updates an epoch) with LARS or LAMB: epochs=1 then
    --resume --set epochs=2 writes the weights.npz of an epochs=2 run to 1e-6 (measured bit-equal: 0.0), so
    the optimizer's state (velocities, moments, update count) comes back from the checkpoint; epoch 2 moved
    every trainable variable by more than 1e-4 (measured: at least 9.7e-3 under LARS, 8.2e-4 under LAMB)."""
    from accum_train.cli.main import main
    from click.testing import CliRunner

    sets = [arg for setting in ["data.train_limit=640", *settings] for arg in ("--set", setting)]
    smoke = str(repo_root / "configs" / "smoke.yaml")

    def run(*args):
        result = CliRunner().invoke(main, ["run", *args, "--quiet"])
        assert result.exit_code == 0, result.output
        return result

    run(smoke, "--output-dir", str(tmp_path / "full"), *sets, "--set", "epochs=2")
    run(smoke, "--output-dir", str(tmp_path / "cut"), *sets, "--set", "epochs=1")
    after_one = dict(np.load(tmp_path / "cut" / "weights.npz"))
    run("--resume", str(tmp_path / "cut"), "--set", "epochs=2")
    full, resumed = np.load(tmp_path / "full" / "weights.npz"), np.load(tmp_path / "cut" / "weights.npz")
    assert sorted(full) == sorted(resumed) == sorted(after_one)
    assert max(float(np.max(np.abs(full[k] - resumed[k]))) for k in full) <= TOLERANCE
    trainable = [key for key in full if "moving" not in key]  # not BatchNorm's moving statistics
    assert len(trainable) == 17
    assert min(float(np.max(np.abs(full[k] - after_one[k]))) for k in trainable) > 100 * TOLERANCE


@pytest.mark.parametrize(
    "make",
    [
        lambda: LARS(2.0, momentum=0.8, weight_decay=0.1, trust_coefficient=0.01, exclude=["bias"]),
        lambda: LAMB(0.01, weight_decay=0.1, exclude=None),
        lambda: LAMB(keras.optimizers.schedules.CosineDecay(0.01, 100), weight_decay=0.0, exclude=[]),
    ],
)
def test_get_config_rebuilds_the_same_optimizer(make):
    optimizer = make()
    again = type(optimizer).from_config(optimizer.get_config())
    assert again.get_config() == optimizer.get_config()
