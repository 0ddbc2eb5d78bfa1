"""The built-in loss: the per-example cross-entropy of integer class labels against logits, what the built-in
nets (and a keras_file without a loss of its own) train and are evaluated with. A keras_file's own loss is
keras_loss.py's."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


def cross_entropy(labels, logits):
    """Per-example cross-entropy of integer labels against logits: what every update and evaluation uses."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.int32), logits=logits)


def sparse_softmax_loss(forward: Callable, training: bool = True) -> Callable:
    """``loss_fn(x, y)``: the per-example cross-entropy of ``forward``'s logits (in training mode by default)."""

    def loss_fn(x, y):
        return cross_entropy(y, forward(x, training))

    return loss_fn
