"""Every error type of ppo_eqx, each with its one-line message, in one jax-free module that all others import.

The command line (``ppo_eqx.cli``) maps them to exit statuses: ``ConfigError``, ``RunDirError`` and
``UsageError`` are bad input (2), ``RunError`` a run that cannot go on (1).
"""

import os
import traceback
from pathlib import Path

MAX_SHOWN = 60
"""Characters of a value's repr that a message shows; longer ones are cut, so that a message is one line."""


def show_value(value: object) -> str:
    """``repr(value)``, cut to ``MAX_SHOWN`` characters; repr keeps newlines out."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's limit on digits
        text = f"<int of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    except Exception:  # noqa: BLE001 - a user's object whose __repr__ raises
        text = f"<{type(value).__name__}>"
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


MAX_MESSAGE = 200
"""Characters of an exception's message that a line shows; a longer message is cut."""


def first_line(error: BaseException) -> str:
    """An exception (one raised by the user's code, mostly) in one line: its type and its message's first line, cut
    to ``MAX_MESSAGE`` characters; the type alone where the message is empty or cannot be made (its ``__str__``
    raises)."""
    text = _message(error).strip().splitlines()
    if not text:
        return type(error).__name__
    shown = text[0] if len(text[0]) <= MAX_MESSAGE else text[0][: MAX_MESSAGE - 3] + "..."
    return f"{type(error).__name__}: {shown}"


def _message(error: BaseException) -> str:
    """``str(error)``, or empty where the user's exception cannot make its message (its ``__str__`` raises)."""
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - a message that cannot be made is no message
        return ""


_NOT_THE_USERS = (str(Path(__file__).resolve().parent), str(Path(os.__file__).resolve().parent))
"""ppo_eqx's own files and the standard library's: a user's error is placed at the last frame outside them and
outside installed packages (jax, equinox, numpy)."""


def user_frame(error: BaseException) -> str:
    """Where in the user's code ``error`` was raised: ``file:line`` of its traceback's last frame that is neither
    ppo_eqx's, the standard library's nor an installed package's; empty where it has none (a call that never entered
    the user's code, or code installed as a package)."""
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        path = str(Path(frame.filename).resolve())
        if path.startswith(_NOT_THE_USERS) or "site-packages" in path or "dist-packages" in path:
            continue
        return f"{frame.filename}:{frame.lineno}"
    return ""


def callback_fault(error: BaseException) -> str | None:
    """What the user's code raised inside a host callback of a compiled program (an env's step that calls back to
    Python), read from the error XLA raises for it ("CpuCallback error ... Traceback ..."): ``raised TYPE: message
    (file:line)`` at its last frame in the user's file; None for any other error."""
    text = _message(error)
    if "CpuCallback error" not in text and "Traceback (most recent call last)" not in text:
        return None
    lines = text.splitlines()
    at = max((i for i, line in enumerate(lines) if line.strip().startswith('File "')), default=-1)
    where = ""
    for frame in reversed([line.strip() for line in lines[: at + 1] if line.strip().startswith('File "')]):
        path = frame.split('"')[1]
        resolved = str(Path(path).resolve())
        if not (resolved.startswith(_NOT_THE_USERS) or "site-packages" in resolved or "dist-packages" in resolved):
            where = f"{path}:{frame.split('line ')[-1].split(',')[0]}"
            break
    # after the last frame: its source line and markers (indented), then "TYPE: message" (not indented)
    said = next((line.strip() for line in lines[at + 1 :] if line.strip() and not line[:1].isspace()), "")
    said = said.rstrip(":") if len(said) <= MAX_MESSAGE else said[: MAX_MESSAGE - 3] + "..."
    return f"raised {said or 'an exception'}" + (f" ({where})" if where else "")


def raised(error: BaseException) -> str:
    """What the user's code did, in words: ``called sys.exit(3)``, or ``raised TYPE: message``, and where."""
    fault = callback_fault(error)
    if fault is not None:  # raised in a host callback of the user's, inside a compiled program
        return fault
    exited = isinstance(error, SystemExit)
    done = f"called sys.exit({show_value(error.code)})" if exited else f"raised {first_line(error)}"
    where = user_frame(error)
    return f"{done} ({where})" if where else done


class ConfigError(ValueError):
    """An impossible or unknown setting; the message names the value and what is allowed."""


class RunDirError(ValueError):
    """A run directory that is refused (exists, unwritable, a file) or damaged; the message is one line."""


CheckpointError = RunDirError
"""A checkpoint that is missing, unreadable, damaged or from another run: the run directory's one error type."""


class UsageError(Exception):
    """Bad input on the command line; printed as one line, exit status 2."""


class RunError(Exception):
    """A run that cannot go on (a full disk, a second Ctrl-C); printed as one line, exit status 1."""


class NonFiniteError(FloatingPointError):
    """The loss or the parameters became NaN or inf; ``record`` is the iteration's metrics (of the first agent
    that went wrong), ``records`` those of every agent."""

    def __init__(self, message: str, record: dict, records: list[dict] | None = None):
        super().__init__(message)
        self.record = record
        self.records = [record] if records is None else records
