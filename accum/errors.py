"""The exceptions a run ends with, each with its exit code.

Every one carries a one-line message and its ``exit_code``, the one place
the codes are set: UserError 2 (bad input: names what is wrong and how to fix
it), OutOfMemory 3, TrainingStopped (and WorkerFailed) 1, Interrupted 128 +
the signal's number. ``outcome.ending`` turns them into that code and one
line, for the CLI and the core's own children alike; ``compare`` reads a
child's code the same way. Any other exception is a bug and keeps its
traceback.
"""

import signal


class UserError(Exception):
    """Bad input: a config, a data file, a path. Exit code 2, no traceback."""

    exit_code = 2


class Refused(UserError):
    """Something ``model.fit`` (or a config) could ask for that accum-train does not do, named by ``key``.

    Every key has its row in docs/limitations.md, and a test holds the two lists equal: a refusal added here
    without a line there (or the other way round) fails it."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


class ConfigError(UserError):
    """A config key has a value that is not allowed."""


class DataError(UserError):
    """A data file is missing, unreadable or not what it should be."""


class RunDirError(UserError):
    """An output or resume directory cannot be used."""


# How an OutOfMemory ends a process's stderr (outcome.py writes it; the launcher reads a worker's).
OUT_OF_MEMORY_LINE = "error: out of memory: "


class OutOfMemory(Exception):
    """A run needed more memory than it has (or than memory_limit allows).

    Not a UserError: the config is valid, the device is too small for it. The
    CLI prints one line and exits with code 3, so that `compare` can tell it
    apart from bad input.
    """

    exit_code = 3


class TrainingStopped(Exception):
    """Training cannot usefully go on (e.g. the loss keeps being non-finite).

    The last good state has been checkpointed; the CLI prints one line, exit 1.
    """

    exit_code = 1


def too_many_bad_updates(bad: int, max_bad_steps: int, step: int, fix: str, resume: str) -> TrainingStopped:
    """The stop at the update that makes ``max_bad_steps`` non-finite updates in a row, for both doors: ``fix``
    names their knobs of the learning rate and clipping, ``resume`` how to go on (empty: nothing was kept)."""
    if resume:
        kept = f"weights are checkpointed as of the last good update: {fix}, then {resume}"
    else:
        kept = f"the weights are those of the last good update: {fix}"
    return TrainingStopped(
        f"{bad} updates in a row had a non-finite loss or gradient (max_bad_steps={max_bad_steps}), the last at "
        f"update {step}; {kept}"
    )


class WorkerFailed(TrainingStopped):
    """A process the run depends on (a worker, a compare side, a bench worker) failed; exit 1, or the code of a
    worker that a signal stopped (130, 143)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class WorkersInterrupted(Exception):
    """A signal stopped every worker of a ``--workers`` run: the chief's own line, its resume command with as many
    workers; exit 128 + the signal's number, as one process's Interrupted."""

    def __init__(self, line: str, exit_code: int):
        super().__init__(line)
        self.exit_code = exit_code


class Interrupted(KeyboardInterrupt):
    """A signal stopped the run; exit 128 + the signal's number.

    After one signal the update in hand finished and a checkpoint of ``step``
    was written. A second signal stops at once (``forced``): ``step`` is then
    the last checkpoint, which is intact. A KeyboardInterrupt, as Ctrl-C is
    without a run directory: a script's ``except KeyboardInterrupt`` catches
    it, and an ``except Exception`` does not swallow it."""

    def __init__(self, signum: int, run_dir, step: int, forced: bool = False, resume: str = ""):
        self.signum, self.run_dir, self.step, self.forced = signum, run_dir, step, forced
        self.exit_code = 128 + signum
        # one line, as every error of the tool: what a script that does not catch it prints last
        super().__init__(f"{self.how}; to go on, {resume}" if resume else self.how)

    @property
    def how(self) -> str:
        """How the run stopped and what its newest checkpoint holds."""
        name = signal.Signals(self.signum).name
        if self.forced:
            return f"stopped at once by a second {name}; the last checkpoint (update {self.step}) is intact"
        return f"stopped by {name} after update {self.step}; checkpoint saved"
