"""The gradient noise scale's terms on JAX (the estimate: accum/trainer/noise.py; the TensorFlow backend's twin:
backends/tensorflow/noise.py): each micro-step's inner products of its normalisers' gradients over its size squared,
then 1/b, 1 and b, summed over the update's micro-steps (and devices, in its one psum); once per update, the record
``noise`` [sum |g_i|^2, sum 1/b_i, k] and ``noise_batch`` [|G_B|^2, B] the host's Estimate folds in."""

from __future__ import annotations

import jax.numpy as jnp

from ...trainer.noise import update_sums


def micro_terms(gradients: list, size):
    """One micro-batch's terms: ``gradients`` one list per normaliser group, ``size`` its b_i; zeros when empty."""
    products = []
    for a, first in enumerate(gradients):
        for second in gradients[a:]:
            products.append(sum(jnp.vdot(u, v).astype("float32") for u, v in zip(first, second)))
    b = jnp.maximum(size, 1.0)
    there = (size > 0).astype("float32")
    return jnp.concatenate([jnp.stack(products) / (b * b), jnp.stack([1.0 / b, 1.0, b])]) * there


def update_terms(terms, factors, loss_scale, gradient) -> dict:
    """An update's record from its summed ``terms``. ``factors``: each group's multiplier of its cache;
    ``loss_scale``: what the caches were multiplied by; ``gradient``: the update's gradient, G_B times the scale."""
    squares, inverses, micro_batches, total = update_sums(terms, factors, loss_scale)
    batch = sum(jnp.vdot(g, g).astype("float32") for g in gradient) / jnp.square(loss_scale)
    return {"noise": jnp.stack([squares, inverses, micro_batches]), "noise_batch": jnp.stack([batch, total])}
