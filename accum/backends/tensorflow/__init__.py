"""The TensorFlow backend: what speaks TensorFlow to run an update. ``backend`` answers the seam's calls
(accum/backends/__init__.py); the accumulator (``engine``, set up in ``engine_for``), its end (``finish``: the one
all-reduce; ``update``: the apply or skip, loss scale, skip counters), its ``gradient_cache`` and ``graphs`` run the
update; ``distribute`` answers what the trainer asks of a strategy. Nothing is imported here: the trainer's pieces
that still use the caches' variables (objective.py, scoring.py) import ``gradient_cache`` without the engine."""
