"""Errors that are the user's to fix.

Everything raised as a UserError carries a one-line message that names what is
wrong and how to fix it. The CLI prints it as ``error: <message>`` and exits
with code 2; any other exception is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input: a config, a data file, a path. Exit code 2, no traceback."""


class ConfigError(UserError):
    """A config key has a value that is not allowed."""


class DataError(UserError):
    """A data file is missing, unreadable or not what it should be."""


class RunDirError(UserError):
    """An output or resume directory cannot be used."""


class OutOfMemory(Exception):
    """A run needed more memory than it has (or than memory_limit allows).

    Not a UserError: the config is valid, the device is too small for it. The
    CLI prints one line and exits with code 3, so that `compare` can tell it
    apart from bad input.
    """


class TrainingStopped(Exception):
    """Training cannot usefully go on (e.g. the loss keeps being non-finite).

    The last good state has been checkpointed; the CLI prints one line, exit 1.
    """
