"""The arithmetic of paired rounds: a ratio per round, its median and a distribution-free 95% interval for it.

The timing benchmarks (peers.py, peers_masked.py, peers_causal_lm.py, versus.py) run every method once per round,
interleaved, so that round r of one method and round r of another ran back to back, under the same load. A ratio of
two methods is then taken within each round (round r of one against round r of the other), and reported as the
median of those per-round ratios with a confidence interval for that median. No distribution is assumed (timings
on a shared machine are skewed, with outliers): the interval's ends are order statistics of the sorted per-round
ratios, x_(j+1) and x_(n-j), which hold the true median with probability 1 - 2 P(B <= j), B ~ binomial(n, 1/2)
(the number of rounds that fall below it). ``j`` is the largest cut whose coverage is still at least the level
asked for (95%), so the interval is the narrowest that keeps it. With 5 rounds even the widest interval, [min,
max], covers only 1 - 2/32 = 93.75%, the closest available to 95%: the scripts default to 6 rounds, the fewest
whose [min, max] reaches it (96.875%). Each interval records its exact coverage.

This module imports nothing but the standard library: it is the one place that arithmetic lives.
"""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

LEVEL = Fraction(95, 100)  # the confidence asked for; the coverage reached is recorded with each interval
ROUNDS = 6  # the fewest rounds whose [min, max] covers the median with at least 95% (96.875%); 5 give 93.75%


def coverage(n: int, j: int) -> Fraction:
    """The exact probability that [x_(j+1), x_(n-j)] of n sorted values holds their distribution's median."""
    below = sum(math.comb(n, i) for i in range(j + 1))
    return 1 - Fraction(2 * below, 2**n)


def cut(n: int, level: Fraction = LEVEL) -> int:
    """How many sorted values to drop at each end: the most that keeps the coverage at ``level`` or above; 0
    (the whole range) where even that falls short (n <= 5 for 95%)."""
    j = 0
    while n - 2 * (j + 1) >= 1 and coverage(n, j + 1) >= level:
        j += 1
    return j


def median_interval(values, level: Fraction = LEVEL) -> dict:
    """The median of ``values`` and the distribution-free interval for it (see the module's docstring):
    {median, low, high, rounds (how many values), confidence (the interval's exact coverage)}."""
    ordered = sorted(float(value) for value in values)
    n = len(ordered)
    if n == 0:
        raise ValueError("no rounds: a median needs at least one value")
    j = cut(n, level)
    return {
        "median": statistics.median(ordered),
        "low": ordered[j],
        "high": ordered[n - 1 - j],
        "rounds": n,
        "confidence": float(coverage(n, j)),
    }


def paired_ratio(numerators, denominators, level: Fraction = LEVEL) -> dict:
    """Round r of ``numerators`` over round r of ``denominators`` (per-round figures of two methods timed in the
    same rounds), summarised by median_interval, with the per-round ratios kept in ``per_round``."""
    numerators, denominators = list(numerators), list(denominators)
    if len(numerators) != len(denominators):
        raise ValueError(f"paired rounds must match: {len(numerators)} against {len(denominators)}")
    ratios = [n / d for n, d in zip(numerators, denominators)]
    return {**median_interval(ratios, level), "per_round": ratios}


def per_round(times: dict, ours: str, theirs: str, measure: str) -> dict:
    """Examples per ``measure``-second ("cpu" or "wall") of method ``ours`` over method ``theirs``, round by round:
    a timing benchmark's ``times`` holds each method's seconds per example of every round under
    "rounds_{measure}_s_per_example", so round r's ratio is theirs[r] / ours[r]. Above 1: ours did more examples
    per second in that round."""
    key = f"rounds_{measure}_s_per_example"
    return paired_ratio(times[theirs][key], times[ours][key])


def reaches(target: str, paired: dict) -> bool:
    """Whether a paired ratio reaches ``target`` (">= B" or "<= B"). A parity target (B = 1: no slower, no
    more) is reached when the median is on its side of 1 or the interval contains 1: the rounds cannot tell the
    two apart. Any other bound states a size, which the median itself must reach."""
    sign, bound = target.split()
    bound = float(bound)
    if sign not in (">=", "<="):
        raise ValueError(f"target {target!r} must be '>= B' or '<= B'")
    median_reaches = paired["median"] >= bound if sign == ">=" else paired["median"] <= bound
    return median_reaches or (bound == 1.0 and paired["low"] <= bound <= paired["high"])


RULE = (
    "a ratio reaches its target when the median of its paired rounds does; a parity target (>= 1 or <= 1) also "
    "when the 95% interval contains 1"
)
