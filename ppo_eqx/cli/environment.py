"""The environment variables that jax and XLA read, checked before anything is written or read as a checkpoint,
each failure one line naming the variable (exit 2). No jax at the top: ``main`` starts the probe before it imports
a command.

``XLA_FLAGS`` is parsed by XLA's C++ when jax makes its first backend, and a bad flag ends the process there
(``abort``, XLA's own lines on stderr): no Python code can catch it. So when ``XLA_FLAGS`` is set, a short child
(``import jax; jax.devices()``, on the CPU backend) makes a backend first (``XlaFlagsProbe``); it runs while this
process imports jax and plans the run, and is waited for before this process makes its own backend. About a
second of CPU, only when ``XLA_FLAGS`` is set and this process has no backend yet.

``JAX_PLATFORMS`` that names a platform this machine lacks makes jax raise on its first backend use (a bare
``AssertionError`` for ``cuda`` without an NVIDIA GPU): ``check_backend`` makes that use, once, and refuses.
"""

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..config import agents_of
from ..errors import UsageError

PROBE_TIMEOUT_S = 120.0
_XLA_LINE = re.compile(r"^([EF])\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] (.*)$")
"""A line that XLA's logging writes: severity, date, time, thread, file:line, message."""


def _backend_started() -> bool:
    """Whether jax has made its backends in this process already (then XLA_FLAGS has been parsed and accepted)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def _refusal(output: str) -> str:
    """What XLA said about XLA_FLAGS: its first error line, else its fatal one, else the last line."""
    found = {}
    for line in output.splitlines():
        match = _XLA_LINE.match(line.strip())
        if match:
            found.setdefault(match.group(1), match.group(2))
    lines = [line for line in output.splitlines() if line.strip()]
    return found.get("E") or found.get("F") or (lines[-1] if lines else "it ended the process")


class XlaFlagsProbe:
    """``XLA_FLAGS`` tried in a child process (started at once; ``check`` waits for it)."""

    def __init__(self) -> None:
        self.flags = os.environ.get("XLA_FLAGS")
        self._child: subprocess.Popen[str] | None = None
        if self.flags and not _backend_started():
            self._child = subprocess.Popen(
                [sys.executable, "-c", "import jax; jax.devices()"],
                env={**os.environ, "JAX_PLATFORMS": "cpu"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )

    def check(self) -> None:
        """UsageError when XLA refused the flags (a probe that does not end in time is not held against them)."""
        child, self._child = self._child, None
        if child is None:
            return
        try:
            _, err = child.communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            return
        if child.returncode != 0:
            raise UsageError(f"XLA_FLAGS={self.flags!r}: XLA refused it: {_refusal(err)}; fix it or unset XLA_FLAGS")

    def close(self) -> None:
        """End the probe if the command ended before it needed the answer."""
        if self._child is not None:
            self._child.kill()
            self._child.communicate()
            self._child = None


def check_backend(probe: XlaFlagsProbe) -> None:
    """Make jax's backends now (after ``probe`` said XLA_FLAGS is good), or UsageError naming JAX_PLATFORMS."""
    probe.check()
    import jax

    try:
        jax.devices()
    except (RuntimeError, AssertionError) as error:
        platforms = os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_PLATFORM_NAME")
        reason = (str(error).splitlines() or [""])[0].split(" (set JAX_PLATFORMS")[0]
        if platforms:
            reason = reason or f"none of {platforms} is usable here (no such device is visible)"
            raise UsageError(
                f"JAX_PLATFORMS={platforms}: jax cannot start a backend: {reason}; unset JAX_PLATFORMS or set it to "
                "a platform this machine has (cpu)"
            ) from None
        raise UsageError(f"jax cannot start a backend: {reason or type(error).__name__}") from None
    use_compilation_cache()


