"""Your Python functions named in a config: ``package.module:function`` or ``/path/to/file.py:function``.

A data factory (``data.factory``) and a loss or metric given as a function (``loss: my_losses:huber``) are
imported here, every failure as one line that names the key, what was looked for and where."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from .errors import UserError
from .text import first_line


def import_function(spec: str, key: str, error: type[UserError] = UserError, also: str = ""):
    """The function ``spec`` names (a module found from the working directory or installed, or a file);
    ``also``: where else the module name was looked for, as the error says it (e.g. " and the config file's
    folder")."""
    module_name, _, name = spec.rpartition(":")
    is_file = module_name.endswith(".py")
    try:
        if is_file:
            module = _import_file(Path(module_name))
        else:
            if str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_name)
    except Exception as err:
        looked = (
            module_name
            if is_file
            else f"{module_name.replace('.', '/')}.py in {Path.cwd()}{also}, and among the installed packages"
        )
        raise error(
            f"{key}={spec!r}: cannot import {Path(module_name).name if is_file else module_name} "
            f"({type(err).__name__}: {first_line(err)}); looked for {looked}"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        functions = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise error(
            f"{key}={spec!r}: {Path(module_name).stem if is_file else module_name} has no function {name!r} (it "
            f"has {', '.join(functions) or 'none'})"
        )
    return function


def _import_file(path: Path):
    """The module of the file ``path``, in sys.modules as an import would put it: AutoGraph looks a function's
    module up there to convert it (a tf.data map's Python ``if`` on a tensor), and fails without it. Under its own
    name, so that it shadows no module of the same name (a ``json.py`` of yours is not ``json``). Its folder is
    searched for the modules it imports, as a script's is, from any working directory (a resume's), after every
    other place (so that it shadows nothing either)."""
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)
    name = f"accum_train_file_{path.stem}"
    found = importlib.util.spec_from_file_location(name, path)
    if found is None:
        raise ImportError(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module
    try:
        found.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
