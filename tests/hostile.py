"""User code that breaks one contract each, as the adversarial review wrote it outside ppo_eqx (issue 53): losses,
env factories and backends the command line must refuse in one line, before anything is written. Each is named on
the command line as ``tests.hostile:NAME``."""

import sys

import jax.numpy as jnp

import ppo_eqx

from .user_env import Corridor


def _clean(model, minibatch, hyperparameters, prepared):
    return ppo_eqx.model_loss(model, minibatch, hyperparameters, prepared=prepared)


def loss_not_scalar(model, minibatch, hyperparameters, *, prepared):
    loss, info = _clean(model, minibatch, hyperparameters, prepared)
    return loss * jnp.ones(3), info


def loss_integer(model, minibatch, hyperparameters, *, prepared):
    loss, info = _clean(model, minibatch, hyperparameters, prepared)
    return jnp.asarray(loss, jnp.int32), info


def loss_not_tuple(model, minibatch, hyperparameters, *, prepared):
    return _clean(model, minibatch, hyperparameters, prepared)[0]


def loss_raises(model, minibatch, hyperparameters, *, prepared):
    raise RuntimeError("the user's loss failed")


def loss_wrong_signature(model, minibatch):
    return _clean(model, minibatch, None, True)


def loss_string_metric(model, minibatch, hyperparameters, *, prepared):
    loss, info = _clean(model, minibatch, hyperparameters, prepared)
    return loss, {**info._asdict(), "note": "hello"}


def loss_builtin_name(model, minibatch, hyperparameters, *, prepared):
    loss, info = _clean(model, minibatch, hyperparameters, prepared)
    return loss, {**info._asdict(), "sps": loss}


def loss_not_differentiable(model, minibatch, hyperparameters, *, prepared):
    import jax

    loss, info = _clean(model, minibatch, hyperparameters, prepared)
    return jax.pure_callback(lambda x: x, jax.ShapeDtypeStruct((), jnp.float32), loss), info


def loss_exits(model, minibatch, hyperparameters, *, prepared):
    sys.exit(0)


def env_exits():
    sys.exit(3)


def env_interrupts():
    raise KeyboardInterrupt


def corridor():
    return Corridor()


class BackendSpecRaises:
    name, rebinds, has_async, state_is_data = "broken", True, False, True

    def spec(self, env_id):
        raise ValueError("no such task here")

    def make(self, env_id, seeds, **kwargs):
        raise AssertionError("unreachable")

    def make_async(self, env_id, seeds, batch_size, **kwargs):
        raise AssertionError("unreachable")


class BackendMakesNoPool(BackendSpecRaises):
    def spec(self, env_id):
        return ppo_eqx.JaxEnv(Corridor()).spec()

    def make(self, env_id, seeds, **kwargs):
        return "a pool"


class BackendExits(BackendSpecRaises):
    def spec(self, env_id):
        sys.exit(0)


spec_raises, makes_no_pool, exits = BackendSpecRaises(), BackendMakesNoPool(), BackendExits()


class ExitsWhenStepped(Corridor):
    """An env whose step calls sys.exit while it is traced (the door's probe of the env runs it)."""

    def step(self, key, state, action, params):
        sys.exit(0)


def env_exits_when_stepped():
    return ExitsWhenStepped()


class LateNaN(Corridor):
    """The corridor whose reward is NaN at an episode's 45th step: its first 32 steps (the door's probe) are finite."""

    def step(self, key, state, action, params):
        obs, next_state, reward, done, info = super().step(key, state, action, params)
        return obs, next_state, jnp.where(state.time == 44, jnp.nan, reward), done, info


def late_nan():
    return LateNaN()


_CALLS = [0]


def _count(x):
    """A host function the env calls every step: it fails on its 600th call, mid-run."""
    _CALLS[0] += 1
    if _CALLS[0] >= 600:
        raise ValueError(f"the user's env failed at call {_CALLS[0]}")
    return x


class FailsMidRun(Corridor):
    """The corridor whose step calls back to the host, which raises once the run is under way."""

    def step(self, key, state, action, params):
        import jax

        obs, next_state, reward, done, info = super().step(key, state, action, params)
        reward = jax.pure_callback(_count, jax.ShapeDtypeStruct((), jnp.float32), reward, vmap_method="sequential")
        return obs, next_state, reward, done, info


def fails_mid_run():
    return FailsMidRun()
