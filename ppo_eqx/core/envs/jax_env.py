"""Any env written in JAX with gymnax's interface, as an env backend: the door a user's own env comes through.

``JaxEnv(env, params)`` takes an object with gymnax's interface, duck-typed (no gymnax import, no base class):
``default_params``; ``reset(key, params) -> (obs, state)``; ``step(key, state, action, params)`` returning
``(obs, state, reward, done, info)`` or gymnax 1.0's ``(obs, state, reward, terminated, truncated, info)``, with
finished episodes reset inside the step, as gymnax's are; ``action_space(params).n`` (discrete actions);
``observation_space(params)`` with ``.shape`` and ``.dtype``. gymnax's own envs (``gymnax.make``'s pair, its
wrappers) come through here too: the ``gymnax`` backend is this one over ``gymnax.make``.

A pool's handle is the envs' whole state as arrays (``JaxEnvHandle``: the env's state and one PRNG key per env),
so the step is a plain pure function: the handle is ``vmap``-ed per agent, saved in a checkpoint and restored bit
for bit, and the envs live for the whole run (``state_is_data``). Env i's key starts as ``PRNGKey(seeds[i])`` and
is split at every step, one half carried on, the other given to the env's step.

The backend "jax", whose env ids are ``MODULE:CALLABLE`` (the callable, imported then called with no arguments,
returns the env), imports the user's code: it is the edge's (``ppo_eqx.host.named``).
"""

import contextlib
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PyTree, UInt32

from ...errors import ConfigError, raised
from .._types import EnvOutput, ObsKind
from . import BACKEND_THREADS, AsyncPool, EnvSpec, EnvThreads, Pool
from .spaces import PROBE_ENVS, action_space_of, random_actions

INTERFACE = "an object with gymnax's interface (default_params, reset, step, action_space, observation_space)"
PROBE_STEPS = 32
"""A user env's first steps run once, with random actions, before it trains (``JaxEnv.check``)."""


Seeds = Sequence[int] | Int[Array, " N"] | UInt32[Array, " N"]
"""One seed per env: Python ints, or an integer array (inside a trace too)."""


class JaxEnvHandle(NamedTuple):
    """The envs' state as data: the env's own state (every leaf ``[N, ...]``, strongly typed) and each env's key."""

    state: PyTree
    keys: UInt32[Array, "N 2"]


def env_name(env: Any) -> str:
    """What a config calls an env object: its ``name`` (gymnax's envs have one), else its class's."""
    name = getattr(env, "name", None)
    return name if isinstance(name, str) and name else type(env).__name__


def env_keys(seeds: Seeds) -> UInt32[Array, "N 2"]:
    """Env i's key, ``PRNGKey(seeds[i])``."""
    return jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds, jnp.uint32))


def _strong(tree: PyTree) -> PyTree:
    """``tree`` with every leaf strongly typed. Envs build states from Python numbers, which JAX keeps as weakly
    typed leaves; a state read back from a checkpoint is strong, and both must be the same program's input."""
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.asarray(x).dtype), tree)


def _kind(shape: tuple[int, ...], dtype: np.dtype) -> ObsKind | None:
    """The kind of an env's observations of ``shape`` as the model sees them (``_model_shape``)."""
    if len(shape) <= 1:
        return "vector"
    if len(shape) <= 3:
        return "frames" if len(shape) == 3 and dtype == np.uint8 else "grid"
    return None


def _model_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """What the model sees of an env's observation of ``shape``: a scalar as a vector of one, an ``[H, W]`` grid
    with one channel, anything else as it is."""
    return (1,) if not shape else (*shape, 1) if len(shape) == 2 else shape


