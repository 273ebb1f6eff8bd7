"""Code of the user's that a config names as ``MODULE:ATTRIBUTE`` (an env maker, a backend, a loss): imported when
the run starts, every failure one line naming the field and what went wrong."""

import importlib
import os
import sys
from typing import Any

from ..errors import ConfigError
from ..settings import is_import_path


def first_line(error: BaseException) -> str:
    """An exception raised by the user's code, in one line: its type and its message's first line."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def import_object(path: str, what: str) -> Any:
    """The object ``MODULE:ATTRIBUTE`` names, imported (from ``sys.path``, then the working directory); ConfigError
    naming ``what`` (a flag or field) for anything that goes wrong."""
    if not isinstance(path, str) or not is_import_path(path):
        raise ConfigError(f"{what}={path!r} is not MODULE:ATTRIBUTE; allowed: e.g. mypkg.envs:make_env")
    module_name, _, attribute = path.partition(":")
    try:
        module = _import(module_name)
    except ModuleNotFoundError as error:
        raise ConfigError(f"{what}={path!r}: no module named {error.name!r}; allowed: an importable module") from None
    except Exception as error:  # the user's module, run on import
        raise ConfigError(f"{what}={path!r}: importing {module_name} raised {first_line(error)}") from None
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"{what}={path!r}: {module_name} has no {attribute!r}; allowed: a name it defines")
        found = getattr(found, part)
    return found


def _import(module_name: str) -> Any:
    """``module_name``, from ``sys.path`` or else from the working directory (as ``python -m`` would find it)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        here = os.getcwd()
        if error.name is None or not module_name.startswith(error.name) or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(module_name)
