"""The objective and its evaluation: a loss as a sum and a count per normaliser, so that micro-batches add up to
their batch (objective), a compiled Keras loss taken apart the same way (keras_objective), and the one evaluation
path with its scores (scoring)."""
