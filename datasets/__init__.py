"""Datasets, by the name a config gives in ``data.name``.

Each loader returns uint8 images and labels, already verified; turning them
into batches is the training loop's job (accum_train.train).
"""

from ..config import DATASET_NAMES
from . import fashion_mnist

LOADERS = {"fashion_mnist": fashion_mnist.load}

if tuple(LOADERS) != DATASET_NAMES:  # a registry out of step with the config is a bug
    raise ImportError(f"dataset registry {tuple(LOADERS)} != config.DATASET_NAMES {DATASET_NAMES}")


def load(data_config):
    """Load the dataset a validated DataConfig names."""
    return LOADERS[data_config.name](data_config.dir, data_config.train_limit, data_config.test_limit)
