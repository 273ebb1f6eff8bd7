"""``own_jit``: a program compiled for one segment of a run (or one evaluation), whose compiled code dies with it.

``eqx.filter_jit`` keeps a ``jax.jit`` per function name for the life of the process and hands it the function as
a static argument, which jax's caches keep strongly, with everything its closure holds (a pool of envs, the
collector). A process that built many trainers (a notebook, the test suite) kept every program it ever compiled,
a few hundred memory maps each, until it ran out of them (``vm.max_map_count``, 65,530 by default) and aborted
inside XLA's next compile; and no pool of envs was ever freed. ``own_jit`` splits the arguments once, as
``eqx.filter_jit`` does, but jits a function of the arrays alone that is its own: jax's caches hold it weakly,
and everything it compiled is freed with the returned callable.

A program compiled against an EnvPool pool holds the pool's address (EnvPool's XLA call takes it as a constant):
whoever frees the pool waits for that program's last dispatch first (``Trainer``).
"""

import warnings
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax

DONATION_UNUSED = "Some donated buffers were not usable"
"""jax's warning when a donated input has no output of its shape to reuse: harmless (equinox hides it too)."""
Donate = Literal["all", "all-except-first", "none"] | tuple[int, ...]
"""Which positional arguments' arrays a program may reuse: as ``eqx.filter_jit`` says it, or their positions."""


class OwnJit:
    """``fn`` jitted over its positional arguments' arrays; their other leaves and structure are fixed by the first
    call and closed over. ``donate``: which arguments' arrays the program may reuse, as ``eqx.filter_jit`` says it.
    Traced at most ``max_traces`` times: a changed shape or dtype raises RuntimeError instead of recompiling
    silently."""

    def __init__(self, fn: Callable[..., Any], *, donate: Donate = "none", max_traces: int = 1):
        self._name = getattr(fn, "__name__", "program")
        self._fn, self._donate, self._max_traces = fn, donate, max_traces
        self._box: dict[str, Any] = {"traces": 0}
        self._jit: Any = None
        self._called = False

    def _make(self, count: int) -> Any:
        box, fn, name, max_traces = self._box, self._fn, self._name, self._max_traces

        def arrays_only(*dynamic: Any) -> Any:
            box["traces"] += 1
            if box["traces"] > max_traces:
                raise RuntimeError(f"{name} was traced {box['traces']} times, at most {max_traces}: a shape changed")
            out = fn(*eqx.combine(dynamic, box["static"]))
            arrays, box["out"] = eqx.partition(out, eqx.is_array)
            return arrays

        arrays_only.__name__ = arrays_only.__qualname__ = name
        if isinstance(self._donate, tuple):
            return jax.jit(arrays_only, donate_argnums=self._donate)
        first = {"all": 0, "all-except-first": 1, "none": count}[self._donate]
        return jax.jit(arrays_only, donate_argnums=tuple(range(first, count)))

    def _split(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        dynamic, static = eqx.partition(args, _is_dynamic)
        fixed = self._box.setdefault("static", static)
        if fixed is not static and not same_static(fixed, static):
            raise RuntimeError(f"{self._name} was called with other non-array arguments than at first")
        if self._jit is None:
            self._jit = self._make(len(args))
        return dynamic

    def __call__(self, *args: Any) -> Any:
        dynamic = self._split(args)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=DONATION_UNUSED)
            arrays = self._jit(*dynamic)
        self._called = True
        return eqx.combine(arrays, self._box["out"])

    def compile(self, *args: Any) -> None:
        """Compile the program for arguments like these (arrays, or ``jax.ShapeDtypeStruct`` for what is not
        computed yet) ahead of the first call, which then runs it without a trace. Nothing once it has been called:
        its call compiled it (jax's ahead-of-time compile would compile it again, seconds on a TPU), and arguments
        of other shapes would raise at their call."""
        if self._called:
            return
        dynamic = self._split(args)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=DONATION_UNUSED)
            self._jit.lower(*dynamic).compile()


def _is_dynamic(x: Any) -> bool:
    """An array, or the shape and dtype of one (what ``lower`` takes for an argument not computed yet)."""
    return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def same_static(first: Any, now: Any) -> bool:
    """Whether two static parts are the same: one structure, equal non-array leaves."""
    first_leaves, first_tree = jax.tree.flatten(first)
    now_leaves, now_tree = jax.tree.flatten(now)
    return first_tree == now_tree and all(a is b or a == b for a, b in zip(first_leaves, now_leaves, strict=True))


def own_jit(fn: Callable[..., Any], *, donate: Donate = "none", max_traces: int = 1) -> OwnJit:
    """``OwnJit(fn, ...)``: ``fn`` compiled as a program of its own (this module's docstring says why)."""
    return OwnJit(fn, donate=donate, max_traces=max_traces)
