"""The CLI's front end: a YAML config (``accum_train.config``) turned into what the trainer takes. source.py
decides where the config and the model come from, build.py loads the data and builds the model with its
objective, lifecycle.py runs it into a run directory, launcher.py over ``--workers`` local processes.
"""
