"""A stop request from a signal: SIGINT or SIGTERM asks a loop to stop after the update in hand.

The loop reads ``signum`` after each update (under several processes it rides
in the next update's all-reduce, so that every process stops after the same
update), checkpoints and stops. A second signal means it: ``forced(signum)``
is raised at once. Only the main thread can install signal handlers; elsewhere
the flag stays 0 and Python's own handling applies. A signal the process
ignores as it enters (``python train.py &`` ignores SIGINT) stays ignored.
"""

from __future__ import annotations

import signal
import threading

from ...processes import STOP_SIGNALS


class StopFlag:
    """SIGINT/SIGTERM set a flag: the loop finishes the update in hand, checkpoints, stops. Under several
    processes the flag goes into the next update's all-reduce, and every process stops after that same
    update. A second signal means it: ``forced(signum)`` is raised at once."""

    def __init__(self, forced):
        self.signum = 0
        self.forced = forced
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                # a signal the process was started ignoring stays ignored (a background job's Ctrl-C is the shell's)
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum:
            raise self.forced(signum)
        self.signum = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
