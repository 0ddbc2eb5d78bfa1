"""How the core makes its TensorFlow graphs: a function traced as written, as one graph (``graph``), and a loop
over a tensor count whose steps run one after another inside it (``in_turn``); the accumulator (engine.py) and
the evaluation (scoring.py) build theirs with them."""

from __future__ import annotations

import tensorflow as tf


def graph(function, **options):
    """``function`` as one TensorFlow graph, traced as written: its Python control flow runs once, while tracing
    (autograph would convert every function the micro-step calls, the model's layers included, at a cost of
    seconds per trace), and its loops over tensors are ``in_turn``'s or the carried ``tf.while_loop``."""
    return tf.function(function, autograph=False, **options)


def in_turn(k, step) -> None:
    """``step(i)`` for i = 0 .. k-1 (``k`` a tensor), one after another, inside the graph; what ``step`` does
    to variables is all it leaves."""

    def body(i):
        step(i)
        return [i + 1]  # the loop variables' structure: run eagerly (run_eagerly=True), a bare tensor is refused

    tf.while_loop(lambda i: i < k, body, [tf.constant(0)], parallel_iterations=1)
