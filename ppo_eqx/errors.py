"""Every error type of ppo_eqx, each with its one-line message, in one jax-free module that all others import.

The command line (``ppo_eqx.cli``) maps them to exit statuses: ``ConfigError``, ``RunDirError`` and
``UsageError`` are bad input (2), ``RunError`` a run that cannot go on (1).
"""

MAX_SHOWN = 60
"""Characters of a value's repr that a message shows; longer ones are cut, so that a message is one line."""


def show_value(value: object) -> str:
    """``repr(value)``, cut to ``MAX_SHOWN`` characters; repr keeps newlines out."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's limit on digits
        text = f"<int of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


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
