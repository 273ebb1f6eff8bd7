"""Env backends behind one small protocol, and what every backend shares.

A backend (``EnvBackend``) knows the spec of an env id and makes pools of N envs with given seeds: a ``Pool``
steps all of them at once through a pure, jittable ``step(handle, actions) -> (handle, EnvOutput)``; an
``AsyncPool`` (where the backend has one) receives and sends R of them at a time. Each backend lives in a
module of its own, the only one that imports its library; ``backend(name)`` imports it on first use.
``envpool`` (``ppo_eqx.core.envs.envpool``, the default), ``ale`` (``ppo_eqx.core.envs.ale``, ALE's own vector env)
and ``gymnax`` (``ppo_eqx.core.envs.gymnax``, envs written in JAX, whose state is data: ``EnvBackend.state_is_data``);
any env object with gymnax's interface is one too (``core.envs.jax_env.JaxEnv``). The names are shortcuts, resolved at
the edge with the two that import the user's code: ``jax`` (env ids ``MODULE:CALLABLE``) and ``MODULE:ATTRIBUTE`` (a
backend object of the user's): ``ppo_eqx.host.named.backend_named``.
"""

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jax import custom_batching
from jaxtyping import Array, Int

from ...errors import ConfigError
from ...settings import ENV_BACKENDS
from .._types import EnvOutput, ObsKind

EnvStep = Callable[[Any, Int[Array, " N"]], tuple[Any, EnvOutput]]
"""``env_step(handle, actions) -> (handle, EnvOutput)``: pure, jittable, the handle threaded through."""
EnvRecv = Callable[[Any], tuple[Any, Int[Array, " R"], EnvOutput]]
"""``recv(handle) -> (handle, env_ids, EnvOutput)``: the next ``R`` envs to finish a step, in no fixed order."""
EnvSend = Callable[[Any, Int[Array, " R"], Int[Array, " R"]], Any]
"""``send(handle, env_ids, actions) -> handle``: start a step of each of the envs ``env_ids``."""


class _Module(NamedTuple):
    load: Callable[[], "EnvBackend"]
    """Imports the module that implements the backend and returns its ``BACKEND``."""
    libraries: tuple[str, ...]
    """What it imports that may not be installed."""
    install: str


def _envpool() -> "EnvBackend":
    from .envpool import BACKEND

    return BACKEND


def _ale() -> "EnvBackend":
    from .ale import BACKEND

    return BACKEND


def _gymnax() -> "EnvBackend":
    from .gymnax import BACKEND

    return BACKEND


BACKENDS = {
    "envpool": _Module(_envpool, ("envpool",), "pip install envpool"),
    "ale": _Module(_ale, ("ale_py", "chex", "gymnasium"), "pip install 'ppo_eqx[ale]'"),
    "gymnax": _Module(_gymnax, ("gymnax", "flax"), "pip install 'ppo_eqx[gymnax]'"),
}
"""Library backend name -> how it is loaded and what it needs; with "jax" (resolved at the edge) these are
``settings.ENV_BACKENDS`` (the jax-free face the command line's ``--env-backend`` takes), in its order: the check
below keeps the two equal."""
if (*BACKENDS, "jax") != ENV_BACKENDS:
    raise TypeError(f"core.envs.BACKENDS names {tuple(BACKENDS)} and 'jax', settings.ENV_BACKENDS {ENV_BACKENDS}")


class EnvThreads(NamedTuple):
    """How a host backend's envs are stepped (EnvPool's and ALE's ``num_threads`` and ``thread_affinity_offset``):
    ``count`` threads (0: the backend's own choice), the i-th pinned to core ``first_core + i`` (-1: not pinned).
    They change how fast a synchronous pool steps, never what it computes; a backend whose envs run in the program
    (gymnax) has none."""

    count: int = 0
    first_core: int = -1


BACKEND_THREADS = EnvThreads()
"""The backend's own choice of threads, not pinned."""


