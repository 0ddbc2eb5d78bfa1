"""trim_padding's check on JAX (the policy and the verdict: trainer/data/lengths.py; the cut: feed.py): cutting the
padding must change nothing an update computes. The first batch's shortest sequences, as many as a micro-batch holds,
are measured whole and cut right after their longest (no padding left there, the strictest cut), in inference mode:
the normalisers, the loss sums, every gradient and the compiled metrics, as the TensorFlow backend's check_trim
measures them (the metrics too here: Keras' JAX trainer hands them the outputs without their mask, so an unweighted
metric of a per-step output counts the padding that the cut takes away)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...errors import Refused
from ...trainer.data.lengths import differ, judge_trim, sequence_lengths
from .engine import stacked
from .feed import rows, trimmed


def check_trim(objective, first_batch, micro: int, where: str) -> None:
    """Refuse trim_padding where it changes the update of ``objective`` (objective.py's, with its ``steps``):
    ``first_batch`` (x, y, sample_weight or None) as the feed gives it uncut, ``micro`` the examples of its
    micro-batches."""
    first_batch = (*first_batch, None)[:3]  # arrays' (x, y) as (x, y, None)
    given = tuple(part for part in first_batch if part is not None)
    lengths, timed = sequence_lengths(given, where)
    timed = (*timed, None)[:3]
    shortest = np.argsort(lengths, kind="stable")[: max(1, micro)]
    whole = rows(first_batch, shortest)
    length = max(int(lengths[shortest].max(initial=0)), 1)
    cut = trimmed(whole, timed, length)
    if length == objective.steps:
        return  # nothing cut here: nothing to compare
    model = objective.model
    trainable = [v.value for v in model.trainable_variables]
    held = (
        [v.value for v in model.non_trainable_variables],
        [jnp.zeros_like(v.value) for v in objective.metric_variables],  # from zero: this batch's contribution
        objective.norms.zeros(),
    )

    def measure(batch):
        def total(values):
            sums, counts, moved, _ = objective.parts(values, held, *batch, training=False)
            return jnp.sum(sums), (sums, counts, moved[1])

        (_, (sums, counts, metrics)), grads = jax.value_and_grad(total, has_aux=True)(trainable)
        return sums, counts, metrics, grads

    (sums, counts, metrics, grads), (cut_sums, cut_counts, cut_metrics, cut_grads) = (
        measure(jax.tree.map(lambda a: a[0], stacked([batch]))) for batch in (whole, cut)
    )
    named = [
        ("the number of values the loss averages", counts, cut_counts, 0.0),
        ("the loss summed", sums, cut_sums, 0.0),
    ]
    largest = max((float(np.max(np.abs(g), initial=0.0)) for g in grads), default=0.0)  # as TensorFlow's check
    variables = model.trainable_variables
    named += [(f"the gradient of {v.path}", g, c, 1e-3 * largest) for v, g, c in zip(variables, grads, cut_grads)]
    for variable, whole_value, cut_value in zip(objective.metric_variables, metrics, cut_metrics):
        if differ(whole_value, cut_value):
            metric = variable.path.split("/")[0]
            raise Refused(
                "trim-metrics-jax",
                f"{where}: trim_padding changes the compiled metric {metric!r} of model {model.name!r} on Keras' JAX "
                f"backend, whose trainer gives metrics the outputs without their mask, so that they count the padding "
                f"steps the cut takes away: weigh the padding 0 (sample_weight, and the metric in weighted_metrics), "
                f"or leave trim_padding out",
            )
    divisor = objective.steps is None and differ(counts, cut_counts)
    judge_trim(named, divisor, model.name, objective.steps or whole[0].shape[1], length, where)