class JaxEnv:
    """``EnvBackend`` of one env object with gymnax's interface (this module's docstring): synchronous pools whose
    handle is the envs' state. ``params`` default to the env's ``default_params``; ``env_id`` (default: the env's
    name, ``env_name``) is what configs and messages call it. The env is checked when its spec is first asked for:
    its interface, its shapes and dtypes (traced, nothing run), and, with ``probe``, rewards and observations
    finite over a few random steps (``check``)."""

    name = "jax"
    rebinds = True
    has_async = False
    state_is_data = True

    def __init__(self, env: Any, params: Any = None, *, env_id: str | None = None, probe: bool = True):
        if isinstance(env, tuple) and len(env) == 2 and params is None:  # gymnax.make's (env, params)
            env, params = env
        env = cast(Any, env)  # duck-typed: checked below
        methods = ("reset", "step", "action_space", "observation_space")
        missing = [name for name in methods if not callable(getattr(env, name, None))]
        if missing:
            raise ConfigError(f"env {env_name(env)!r} has no {', '.join(missing)}; allowed: {INTERFACE}")
        if params is None:
            try:
                params = env.default_params
            except AttributeError:
                raise ConfigError(f"env {env_name(env)!r} has no default_params; allowed: {INTERFACE}") from None
        self.env, self.params = env, params
        self.env_id = env_id or env_name(env)
        self._probe = probe
        self._spec: EnvSpec | None = None
        self._action_shape: tuple[int, ...] = ()
        self._bounds: tuple[tuple[float, ...], tuple[float, ...]] | None | str = "not yet read"
        self._reset_program = jax.jit(self.reset)

    def __repr__(self) -> str:
        return f"JaxEnv({self.env_id!r})"

    # The EnvBackend protocol: the env id names this env; any id is taken (a config's, a command line's).
    def spec(self, env_id: str | None = None) -> EnvSpec:
        if self._spec is None:
            self._spec = self.check()
        return self._spec

    def make(
        self, env_id: str, seeds: Sequence[int], *, render: bool = False, threads: EnvThreads = BACKEND_THREADS
    ) -> Pool:
        if render:
            raise ConfigError(f"{self.env_id}: envs written in JAX do not render screens here; allowed: no video")
        spec = self.spec()
        seeds_here = jax.device_put(np.asarray(seeds, np.uint32))  # a transfer, not a conversion compiled there
        handle, first_obs = self._reset_program(seeds_here)  # one program, compiled once
        return Pool(spec, handle, self.step, first_obs, lambda: None, self._no_render)

    def _no_render(self, i: int) -> np.ndarray:
        raise ConfigError(f"{self.env_id}: envs written in JAX do not render screens here")

    def make_async(
        self, env_id: str, seeds: Sequence[int], batch_size: int, *, threads: EnvThreads = BACKEND_THREADS
    ) -> AsyncPool:
        raise ConfigError(
            f"async_batch_size={batch_size} is not possible with envs written in JAX ({self.env_id}); allowed: 0"
        )

    def pool(self, seeds: Seeds) -> Pool:
        """``len(seeds)`` envs, env i's key ``PRNGKey(seeds[i])``: ``make`` by the env alone. Traceable (the
        seeds may be an array inside a jitted program)."""
        handle, first_obs = self.reset(seeds)
        return Pool(self.spec(), handle, self.step, first_obs, lambda: None, self._no_render)

    # The pure functions of a pool.
    def reset(self, seeds: Seeds) -> tuple[JaxEnvHandle, Array]:
        """``len(seeds)`` fresh envs: their handle and first observations. Pure (traceable)."""
        split = jax.vmap(jax.random.split)(env_keys(seeds))
        obs, state = jax.vmap(self.env.reset, in_axes=(0, None))(split[:, 1], self.params)
        return JaxEnvHandle(_strong(state), split[:, 0]), self._obs(obs)

    def step(
        self, handle: JaxEnvHandle, actions: Int[Array, " N"] | Float[Array, "N A"]
    ) -> tuple[JaxEnvHandle, EnvOutput]:
        """Step every env once with its own key; ``EnvOutput`` as every backend gives it. Pure."""
        split = jax.vmap(jax.random.split)(handle.keys)  # each env's stream goes on alone
        actions = self._env_actions(actions)
        outputs = jax.vmap(self.env.step, in_axes=(0, 0, 0, None))(split[:, 1], handle.state, actions, self.params)
        obs, state, reward, terminated, truncated, final_obs = _unpack(outputs)
        reward = reward.astype(jnp.float32)
        done = terminated | truncated
        time_limit = truncated & ~terminated
        out = EnvOutput(self._obs(obs), reward, done, reward, done, time_limit, self._obs(final_obs))
        return JaxEnvHandle(_strong(state), split[:, 0]), out

    def _env_actions(self, actions: Array) -> Array:
        """The actions as the env takes them: continuous ones (``[N, A]``) clipped to the action space's bounds, as
        CleanRL's ``ClipAction`` (the unclipped sample is what the loss sees), in the space's shape."""
        if isinstance(self._bounds, str):
            self.spec()
        bounds = self._bounds
        if bounds is None or isinstance(bounds, str):
            return actions
        low, high = (jnp.asarray(b, jnp.float32) for b in bounds)
        return jnp.clip(actions, low, high).reshape(actions.shape[:1] + self._action_shape)

    def _obs(self, obs: Array) -> Array:
        """A batch of the env's observations ``[N, ...]`` as the model takes them: float32 (uint8 frames as they
        are), reshaped by ``_model_shape``."""
        shape = tuple(obs.shape[1:])
        obs = obs.reshape(obs.shape[:1] + _model_shape(shape))
        return obs if _kind(shape, np.dtype(obs.dtype)) == "frames" else obs.astype(jnp.float32)

    # The checks, each failure one line naming what is wrong.
    def check(self) -> EnvSpec:
        """The env's spec, after checking what it declares against what its reset and step return (shapes and
        dtypes, traced); with ``probe``, a few random steps run and their rewards and observations are finite."""
        obs_space, action_space = self._call("observation_space"), self._call("action_space")
        try:
            shape = tuple(int(n) for n in obs_space.shape)
            dtype = np.dtype(obs_space.dtype)
        except (AttributeError, TypeError) as error:
            raise ConfigError(
                f"{self.env_id}: observation_space(params) has no shape and dtype ({raised(error)}); allowed: "
                "a space with .shape and .dtype"
            ) from None
        kind = _kind(shape, dtype)
        if kind is None:
            raise ConfigError(
                f"{self.env_id}: observations of shape {shape} are neither a number, a flat vector, a grid ([H, W] or "
                "[H, W, C]) nor [C, H, W] uint8 frames; allowed: an observation_space of 0 to 3 dimensions"
            )
        obs_dtype = np.dtype(np.uint8 if kind == "frames" else np.float32)  # vectors and grids as float32
        num_actions, bounds = action_space_of(self.env_id, action_space)
        spec = EnvSpec(self.env_id, _model_shape(shape), obs_dtype, num_actions, kind, self, bounds)
        self._action_shape = tuple(getattr(action_space, "shape", ())) if bounds is not None else ()
        self._bounds = bounds  # before the probe below steps the envs
        self._check_shapes(spec, shape)
        if self._probe:
            self._check_values(spec)
        return spec

    def _call(self, name: str) -> Any:
        try:
            return getattr(self.env, name)(self.params)
        except BaseException as error:  # the user's code (sys.exit too): any failure is theirs to read, in one line
            raise ConfigError(f"{self.env_id}: {name}(params) {raised(error)}") from None

    def _traced(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return jax.eval_shape(fn, *args)
        except BaseException as error:  # the user's code, traced (sys.exit too)
            raise ConfigError(f"{self.env_id}: {what} {raised(error)}") from None

    def _check_shapes(self, spec: EnvSpec, shape: tuple[int, ...]) -> None:
        """Reset's and step's outputs traced: the observation of ``shape`` (the declared one), scalar rewards and
        flags, gymnax's arity, and a state that keeps its structure, shapes and dtypes."""
        # Shapes only, nothing computed: on an accelerator each array made here would be a program compiled there.
        key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
        obs, state = self._traced("reset(key, params)", lambda k: _pair(self.env.reset(k, self.params), spec), key)
        _check_array(spec, "reset's observation", obs, shape)
        action = jax.ShapeDtypeStruct(self._action_shape, jnp.float32 if spec.continuous else jnp.int32)
        step = self.env.step
        outputs = self._traced(
            "step(key, state, action, params)", lambda k, s, a: step(k, s, a, self.params), key, state, action
        )
        if not isinstance(outputs, tuple) or len(outputs) not in (5, 6):
            count = len(outputs) if isinstance(outputs, tuple) else f"a {type(outputs).__name__}, not a tuple of"
            raise ConfigError(
                f"{self.env_id}: step(key, state, action, params) returns {count} values; allowed: (obs, state, "
                "reward, done, info), or gymnax 1.0's (obs, state, reward, terminated, truncated, info)"
            )
        step_obs, step_state, reward, *flags = outputs[:-1]
        _check_array(spec, "step's observation", step_obs, shape)
        _check_array(spec, "step's reward", reward, ())
        for name, flag in zip(("done",) if len(flags) == 1 else ("terminated", "truncated"), flags, strict=True):
            _check_array(spec, f"step's {name}", flag, ())
        if _layout(step_state) != _layout(state):
            raise ConfigError(
                f"{self.env_id}: step returns a state of other shapes or dtypes than reset's; allowed: the same state "
                "structure (reset's shapes and dtypes) after every step"
            )

    def _check_values(self, spec: EnvSpec) -> None:
        def run(key: Array) -> tuple[Array, Array]:
            handle, obs = self.reset(jnp.arange(PROBE_ENVS))

            def step(handle: JaxEnvHandle, key: Array) -> tuple[JaxEnvHandle, tuple[Array, Array]]:
                actions = random_actions(key, spec)
                handle, out = self.step(handle, actions)
                return handle, (jnp.all(jnp.isfinite(out.reward)), jnp.all(jnp.isfinite(out.obs.astype(jnp.float32))))

            _, (rewards, observations) = jax.lax.scan(step, handle, jax.random.split(key, PROBE_STEPS))
            return jnp.all(rewards), jnp.all(observations) & jnp.all(jnp.isfinite(obs.astype(jnp.float32)))

        try:
            with jax.ensure_compile_time_eval():  # values, even where a spec is first asked for inside a trace
                rewards_finite, obs_finite = jax.jit(run)(jax.random.PRNGKey(0))
        except BaseException as error:  # the user's code, run (sys.exit too)
            raise ConfigError(f"{self.env_id}: a step of {PROBE_ENVS} envs {raised(error)}") from None
        if not bool(rewards_finite):
            raise ConfigError(
                f"{self.env_id}: step returned a non-finite reward (NaN or inf) within {PROBE_STEPS} random steps; "
                "allowed: finite rewards"
            )
        if not bool(obs_finite):
            raise ConfigError(
                f"{self.env_id}: an observation holds NaN or inf within {PROBE_STEPS} random steps; allowed: finite "
                "observations"
            )


def _layout(tree: PyTree) -> tuple:
    """A traced tree's structure with each leaf's shape and dtype."""
    return jax.tree.structure(tree), [(leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(tree)]


def _pair(result: Any, spec: EnvSpec) -> tuple[Any, Any]:
    if not isinstance(result, tuple) or len(result) != 2:
        count = len(result) if isinstance(result, tuple) else f"a {type(result).__name__}, not a tuple of"
        raise ValueError(f"it returns {count} values; allowed: (obs, state)")
    return result


def _check_array(spec: EnvSpec, what: str, value: Any, shape: tuple[int, ...]) -> None:
    if not isinstance(value, jax.ShapeDtypeStruct) or tuple(value.shape) != tuple(shape):
        shown = f"shape {tuple(value.shape)}" if isinstance(value, jax.ShapeDtypeStruct) else type(value).__name__
        raise ConfigError(f"{spec.env_id}: {what} has {shown}; allowed: shape {tuple(shape)} (one env's)")
    if not (jnp.issubdtype(value.dtype, jnp.number) or value.dtype == jnp.bool_):
        raise ConfigError(f"{spec.env_id}: {what} is of dtype {value.dtype}; allowed: a number or bool")


def _unpack(outputs: tuple) -> tuple[Array, PyTree, Array, Array, Array, Array]:
    """``(obs, state, reward, terminated, truncated, final_obs)`` of a step's outputs, batched over envs: gymnax 1.0's
    six, or the five of gymnax's older interface (``done``; ``info``'s ``terminated``/``truncated`` and
    ``final_observation`` where the env gives them)."""
    if len(outputs) == 6:
        obs, state, reward, terminated, truncated, info = outputs
        final_obs = info.get("final_observation", obs) if isinstance(info, dict) else obs
        return obs, state, reward, terminated.astype(bool), truncated.astype(bool), final_obs
    obs, state, reward, done, info = outputs
    info = info if isinstance(info, dict) else {}
    done = done.astype(bool)
    truncated = info["truncated"].astype(bool) & done if "truncated" in info else jnp.zeros_like(done)
    terminated = info["terminated"].astype(bool) & done if "terminated" in info else done & ~truncated
    terminated = terminated | (done & ~truncated)  # every done is one or the other
    return obs, state, reward, terminated, truncated & ~terminated, info.get("final_observation", obs)


_WRAPPED: "weakref.WeakKeyDictionary[Any, JaxEnv]" = weakref.WeakKeyDictionary()


def as_jax_env(env: Any) -> JaxEnv:
    """``env`` as a backend: a ``JaxEnv`` as it is, gymnax's ``(env, params)`` pair or an env object wrapped (the
    same object's wrapper each time, so that it is checked once)."""
    if isinstance(env, JaxEnv):
        return env
    if isinstance(env, tuple):
        return JaxEnv(*env) if len(env) == 2 else JaxEnv(env)
    try:
        wrapped = _WRAPPED.get(env)
    except TypeError:  # not hashable or not weakly referable: wrapped anew each time
        return JaxEnv(env)
    if wrapped is None:
        wrapped = JaxEnv(env)
        with contextlib.suppress(TypeError):
            _WRAPPED[env] = wrapped
    return wrapped


def env_backend_of(env: Any, env_backend: str) -> JaxEnv:
    """The backend of an env object given to a ``Trainer`` or ``evaluate`` (``as_jax_env``), for a config made for
    one (``env_backend`` "jax"); ConfigError for a config of a built-in backend's env."""
    if env_backend != "jax":
        raise ConfigError(
            f"env={env_name(env)!r} with env_backend={env_backend!r}; allowed: a config made for the env, "
            "PPOConfig.for_task(env, ...) (env_backend 'jax')"
        )
    return as_jax_env(env)
