"""When a run writes a checkpoint and when it stops: a pure policy of the iteration just finished, the config's
interval and length, and a stop request (``Supervisor`` asks it after every iteration)."""


def is_boundary(iteration: int, *, checkpoint_every: int, num_iterations: int) -> bool:
    """Whether ``iteration`` ends a segment: a multiple of ``checkpoint_every``, or the run's last."""
    return iteration % checkpoint_every == 0 or iteration == num_iterations


def checkpoint_reason(
    iteration: int, *, checkpoint_every: int, num_iterations: int, stop: str | None, current: bool
) -> str | None:
    """Why a checkpoint is written after ``iteration``: "periodic" at a segment's end (``is_boundary``), the stop's
    reason (a signal's name, "stop") when one was requested, else None. Never when the trainer's state is not that
    iteration's (``current`` False: a program dispatched after it is under way; its own records come next)."""
    if not current:
        return None
    if is_boundary(iteration, checkpoint_every=checkpoint_every, num_iterations=num_iterations):
        return "periodic"
    return stop


def stops_after(*, stop: str | None, current: bool) -> bool:
    """Whether the loop ends after this iteration: a stop was requested and the state is that iteration's."""
    return current and stop is not None
