"""The one trainer behind both doors (the CLI's config and ``accum_train.fit``), in rooms by idea: at the top the
run's course (trainer.py's ``Trainer``, the loop, the memory guard, the noise scale, the optimizer registries, the
runtime), and three sub-rooms: data/ (what each update reads), store/ (the run directory) and loss/ (the objective
and its evaluation). The accumulator is the active backend's (accum/backends/). It never reads a YAML config's model
keys or imports a front end: each door hands it data, a model with its objective, and settings.
"""
