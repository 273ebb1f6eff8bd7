"""The bench scripts' command lines: a bad argument is one line on stderr, ``error: ...`` naming the value and
what is allowed, and exit status 2, before anything is read or written. No jax here."""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (argparse's own print the usage first)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {' '.join(message.split())}", file=sys.stderr)
        raise SystemExit(2)


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer ``>= low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:60]!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is out of range; allowed: {low} or more")
        return value

    parse.__name__ = "integer"
    return parse


def existing_path(text: str) -> Path:
    """An argparse type: a path that exists."""
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist")
    return Path(text)


def out_dir_problem(flag: str, path: Path) -> str | None:
    """Why the directory ``path`` cannot be written to (a file, under a file, not creatable), else None; creates
    it (and its parents) when it can."""
    if path.exists() and not path.is_dir():
        return f"{flag} {path} is a file, not a directory"
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            return f"{flag} {path}: {parent} is a file, not a directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"{flag} {path}: {error.strerror or error}"
    return None
