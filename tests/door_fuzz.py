"""User code that breaks one contract, chosen by the JSON in ``DOOR_FUZZ`` (``tests/test_door_fuzz.py`` draws it):
an env, a loss, a backend, a network or an optimizer factory, each named on the command line as
``tests.door_fuzz:NAME``. What breaks and how: ``{"door": ..., "break": ..., ...}``, read by the factory when the
command line calls it."""

import json
import os
import sys
from types import SimpleNamespace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ppo_eqx

LENGTH = 64
"""Steps of every episode of ``Clock``: whatever the policy does, step ``t`` of each env's first episode comes."""


def _spec() -> dict[str, Any]:
    return json.loads(os.environ["DOOR_FUZZ"])


class Unprintable(Exception):
    """An exception whose message cannot be made: ``str`` of it raises."""

    def __str__(self) -> str:
        raise RuntimeError("no message")


class Custom(Exception):
    """An exception class of the user's own."""


EXCEPTIONS = {
    cls.__name__: cls
    for cls in (
        ValueError, RuntimeError, TypeError, KeyError, AssertionError, ZeroDivisionError, NotImplementedError,
        AttributeError, IndexError, MemoryError, RecursionError, FloatingPointError, KeyboardInterrupt, Unprintable,
        Custom,
    )
}  # fmt: skip


def fail(spec: dict[str, Any]) -> None:
    """Do what ``spec`` says the user's code does in place of its work: raise an exception or call ``sys.exit``."""
    if spec["how"] == "exit":
        sys.exit(spec["code"])
    raise EXCEPTIONS[spec["exception"]](spec["message"])


def misbehaves(spec: dict[str, Any], where: str) -> bool:
    """Whether the break of ``spec`` happens at ``where`` (one of the places a door calls the user's code)."""
    return spec["break"] == "fails" and spec["where"] == where


# --- env ---------------------------------------------------------------------------------------------------------


class ClockState(NamedTuple):
    time: jax.Array


class Clock:
    """Episodes of exactly ``LENGTH`` steps; the observation is the time, one-hot modulo 8; action 1 pays 1 on even
    steps, action 0 on odd ones."""

    name = "Clock-v0"

    def __init__(self, spec: dict[str, Any]):
        self.fuzz = spec

    @property
    def default_params(self) -> Any:
        if misbehaves(self.fuzz, "default_params"):
            fail(self.fuzz)
        return ()

    def observation_space(self, params: Any) -> SimpleNamespace:
        if misbehaves(self.fuzz, "observation_space"):
            fail(self.fuzz)
        return SimpleNamespace(shape=(8,), dtype=jnp.float32)

    def action_space(self, params: Any) -> SimpleNamespace:
        if misbehaves(self.fuzz, "action_space"):
            fail(self.fuzz)
        return SimpleNamespace(n=2)

    def reset(self, key: jax.Array, params: Any) -> Any:
        if misbehaves(self.fuzz, "reset"):
            fail(self.fuzz)
        state = ClockState(jnp.zeros((), jnp.int32))
        if self.fuzz["break"] == "reset_arity":
            return (self._obs(state), state, state)[: self.fuzz["count"]]
        return self._obs(state), state

    def step(self, key: jax.Array, state: ClockState, action: jax.Array, params: Any) -> Any:
        fuzz = self.fuzz
        if misbehaves(fuzz, "step"):
            fail(fuzz)
        time = state.time + 1
        done = time >= LENGTH
        reward = jnp.where(action == state.time % 2, 1.0, 0.0).astype(jnp.float32)
        next_state = ClockState(jnp.where(done, 0, time))
        obs = self._obs(next_state)
        if fuzz["break"] == "value":  # a value that is not finite, at one step of every env's first episode
            bad = jnp.asarray(fuzz["value"], jnp.float32)
            at = state.time == fuzz["at"]
            if fuzz["field"] == "reward":
                reward = jnp.where(at, bad, reward)
            else:
                obs = jnp.where(at, bad, obs)
        if fuzz["break"] == "callback":  # a host function that raises on its n-th call
            shape = jax.ShapeDtypeStruct((), jnp.float32)
            reward = jax.pure_callback(_counted, shape, reward, vmap_method="sequential")
        if fuzz["break"] == "shape":
            extra = jnp.zeros(fuzz["extra"], jnp.float32)
            if fuzz["field"] == "reward":
                reward = reward + extra
            else:
                obs = obs[..., None] + extra
        if fuzz["break"] == "dtype":
            if fuzz["field"] == "reward":
                reward = str(fuzz["dtype"]) if fuzz["dtype"] == "str" else reward.astype(fuzz["dtype"])
            else:
                obs = None if fuzz["dtype"] == "str" else obs.astype(fuzz["dtype"])
        out = (obs, next_state, reward, done, {})
        if fuzz["break"] == "step_arity":
            return (*out, *out)[: fuzz["count"]]
        return out

    def _obs(self, state: ClockState) -> jax.Array:
        return jax.nn.one_hot(state.time % 8, 8, dtype=jnp.float32)


_CALLS = [0]


def _counted(x: Any) -> Any:
    _CALLS[0] += 1
    spec = _spec()
    if _CALLS[0] >= spec["after"]:
        fail(spec)
    return x


def env() -> Any:
    """The env factory ``--env-id tests.door_fuzz:env`` names."""
    spec = _spec()
    if misbehaves(spec, "factory"):
        fail(spec)
    if spec["break"] == "returns":
        return {"none": None, "int": 3, "str": "Clock-v0", "list": [Clock(spec)], "class": Clock}[spec["value"]]
    if spec["break"] == "missing":
        missing = spec["name"]
        return type("Partial", (Clock,), {missing: None})(spec)
    return Clock(spec)