def use_compilation_cache() -> Path | None:
    """On a TPU, jax's persistent compilation cache in ``$PPO_EQX_CACHE/xla`` (default ``~/.cache/ppo_eqx/xla``),
    unless one is set already (``JAX_COMPILATION_CACHE_DIR``); before jax's first compile, which decides whether the
    process uses one. A TPU compiles each program for seconds (a CartPole run's 8.6 s, its initialisation's 5.8 s
    on a TPU v5e): the same command again loads them. Every program is kept, not only those compiled for a second
    or more (jax's default): a run's start compiles a dozen small ones, each a fraction of a second there, which
    summed to seconds of a warm CartPole process on a TPU v5e (docs/performance.md). Returns the directory chosen
    (None: none chosen here)."""
    import jax

    if jax.default_backend() != "tpu" or jax.config.jax_compilation_cache_dir:  # pyright: ignore[reportAttributeAccessIssue]
        return None
    from ..host.kernel_build import cache_root

    path = cache_root() / "xla"
    jax.config.update("jax_compilation_cache_dir", str(path))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # the user's threshold kept
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path


SEQUENTIAL_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
"""XLA:CPU scheduling the ops of a program for sequence rather than concurrency (the same results, bit for bit)."""
SMALL_JAX_ENVS = ("CartPole-v1", "Acrobot-v1")
"""gymnax's vector tasks: their 64-64 MLPs and 4 envs make ops of microseconds."""
SMALL_PROGRAM_AGENTS = 2


def schedule_small_programs(args: Any) -> str | None:
    """For ``ppo-eqx train`` of one or two agents on a gymnax vector task (its whole run compiled as programs of
    microsecond ops), or of one agent on a continuous EnvPool task stepped by a host loop
    (``_host_loop_of_one_policy``), add ``SEQUENTIAL_SCHEDULER`` to ``XLA_FLAGS`` before jax makes its backend;
    returns the ``XLA_FLAGS`` to put back when the command ends (``restore_xla_flags``; None: nothing was changed).

    XLA:CPU's concurrency-optimised scheduler spreads independent ops (the actor's and the critic's) over the
    threads; for ops this small the hand-offs cost more than they overlap, to the same bits. With more agents, or
    MinAtar's 2 x 256 MLPs, the default is faster (the figures: docs/performance.md, "Scheduling small programs").
    A user's own XLA_FLAGS that name the scheduler win; a resumed run (its flags are in its run directory, not here)
    keeps XLA's default.
    """
    flags = os.environ.get("XLA_FLAGS")
    if args.command != "train" or args.resume is not None or _backend_started():
        return None
    agents = agents_of(args.sweep or (), args.num_seeds or 1)
    small = args.env_backend == "gymnax" and args.env_id in SMALL_JAX_ENVS and agents <= SMALL_PROGRAM_AGENTS
    if not (small or (agents == 1 and _host_loop_of_one_policy(args))):
        return None
    if "concurrency_optimized_scheduler" in (flags or ""):
        return None
    os.environ["XLA_FLAGS"] = f"{flags} {SEQUENTIAL_SCHEDULER}" if flags else SEQUENTIAL_SCHEDULER
    return flags or ""


def _host_loop_of_one_policy(args: Any) -> bool:
    """Whether the run is of a continuous task whose rollout is a host loop (``--rollout-on host-envs``, which
    ``auto`` is for such a task where it can run): each step's policy is a program of microsecond ops, half as long
    scheduled for sequence. Asked of host-envs' own check (``check_host_envs``) on the run's config and task, looked
    up here without a jax backend; a bad flag or env id is left for the run's checks to refuse."""
    from ..errors import ConfigError
    from ..host.host_envs import check_host_envs
    from .plan import config_from_args

    try:
        config, env_backend, spec = config_from_args(args)
        if config.rollout_on not in ("auto", "host-envs") or not spec.continuous:
            return False
        check_host_envs(config, env_backend, spec)
    except (ConfigError, UsageError, ImportError):
        return False
    return True


def restore_xla_flags(flags: str | None) -> None:
    """Put back the ``XLA_FLAGS`` that ``schedule_small_programs`` returned ("" : there were none)."""
    if flags is None:
        return
    if flags:
        os.environ["XLA_FLAGS"] = flags
    else:
        os.environ.pop("XLA_FLAGS", None)


