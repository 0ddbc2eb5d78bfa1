"""Datasets, by the name a config gives in ``data.name``.

Each loader takes the validated DataConfig and returns a verified
``base.Dataset`` (two splits, input shape, class names); ``load`` then applies
data.train_limit and data.test_limit. Turning a split into batches is the
split's own job (``batches``), in the order the training loop gives.
"""

from ..config import DATASET_NAMES
from . import fashion_mnist, image_folder, npz

LOADERS = {
    "fashion_mnist": lambda cfg, run_dir: fashion_mnist.load(cfg.dir),
    "npz": lambda cfg, run_dir: npz.load(cfg),
    "image_folder": image_folder.load,
}

if tuple(LOADERS) != DATASET_NAMES:  # a registry out of step with the config is a bug
    raise ImportError(f"dataset registry {tuple(LOADERS)} != config.DATASET_NAMES {DATASET_NAMES}")


def load(data_config, run_dir=None):
    """Load the dataset a validated DataConfig names: limited, then the validation split held out.

    ``run_dir``: the run this data is for, if it exists (a resume, evaluate): an
    image folder's check reads what the run remembers of its files."""
    dataset = LOADERS[data_config.name](data_config, run_dir).limited(data_config.train_limit, data_config.test_limit)
    return dataset.with_validation(data_config.validation)
