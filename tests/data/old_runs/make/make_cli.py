"""Leave an interrupted CLI run directory, as a user's Ctrl-C does: ``accum-train run`` of the release on
PYTHONPATH, with SIGINT sent to the process when the loop makes its ``STOP_AT_REPORT``-th progress report (5:
update 13 of 20 with cli.yaml's log_every 3). The release's own handler finishes the update in hand, checkpoints
and exits 130.

    PYTHONPATH=/tmp/oldroot-0.1.0 python make_cli.py run cli.yaml --output-dir ../cli-0.1.0 --quiet
"""

import os
import signal
import sys

import accum_train
from accum_train.cli import main as cli

STOP_AT_REPORT = int(os.environ.get("STOP_AT_REPORT", "5"))
reports = [0]
plain_updates = cli.BarProgress.updates


def updates(self, micro_done, loss, examples_per_s):
    plain_updates(self, micro_done, loss, examples_per_s)
    reports[0] += 1
    if reports[0] == STOP_AT_REPORT:
        os.kill(os.getpid(), signal.SIGINT)


cli.BarProgress.updates = updates
print(f"accum_train {accum_train.__version__} from {accum_train.__file__}")
sys.argv[0] = "accum-train"
cli.main()
