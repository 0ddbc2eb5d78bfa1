"""benchmarks/paired.py, the arithmetic of paired rounds, on numbers: the median of per-round ratios, the order
statistics its distribution-free interval takes for each number of rounds and their exact binomial coverage, the
ratios taken round by round from a benchmark's times, and when a paired ratio reaches its target."""

from fractions import Fraction
from pathlib import Path

import pytest
from helpers import load_file

paired = load_file(Path(__file__).resolve().parent.parent / "benchmarks" / "paired.py", "paired")


# values -> median, low, high, confidence: [x_(j+1), x_(n-j)] with coverage 1 - 2 P(B <= j), B ~ binomial(n, 1/2)
@pytest.mark.parametrize(
    "values, median, low, high, confidence",
    [
        ([2.5], 2.5, 2.5, 2.5, 0.0),  # one round: no interval covers anything
        ([1.2, 0.8], 1.0, 0.8, 1.2, 0.5),
        ([3.0, 1.0, 2.0, 4.0], 2.5, 1.0, 4.0, 0.875),  # 1 - 2/16
        ([1.3, 0.9, 1.1, 1.0, 1.2], 1.1, 0.9, 1.3, 0.9375),  # 5 rounds: [min, max], 1 - 2/32, the closest to 95%
        ([6.0, 1.0, 5.0, 2.0, 4.0, 3.0], 3.5, 1.0, 6.0, 0.96875),  # 6 rounds: [min, max] reaches 95%, 1 - 2/64
        ([8, 1, 7, 2, 6, 3, 5, 4], 4.5, 1.0, 8.0, 0.9921875),  # cutting one each end would give 1 - 18/256 = 92.97%
        ([9, 1, 8, 2, 7, 3, 6, 4, 5], 5.0, 2.0, 8.0, 0.9609375),  # 9 rounds: [x_(2), x_(8)], 1 - 2 (1 + 9)/512
        (list(range(1, 13)), 6.5, 3.0, 10.0, 1 - 158 / 4096),  # 12: [x_(3), x_(10)], 1 - 2 (1 + 12 + 66)/4096
        (list(range(1, 18)), 9.0, 5.0, 13.0, 1 - 6428 / 131072),  # 17: [x_(5), x_(13)], 95.10%; x_(6) 85.65%
    ],
)
def test_median_and_its_interval(values, median, low, high, confidence):
    got = paired.median_interval(values)
    assert got == {"median": median, "low": low, "high": high, "rounds": len(values), "confidence": confidence}


# n, j -> 1 - 2 P(B <= j), B ~ binomial(n, 1/2)
@pytest.mark.parametrize(
    "n, j, coverage",
    [
        (5, 0, 1 - Fraction(2, 32)),
        (6, 0, 1 - Fraction(2, 64)),
        (8, 1, 1 - Fraction(2 * (1 + 8), 256)),
        (17, 5, 1 - Fraction(2 * (1 + 17 + 136 + 680 + 2380 + 6188), 2**17)),
    ],
)
def test_coverage_is_exact(n, j, coverage):
    assert paired.coverage(n, j) == coverage


@pytest.mark.parametrize(
    "n, level, cut",
    [(5, Fraction(95, 100), 0), (8, Fraction(95, 100), 0), (9, Fraction(95, 100), 1), (8, Fraction(90, 100), 1)],
)
def test_the_cut_is_the_most_that_keeps_the_level(n, level, cut):
    assert paired.cut(n, level) == cut


def test_paired_ratio_takes_each_round_against_the_same_round():
    got = paired.paired_ratio([2.0, 3.0, 9.0, 4.0, 5.0, 6.0], [1.0, 3.0, 3.0, 8.0, 5.0, 4.0])
    assert got["per_round"] == [2.0, 1.0, 3.0, 0.5, 1.0, 1.5]
    assert (got["median"], got["low"], got["high"], got["rounds"]) == (1.25, 0.5, 3.0, 6)


def test_per_round_is_examples_per_second_of_ours_over_theirs():
    times = {
        "ours": {"rounds_cpu_s_per_example": [1.0, 2.0], "rounds_wall_s_per_example": [4.0, 5.0]},
        "theirs": {"rounds_cpu_s_per_example": [3.0, 3.0], "rounds_wall_s_per_example": [2.0, 10.0]},
    }
    assert paired.per_round(times, "ours", "theirs", "cpu")["per_round"] == [3.0, 1.5]
    assert paired.per_round(times, "ours", "theirs", "wall")["per_round"] == [0.5, 2.0]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: paired.median_interval([]), "no rounds: a median needs at least one value"),
        (lambda: paired.paired_ratio([1.0, 2.0], [1.0]), "paired rounds must match: 2 against 1"),
        (
            lambda: paired.reaches("> 1.0", {"median": 1, "low": 1, "high": 1}),
            "target '> 1.0' must be '>= B' or '<= B'",
        ),
    ],
)
def test_errors(call, message):
    with pytest.raises(ValueError) as raised:
        call()
    assert str(raised.value) == message


# target, median, low, high -> reached
@pytest.mark.parametrize(
    "target, median, low, high, reached",
    [
        (">= 1.0", 1.02, 0.97, 1.05, True),  # the median reaches it
        (">= 1.0", 0.98, 0.95, 1.02, True),  # parity: the interval holds 1, the rounds cannot tell them apart
        (">= 1.0", 0.97, 0.95, 0.99, False),  # the whole interval below 1: slower
        (">= 1.00", 0.99, 0.98, 1.0, True),  # an end at 1 holds it
        ("<= 1.0", 1.01, 0.99, 1.03, True),
        ("<= 1.0", 1.02, 1.01, 1.03, False),
        (">= 1.5", 1.49, 1.3, 1.6, False),  # a size, not parity: the median must reach it
        (">= 1.5", 1.5, 1.4, 1.6, True),
        ("<= 1.03", 1.04, 1.0, 1.05, False),
        ("<= 0.3", 0.17, 0.17, 0.17, True),  # a single measurement: its own bounds
    ],
)
def test_reaches(target, median, low, high, reached):
    assert paired.reaches(target, {"median": median, "low": low, "high": high}) is reached
