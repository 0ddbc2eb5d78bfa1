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


def grown_batch(noise_scale: float | None, batch_size: int, micro_batch_size: int, max_batch_size: int) -> int:
    """batch_schedule rule noise_scale: the batch from now on. The estimate rounded to whole micro-batches,
    never smaller than the batch in force and at most max_batch_size; the batch in force with no estimate."""
    if noise_scale is None or not math.isfinite(noise_scale):
        return batch_size
    rounded = max(1, round(noise_scale / micro_batch_size)) * micro_batch_size
    return max(batch_size, min(rounded, max_batch_size))


def rule_said(noise_scale: float | None, before: int, after: int, next_epoch: int) -> str:
    """What the rule's change at an epoch's end says, in both doors: the estimate, and the batch from ``next_epoch``
    (1-based) on."""
    shown = "none yet" if noise_scale is None else f"{noise_scale:.0f} examples"
    if after == before:
        return f"noise scale {shown}: batch_size stays {before}"
    return f"noise scale {shown}: batch_size {before} -> {after} from epoch {next_epoch}"


def rule_change(rule, noise_scale: float | None, epochs_done: int, epochs: int, before: int, micro_batch_size: int):
    """batch_schedule's noise-scale ``rule`` at the end of epoch ``epochs_done`` (1-based) of ``epochs``, in both
    doors: (the batch from the next epoch on, the line that says so), or None where the rule is not due (between
    its ``every_epochs``, after the last epoch, or no rule)."""
    if rule is None or epochs_done % rule.every_epochs or epochs_done >= epochs:
        return None
    after = grown_batch(noise_scale, before, micro_batch_size, rule.max_batch_size)
    return after, rule_said(noise_scale, before, after, epochs_done + 1)