RESULT_VARIABLES = (
    "JAX_ENABLE_X64",
    "JAX_DEFAULT_MATMUL_PRECISION",
    "JAX_DEFAULT_PRNG_IMPL",
    "JAX_THREEFRY_PARTITIONABLE",
    "XLA_FLAGS",
)
"""Environment variables that change what a run computes (its dtypes, its products' precision, its random
numbers, XLA's code): recorded in ``hardware.json`` as the run's ``environment``, and a resume under other values
is refused (``host.resume.check_same_environment``)."""
REFUSED_SETTINGS = {
    "jax_debug_nans": (
        "JAX_DEBUG_NANS",
        (True,),
        "stops at the first NaN any computation makes, and ppo-eqx marks 'no episode finished yet' with NaN by "
        "design; unset it (ppo-eqx itself stops at a NaN or infinite loss or parameters, naming the iteration)",
    ),
    "jax_disable_jit": (
        "JAX_DISABLE_JIT",
        (True,),
        "runs every operation alone, and ppo-eqx's iteration is one compiled program (EnvPool's step is an XLA "
        "call inside it); unset it",
    ),
    "jax_numpy_rank_promotion": (
        "JAX_NUMPY_RANK_PROMOTION",
        ("raise",),
        "refuses the broadcasting that ppo-eqx's model and loss use (a bias added to a batch); set it to allow or "
        "warn, or unset it",
    ),
    "jax_numpy_dtype_promotion": (
        "JAX_NUMPY_DTYPE_PROMOTION",
        ("strict",),
        "refuses the promotions that ppo-eqx's arithmetic uses (an int32 step count times a float32 rate); set it "
        "to standard, or unset it",
    ),
}
"""jax settings that ppo-eqx cannot run under: the environment variable that sets each, the values refused, why."""
TRUTH_VALUES = ("1", "0", "true", "false", "yes", "no", "on", "off", "y", "n", "t", "f")
"""The values jax reads as a boolean from an environment variable (any case)."""
_INVALID_ENUM = re.compile(r'Invalid value "(.*)" for JAX flag (\w+)')
_INVALID_TRUTH = re.compile(r"invalid truth value '(.*)' for environment '(\w+)'")


def import_jax() -> None:
    """Import jax, or UsageError naming the environment variable jax refused at import and the values it takes
    (a bad ``JAX_ENABLE_X64`` or ``JAX_DEFAULT_MATMUL_PRECISION`` ends jax's import with a ValueError)."""
    try:
        import jax  # noqa: F401
    except ValueError as error:
        raise UsageError(_refused_at_import(str(error))) from None


def _refused_at_import(message: str) -> str:
    truth = _INVALID_TRUTH.search(message)
    if truth:
        variable, value = truth.group(2), os.environ.get(truth.group(2), truth.group(1))
        allowed = ", ".join(TRUTH_VALUES)
        return f"{variable}={value!r} is not a truth value jax reads; give one of {allowed}, or unset it"
    enum = _INVALID_ENUM.search(message)
    if enum is None:
        return f"jax refused this process's environment: {message.splitlines()[0]}"
    variable, value = enum.group(2).upper(), enum.group(1)
    allowed = _enum_values(enum.group(2), variable)
    takes = f"give one of {', '.join(allowed)}" if allowed else "give a value jax documents"
    return f"{variable}={value!r} is not a value jax takes; {takes}, or unset it"


def _enum_values(name: str, variable: str) -> list[str]:
    """The values jax's option ``name`` takes, asked of a child whose environment lacks ``variable`` (this
    process's jax import has failed)."""
    env = {key: value for key, value in os.environ.items() if key != variable}
    code = f"import jax; print(*jax.config.meta[{name!r}][2].get('enum_values', ()))"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.split() if done.returncode == 0 else []


def results_environment(xla_flags: str | None) -> dict[str, str | None]:
    """The values of ``RESULT_VARIABLES`` in this process (None: unset), ``XLA_FLAGS`` as the user set it
    (``xla_flags``: before ppo-eqx added its own scheduling flag, ``schedule_small_programs``)."""
    values = {name: os.environ.get(name) for name in RESULT_VARIABLES}
    values["XLA_FLAGS"] = xla_flags or None
    return values


def check_jax_settings() -> None:
    """UsageError naming the variable when jax runs with a setting ppo-eqx cannot train or play under
    (``REFUSED_SETTINGS``); jax reads them from the environment when it is imported."""
    import jax

    for setting, (variable, refused, why) in REFUSED_SETTINGS.items():
        value = getattr(jax.config, setting)
        if value in refused:
            given = os.environ.get(variable)
            where = f"{variable}={given!r}" if given is not None else f"jax.config.{setting}={value!r}"
            raise UsageError(f"{where} {why}")
