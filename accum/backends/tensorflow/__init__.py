"""The TensorFlow backend: what speaks TensorFlow to run an update. ``backend`` answers the seam's calls
(accum/backends/__init__.py); the accumulator (``engine``), its end (``update``: the one all-reduce, the apply or skip,
loss scale, skip counters), its ``gradient_cache`` and ``graphs`` run the update on the objective's sums
(``objective``, ``keras_objective``), with the noise terms (``noise``); ``scoring`` evaluates, ``checkpoints`` saves
and restores, ``distribute`` answers what the trainer asks of a strategy; ``builtin`` holds the CLI's TensorLayer
nets. Nothing is imported here."""
