"""Datasets, by the name a config gives in ``data.name``.

Each loader takes the validated DataConfig and returns a verified
``base.Dataset`` (two splits, input shape, class names); ``load`` then applies
data.train_limit and data.test_limit. Turning a split into batches is the
split's own job (``batches``), in the order the training loop gives.
"""

from ..config import DATASET_NAMES
from . import fashion_mnist, image_folder, npz, python

# (data config, run directory, whether a Keras loss takes the targets as given, the run's seed) -> Dataset
LOADERS = {
    "fashion_mnist": lambda cfg, run_dir, task, seed: fashion_mnist.load(cfg.dir),
    "npz": lambda cfg, run_dir, task, seed: npz.load(cfg, task),
    "image_folder": lambda cfg, run_dir, task, seed: image_folder.load(cfg, run_dir),
    "python": lambda cfg, run_dir, task, seed: python.load(cfg, seed),
}

if tuple(LOADERS) != DATASET_NAMES:  # a registry out of step with the config is a bug
    raise ImportError(f"dataset registry {tuple(LOADERS)} != config.DATASET_NAMES {DATASET_NAMES}")


def load(data_config, run_dir=None, task: bool = False, seed: int = 0):
    """Load the dataset a validated DataConfig names: limited, then the validation split held out.

    ``run_dir``: the run this data is for, if it exists (a resume, evaluate): an
    image folder's check reads what the run remembers of its files. ``task``: the model trains with a Keras loss
    (an .npz's targets are then taken as the loss takes them, not as class labels). ``seed``: the run's, which a
    python factory is called with."""
    loaded = LOADERS[data_config.name](data_config, run_dir, task, seed)
    dataset = loaded.limited(data_config.train_limit, data_config.test_limit)
    return dataset.with_validation(data_config.validation)
