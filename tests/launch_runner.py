"""Runs `accum-train run --workers N` with one worker replaced, for test_distribute.py.

ACCUM_LAUNCH_FAULT=hang   worker 1 never comes up (sleeps)
ACCUM_LAUNCH_FAULT=die:N  worker 1 kills itself (SIGKILL) during its Nth update
ACCUM_LAUNCH_FAULT=peaks  every worker runs with fake memory peaks (peak_runner.py)
ACCUM_LAUNCH_FAULT=oom:N  worker 1 runs out of memory (ResourceExhaustedError) in its Nth update
ACCUM_LAUNCH_FAULT=count  every worker counts graph calls and collectives (count_runner.py)
"""

import os
import sys
from pathlib import Path

import accum_train.from_config.launcher as launcher
from accum_train.cli.main import main

real_command = launcher.worker_command


def worker_command(run_args, index):
    fault = os.environ["ACCUM_LAUNCH_FAULT"]
    runner = {"peaks": "peak_runner.py", "count": "count_runner.py"}.get(fault)
    if runner:
        return [sys.executable, str(Path(__file__).with_name(runner)), "worker", *run_args]
    if index != 1:
        return real_command(run_args, index)
    if fault == "hang":
        return [sys.executable, "-c", "import time; time.sleep(600)"]
    point, count = fault.split(":")
    os.environ["ACCUM_FAULT"] = f"{'update' if point == 'die' else point}:{count}"  # inherited by later workers
    return [sys.executable, str(Path(__file__).with_name("fault_runner.py")), "worker", *run_args]


launcher.worker_command = worker_command
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
