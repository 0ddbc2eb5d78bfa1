"""The one trainer behind both doors (the CLI's config and ``accum_train.fit``): the accumulator (the active
backend's, accum/backends/), the loop (loop.py), the feed (feed.py), the run's state (checkpoints, metrics log,
lock) and what a run is laid out as (timeline, optimizer schedule, noise scale, memory guard). It never reads a YAML
config's model keys or imports a front end: each door hands it data, a model with its objective, and settings.
"""