class EnvSpec(NamedTuple):
    """What the model and the run need to know of an env: its observations (shape, dtype, ``kind``) and actions."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int
    kind: ObsKind
    source: Any = None
    """The env written in JAX that this spec is of (its ``JaxEnv``): it makes the envs again where a config's
    ``env_backend`` name cannot (an env object of the user's), and a checkpoint of their state loads into the tree it
    makes. None for host backends (EnvPool, ALE)."""
    action_bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    """For continuous actions (a box of ``num_actions`` dimensions): each dimension's lowest and highest value, to
    which the backend clips the actions it is given (CleanRL's ``ClipAction``); None for discrete actions."""

    @property
    def continuous(self) -> bool:
        return self.action_bounds is not None


class Pool(NamedTuple):
    """N envs, reset: ``first_obs`` is their first observation (``[N, *obs]``), ``step`` steps all of them.

    ``close()`` frees the envs; ``render(i)`` is env i's screen (``[H, W, 3]`` uint8) of a pool made with
    ``render=True``. Whether ``step``, once traced, can drive another pool is the backend's ``rebinds``.
    """

    spec: EnvSpec
    handle: Any
    step: EnvStep
    first_obs: np.ndarray | Array
    close: Callable[[], None]
    render: Callable[[int], np.ndarray]


class HostPool(NamedTuple):
    """N envs, reset, stepped from the host in two calls (EnvPool's host API; a backend that has one makes it with
    ``make_host``): ``send(actions)`` starts a step of every env with NumPy actions and returns at once, ``recv()``
    waits for it and returns the step as an ``EnvOutput`` of NumPy arrays (env i in row i). Between the two the
    host is free: ``host.loop`` acts for one pool while another steps."""

    spec: EnvSpec
    first_obs: np.ndarray
    send: Callable[[np.ndarray], None]
    recv: Callable[[], EnvOutput]
    close: Callable[[], None]


class AsyncEnv(NamedTuple):
    """An async pool's two pure, jittable calls, the handle threaded through both.

    Every env has one step under way at any time (a reset, at first): ``recv`` waits for ``R`` of them to
    finish and ``send`` starts the next step of exactly those. The outputs of an env's first ``recv`` after
    the pool was made are its reset (reward 0, not done).
    """

    recv: EnvRecv
    send: EnvSend


class AsyncPool(NamedTuple):
    """N envs with their resets under way, received ``R`` at a time through ``env``."""

    spec: EnvSpec
    handle: Any
    env: AsyncEnv
    close: Callable[[], None]


@runtime_checkable
class EnvBackend(Protocol):
    """What a backend implements; ppo_eqx needs nothing else of it."""

    name: str
    rebinds: bool
    """True when a program traced with one pool's calls can drive another pool (given its handle): then a new
    segment of envs needs no new compile. False for EnvPool, whose XLA call is bound to the pool it came from."""
    has_async: bool
    """Whether ``make_async`` makes pools (EnvPool) or refuses (ALE, gymnax)."""
    state_is_data: bool
    """True when a pool's handle is all of its envs' state, as arrays (gymnax): it is mapped per agent by a plain
    ``vmap``, saved in checkpoints, and the envs live for the whole run. False for EnvPool and ALE, whose envs live
    on the host behind the handle: those are made afresh at every segment of a run (``host.trainer``).

    Optional beside these: ``compiles_on``, the platforms (jax's backend names, "cpu", "gpu", "tpu") whose programs
    can hold the pool's step, where it is a call that XLA registers for some alone (EnvPool's and ALE's: "cpu" and
    "gpu"); a backend without it runs anywhere (``host.placement.compiles_here``)."""

    def spec(self, env_id: str) -> EnvSpec:
        """The spec of ``env_id``; ConfigError (naming the id and what is allowed) for an unknown id or one
        whose actions are not discrete."""
        ...

    def make(
        self, env_id: str, seeds: Sequence[int], *, render: bool = False, threads: EnvThreads = BACKEND_THREADS
    ) -> Pool:
        """``len(seeds)`` envs of ``env_id``, env i seeded with ``seeds[i]``, reset, stepped by ``threads``."""
        ...

    def make_async(
        self, env_id: str, seeds: Sequence[int], batch_size: int, *, threads: EnvThreads = BACKEND_THREADS
    ) -> AsyncPool:
        """``len(seeds)`` envs received ``batch_size`` at a time; ConfigError where the backend has no async pool."""
        ...


@runtime_checkable
class HostBackend(Protocol):
    """A backend whose envs can also be stepped from the host (EnvPool's): ``--rollout-on host-envs``."""

    def make_host(self, env_id: str, seeds: Sequence[int], *, threads: EnvThreads = BACKEND_THREADS) -> HostPool:
        """``make``'s envs as a ``HostPool``; ConfigError for an env it cannot step so."""
        ...


def backend(name: str) -> EnvBackend:
    """The library backend called ``name`` (its module imported now); ConfigError for an unknown or missing one. The
    names that import the user's code (``jax``, ``MODULE:ATTRIBUTE``) are the edge's: ``host.named.backend_named``."""
    if name not in BACKENDS:
        raise ConfigError(
            f"env backend {name!r} is unknown here; allowed: {', '.join(sorted(BACKENDS))} (the names of code of "
            "yours, 'jax' and MODULE:ATTRIBUTE, are ppo_eqx.host.named.backend_named's)"
        )
    where = BACKENDS[name]
    try:
        return where.load()
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        if missing not in where.libraries:  # a library of the backend is missing, not something else
            raise
        raise ConfigError(f"env backend {name!r} is not installed (no module {missing!r}); {where.install}") from None


def derived_seeds(seed: int, stream: int, num_envs: int) -> list[int]:
    """``num_envs`` env seeds below 2**31, a function of ``(seed, stream)`` alone (NumPy's ``SeedSequence``).

    Training's segments use their first iteration as the stream, evaluation a stream of its own.
    """
    entropy = [seed % 2**32, stream]
    return [int(s) % 2**31 for s in np.random.SeedSequence(entropy).generate_state(num_envs)]


def segment_env_seeds(seed: int, iteration: int, num_envs: int) -> list[int]:
    """Seeds of the envs of the run with ``seed`` that play from ``iteration`` on, a function of both alone.

    The first segment's env i gets ``seed + i``, as EnvPool's own seeding in CleanRL's script; later segments
    ``derived_seeds(seed, iteration, num_envs)``.
    """
    if iteration == 0:
        return [seed + i for i in range(num_envs)]
    return derived_seeds(seed, iteration, num_envs)


def agents_env_step(env_step: EnvStep, num_seeds: int) -> EnvStep:
    """``env_step`` of a pool of ``S * N`` envs made vmappable over ``S`` agents of ``N`` envs each.

    A backend's XLA call has no batching rule, so ``jax.vmap`` cannot step it. Under ``vmap`` over a leading
    ``S`` axis of actions (``[S, N]``) this steps the whole pool once with the actions flattened to ``[S*N]``
    (agent s drives envs ``s*N .. s*N + N - 1``) and returns the outputs reshaped to ``[S, N, ...]``; the handle
    stays unbatched, as there is one pool. Called without ``vmap`` (as JAX does once to learn the output
    shapes), all agents take the same ``[N]`` actions and agent 0's outputs are returned.
    """

    @custom_batching.custom_vmap
    def step(handle: Any, actions: Int[Array, " N"]) -> tuple[Any, EnvOutput]:
        handle, out = env_step(handle, jnp.tile(actions, (num_seeds,) + (1,) * (actions.ndim - 1)))
        return handle, jax.tree.map(lambda x: x[: actions.shape[0]], out)

    @step.def_vmap
    def step_agents(
        axis_size: int, in_batched: list[Any], handle: Any, actions: Int[Array, "S N"]
    ) -> tuple[tuple[Any, EnvOutput], tuple[Any, Any]]:
        handle_batched, actions_batched = in_batched
        if axis_size != num_seeds or any(jax.tree.leaves(handle_batched)):
            raise ValueError(f"vmap this env step over its {num_seeds} agents only, with one unbatched handle")
        if not actions_batched:
            actions = jnp.broadcast_to(actions, (num_seeds, *actions.shape))
        handle, out = env_step(handle, actions.reshape((-1, *actions.shape[2:])))  # [S*N] or continuous [S*N, A]
        out = jax.tree.map(lambda x: x.reshape((num_seeds, -1) + x.shape[1:]), out)
        return (handle, out), (jax.tree.map(lambda _: False, handle), jax.tree.map(lambda _: True, out))

    return step


def make_pool(env_id: str, num_envs: int, *, seed: int = 1, env_backend: str = "envpool", render: bool = False) -> Pool:
    """``num_envs`` envs of ``env_id``, env i seeded with ``seed + i`` (CleanRL's seeding), reset."""
    return backend(env_backend).make(env_id, segment_env_seeds(seed, 0, num_envs), render=render)


def make_async_pool(
    env_id: str, num_envs: int, batch_size: int, *, seed: int = 1, env_backend: str = "envpool"
) -> AsyncPool:
    """``make_pool``'s envs as an async pool, received ``batch_size`` at a time."""
    return backend(env_backend).make_async(env_id, segment_env_seeds(seed, 0, num_envs), batch_size)


def env_spec(env_id: str, *, env_backend: str = "envpool") -> EnvSpec:
    """The spec of ``env_id`` on ``env_backend`` (no env is made)."""
    return backend(env_backend).spec(env_id)
