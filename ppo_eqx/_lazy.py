"""The package face, imported on first use: ``ppo_eqx/__init__.py`` lists its re-exports once, in an ``if
TYPE_CHECKING:`` block that type checkers read, and this module reads the same block at run time to import each
name when it is first asked for. So ``import ppo_eqx`` (and ``ppo-eqx --help``, Ctrl-C handling) does not wait
for jax. No jax here."""

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _exports(init_file: str) -> dict[str, tuple[str, str]]:
    """``name -> (relative module, attribute)`` of every ``from .module import attribute as name`` inside the
    ``if TYPE_CHECKING:`` block of ``init_file``."""
    tree = ast.parse(Path(init_file).read_text(), init_file)
    exports = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.level == 1 and statement.module:
                    for alias in statement.names:
                        exports[alias.asname or alias.name] = (f".{statement.module}", alias.name)
    return exports


def attach(package: str, init_file: str) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package``, whose ``__init__.py`` is ``init_file``."""
    exports = _exports(init_file)

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = exports[name]
        return getattr(importlib.import_module(module, package), attribute)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__, sorted(exports)
