"""The gradient noise scale, measured from the micro-batches every update already has (McCandlish et al. 2018,
"An Empirical Model of Large-Batch Training", Appendix A.1), and the batch size that follows it.

B_noise = tr(Sigma) / |G|^2: the per-example gradient variance summed over parameters, over the squared norm
of the true gradient. Past it, a larger batch buys fewer and fewer saved updates. The estimate needs
gradients over two batch sizes; an update holds both: its micro-batches' and its whole batch's.

Micro-batch i holds b_i examples (sizes differ by one, a short batch, each replica's), g_i is its mean gradient
over its own examples, G_B the batch's mean gradient over B = sum b_i examples. With examples drawn
independently, E|g_i|^2 = |G|^2 + S / b_i and E|G_B|^2 = |G|^2 + S / B (S = tr(Sigma)). With m = mean_i |g_i|^2
and h = mean_i 1 / b_i over the k non-empty micro-batches, E m = |G|^2 + S h, so for one update, unbiased:

    S_hat  = (m - |G_B|^2) / (h - 1/B)        G2_hat = |G_B|^2 - S_hat / B

(h - 1/B > 0 whenever k >= 2: an update of one micro-batch has no estimate.)

What a micro-batch's size is depends on the loss (objective.py): with one normaliser, its count (examples for
a per-example loss, valid tokens for a masked one), g_i the gradient of the micro-batch's own sum over its own
count. With several (a masked output beside an unmasked one, say) a micro-batch has no one count: its size is
its examples, and g_i the gradient of its own examples' share of the update's loss, each normaliser's sum over
its count per example in the update (D_g / B), so that G_B, their mean, is the update's gradient. The caches
hold each normaliser's gradient separately and those weights are known only after the all-reduce, so each
micro-step adds the inner products of its normalisers' gradients (one, a squared norm, with one normaliser)
over its size squared; ``update_terms`` weighs them once the totals are known.

The accumulator sums these terms in its graph and they ride in the update's one all-reduce (engine.py, with
backends/tensorflow/noise.py); |G_B| is taken from the update's gradient before the weight regularizers (which have no
noise) and clipping. Here, on the host: S_hat and G2_hat each averaged over updates, an exponential average with
NOISE_DECAY (about the last 20 updates count) per update (Adam's bias correction), and their ratio (the ratio of
averages, not an average of ratios: one update's G2_hat is noisy and often negative). Skipped and dropped updates count
nothing. The averages are checkpointed, so a resumed run reads the values an uninterrupted one would.
"""

from __future__ import annotations

import math

import numpy as np

from ..defaults import NOISE_DECAY


def one_update(squares: float, inverses: float, count: float, batch_squared: float, n: float):
    """(S_hat, G2_hat) of one update from its sums (sum |g_i|^2, sum 1/b_i, k) and |G_B|^2 over a batch of size n;
    None when it has no estimate (fewer than two non-empty micro-batches)."""
    if count < 2 or n < 2:
        return None
    m, h = squares / count, inverses / count
    spread = h - 1.0 / n
    if spread <= 0:
        return None
    trace = (m - batch_squared) / spread
    return trace, batch_squared - trace / n


def terms_size(groups: int) -> int:
    """The length of a micro-step's terms: the inner products of ``groups`` normalisers' gradients, then 1/b, 1 and
    b (each backend's noise.py computes them in its graph)."""
    return groups * (groups + 1) // 2 + 3


def update_sums(terms, factors, loss_scale) -> tuple:
    """(sum |g_i|^2, sum 1/b_i, k, B) of an update from its summed ``terms`` (``terms_size``'s layout), in the
    backend's tensors: ``factors`` each normaliser's multiplier of its cache (scale / D_g), ``loss_scale`` what the
    caches were multiplied by. g_i = sum_g weight_g x cache_g / b_i, so |g_i|^2 weighs each pair's inner product."""
    count = len(factors)
    pairs = count * (count + 1) // 2
    inverses, micro_batches, total = terms[pairs], terms[pairs + 1], terms[pairs + 2]
    weights = [f * total / loss_scale for f in factors]
    squares, index = 0.0, 0
    for a in range(count):
        for b in range(a, count):
            squares += (1.0 if a == b else 2.0) * weights[a] * weights[b] * terms[index]
            index += 1
    return squares, inverses, micro_batches, total


class Estimate:
    """The running estimate on the host: exponential averages of S_hat and G2_hat over the updates (each backend's
    NoiseScale keeps them where its checkpoints hold them)."""

    def __init__(self, measured: bool = True):
        self.measured = measured  # False: every update's estimate is left out (None)
        self._host = (0.0, 0.0, 0.0)  # (trace, signal, weight)

    def _state(self) -> tuple:
        return self._host

    def add(self, out: dict) -> float | None:
        """Fold in one update's record (the accumulator's: ``noise``, ``noise_batch``, ``applied``); the noise
        scale after it."""
        if self.measured and "noise" in out and bool(out["applied"]):
            # one copy to the host per vector: iterating a tensor slices it op by op (3 ms an update, profiled)
            squares, inverses, count = np.asarray(out["noise"], np.float64).tolist()
            batch_squared, size = np.asarray(out["noise_batch"], np.float64).tolist()
            estimate = one_update(squares, inverses, count, batch_squared, size)
            if estimate is not None and all(math.isfinite(v) for v in estimate):
                # doubles, as the float64 variables add them: a resumed run reads what an uninterrupted one did
                new = (*estimate, 1.0)
                self._host = tuple(NOISE_DECAY * old + (1 - NOISE_DECAY) * v for old, v in zip(self._state(), new))
        return self.value()

    def averages(self) -> tuple[float, float] | None:
        """(tr(Sigma), |G|^2), bias-corrected; None before any update had an estimate."""
        trace, signal, weight = self._state()
        return None if weight <= 0 else (trace / weight, signal / weight)

    def value(self) -> float | None:
        """B_noise = tr(Sigma) / |G|^2 (examples); None with no estimate yet, or while |G|^2's average is not
        positive (the gradient lost in its noise: the batch that would see it is beyond measuring)."""
        averages = self.averages()
        if averages is None or averages[1] <= 0 or averages[0] < 0:
            return None
        return averages[0] / averages[1]


def grown_batch(noise_scale: float | None, batch_size: int, micro_batch_size: int, max_batch_size: int) -> int:
    """batch_schedule rule noise_scale: the batch from now on. The estimate rounded to whole micro-batches,
    never smaller than the batch in force and at most max_batch_size; the batch in force with no estimate."""
    if noise_scale is None or not math.isfinite(noise_scale):
        return batch_size
    rounded = max(1, round(noise_scale / micro_batch_size)) * micro_batch_size
    return max(batch_size, min(rounded, max_batch_size))


def rule_change(rule, noise_scale: float | None, epochs_done: int, epochs: int, before: int, micro_batch_size: int):
    """batch_schedule's noise-scale ``rule`` at the end of epoch ``epochs_done`` (1-based) of ``epochs``, in both
    doors: (the batch from the next epoch on, the line that says so: the estimate, and the batch from the next epoch
    on), or None where the rule is not due (between its ``every_epochs``, after the last epoch, or no rule)."""
    if rule is None or epochs_done % rule.every_epochs or epochs_done >= epochs:
        return None
    after = grown_batch(noise_scale, before, micro_batch_size, rule.max_batch_size)
    shown = "none yet" if noise_scale is None else f"{noise_scale:.0f} examples"
    if after == before:
        return after, f"noise scale {shown}: batch_size stays {before}"
    return after, f"noise scale {shown}: batch_size {before} -> {after} from epoch {epochs_done + 1}"
