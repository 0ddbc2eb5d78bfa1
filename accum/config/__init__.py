"""The config: parsed and validated once, its defaults those of accum/defaults.py (``CLI``).

A YAML file lists only what differs from the defaults. ``load_config``
reads it with PyYAML's SafeLoader (data only: no tags, no eval, no imports; a key given twice is an error),
applies ``--set key=value`` overrides, checks every key and value against the
dataclasses here, and returns a frozen ``Config``. Nothing else in the project
reads raw dicts. Each error names the key, the value and what is allowed, in
one line, and says where the value came from (the file or ``--set``).
"""

from ..errors import ConfigError
from .parse import as_config, config_from_dict, load_config, load_run_config, override_key, with_overrides
from .schema import Config
from .sections import (
    DATASET_NAMES,
    MODEL_NAMES,
    NORM_NAMES,
    OPTIMIZER_NAMES,
    SCHEDULE_NAMES,
    SEED_CHANNELS,
    AugmentConfig,
    BatchChange,
    BatchRule,
    DataConfig,
    LossScaleConfig,
    ModelConfig,
    OptimizerConfig,
    ScheduleConfig,
)
from .wording import parse_size

__all__ = [
    "DATASET_NAMES",
    "MODEL_NAMES",
    "NORM_NAMES",
    "OPTIMIZER_NAMES",
    "SCHEDULE_NAMES",
    "SEED_CHANNELS",
    "AugmentConfig",
    "BatchChange",
    "BatchRule",
    "Config",
    "ConfigError",
    "DataConfig",
    "LossScaleConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ScheduleConfig",
    "as_config",
    "config_from_dict",
    "load_config",
    "load_run_config",
    "override_key",
    "parse_size",
    "with_overrides",
]
