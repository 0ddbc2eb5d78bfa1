"""``python -m accum_train.datasets CONFIG [--task]``: load and check a config's data, print nothing (``--task``:
an .npz's targets are for the model's own loss, not class labels).

Bad data ends as one line ``error: ...`` on stderr and exit code 2. The
``--workers`` supervisor runs this in a child process: checking an image
folder decodes every image with TensorFlow, which the supervisor itself never
loads (on a GPU machine it would take device memory the workers need).
"""

import sys

from ..config import load_config
from ..errors import UserError
from . import load

if __name__ == "__main__":
    try:
        cfg = load_config(sys.argv[1])
        load(cfg.data, task="--task" in sys.argv[2:], seed=cfg.seed)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