def clock() -> Clock:
    """The well-behaved env (beside a broken loss, backend, network or optimizer)."""
    return Clock({"break": "none"})


# --- loss --------------------------------------------------------------------------------------------------------


def loss(model: Any, minibatch: Any, hyperparameters: Any, *, prepared: bool) -> Any:
    """The loss ``--loss tests.door_fuzz:loss`` names: CleanRL's, with one contract of ``DOOR_FUZZ``'s broken."""
    spec = _spec()
    if misbehaves(spec, "loss"):
        fail(spec)
    value, info = ppo_eqx.model_loss(model, minibatch, hyperparameters, prepared=prepared)
    reported: Any = info._asdict()
    kind = spec["break"]
    if kind == "shape":
        value = value * jnp.ones(spec["extra"])
    elif kind == "dtype":
        value = value.astype(spec["dtype"])
    elif kind == "returns":
        return {"loss": value, "tuple1": (value,), "tuple3": (value, reported, 0), "list": [value, reported]}[
            spec["value"]
        ]
    elif kind == "reports":
        reported = {"str": "metrics", "list": [value], "none": None, "int": 3}[spec["value"]]
    elif kind == "metric_name":
        reported = {**reported, spec["name"]: value}
    elif kind == "metric_value":
        extra = {"str": "x", "array": jnp.ones(3), "none": None, "dict": {"a": 1}}[spec["value"]]
        reported = {**reported, "extra": extra}
    elif kind == "callback":
        value = _through(_counted)(value)
    elif kind == "value":
        value = _through(_not_finite_after)(value)
    elif kind == "not_differentiable":  # a host function without a derivative: jax cannot differentiate the loss
        value = jax.pure_callback(lambda x: x, jax.ShapeDtypeStruct((), jnp.float32), value)
    return value, reported


def _through(host: Any) -> Any:
    """``host``, a function of the loss's value on the host, called in the update; its derivative the identity's
    where its value is finite, that value where not (a loss gone NaN has a gradient gone NaN). The gradient depends on
    it, so that the update calls it (the loss's value itself the update drops)."""

    @jax.custom_jvp
    def called(x: jax.Array) -> jax.Array:
        return jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.float32), x)

    @called.defjvp
    def _(primals: Any, tangents: Any) -> Any:
        value = called(*primals)
        return value, tangents[0] * jnp.where(jnp.isfinite(value), 1.0, value)

    return called


_UPDATES = [0]


def _not_finite_after(x: Any) -> Any:
    _UPDATES[0] += 1
    spec = _spec()
    return np.float32(spec["value"]) if _UPDATES[0] >= spec["after"] else x


def loss_of_two(model: Any, minibatch: Any) -> Any:
    """A loss of the wrong signature: no hyperparameters, no ``prepared``."""
    return ppo_eqx.model_loss(model, minibatch, None, prepared=True)  # type: ignore[arg-type]


# --- backend -----------------------------------------------------------------------------------------------------


class Backend:
    """A backend of the user's that serves ``Clock``, with one contract of ``DOOR_FUZZ``'s broken."""

    name, rebinds, has_async, state_is_data = "fuzzed", True, False, True

    def __init__(self) -> None:
        self.fuzz = _spec()

    def spec(self, env_id: str) -> Any:
        if misbehaves(self.fuzz, "spec"):
            fail(self.fuzz)
        if self.fuzz["break"] == "returns" and self.fuzz["of"] == "spec":
            return {"none": None, "dict": {"obs_shape": (8,)}, "str": env_id}[self.fuzz["value"]]
        return ppo_eqx.JaxEnv(clock()).spec()

    def make(self, env_id: str, seeds: Any, **kwargs: Any) -> Any:
        if misbehaves(self.fuzz, "make"):
            fail(self.fuzz)
        if self.fuzz["break"] == "returns" and self.fuzz["of"] == "make":
            return {"none": None, "dict": {}, "str": env_id}[self.fuzz["value"]]
        return ppo_eqx.JaxEnv(clock()).make(env_id, seeds, **kwargs)

    def make_async(self, env_id: str, seeds: Any, batch_size: int, **kwargs: Any) -> Any:
        raise AssertionError("never called: has_async is False")


def backend() -> Backend:
    """Called by nobody: ``--env-backend`` names an object, ``backend_object`` below."""
    return Backend()


class _Lazy:
    """The backend object ``--env-backend tests.door_fuzz:backend_object`` names, made on first use (``DOOR_FUZZ`` is
    read then, not at import)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(Backend(), name)


backend_object = _Lazy()


# --- network and optimizer ---------------------------------------------------------------------------------------


def network(spec: Any, key: jax.Array) -> Any:
    """The model factory ``--network tests.door_fuzz:network`` names."""
    fuzz = _spec()
    if misbehaves(fuzz, "network"):
        fail(fuzz)
    if fuzz["break"] == "returns":
        return {"none": None, "int": 3, "str": "model", "params": {"w": jnp.ones(3)}}[fuzz["value"]]
    if fuzz["break"] == "sizes":  # a model of another task's observations and actions
        other = ppo_eqx.EnvSpec(**{**spec._asdict(), "num_actions": spec.num_actions + fuzz["extra"]})
        return ppo_eqx.default_model(other, key)
    return ppo_eqx.default_model(spec, key)


def optimizer(hyperparameters: Any, sizes: Any) -> Any:
    """The optimizer factory ``--optimizer tests.door_fuzz:optimizer`` names."""
    fuzz = _spec()
    if misbehaves(fuzz, "optimizer"):
        fail(fuzz)
    if fuzz["break"] == "returns":
        return {"none": None, "adam": optax.adam, "str": "adam", "tuple": (optax.sgd(0.1),)}[fuzz["value"]]
    return optax.adam(2.5e-4)
