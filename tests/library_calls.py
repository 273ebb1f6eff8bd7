"""Calls of ppo_eqx's public functions as a user's script makes them: run as a script, in a process of its own,
so that pytest's jaxtyping import hook (``--jaxtyping-packages`` in pyproject's addopts) does not check them.

    python tests/library_calls.py CASES.json RESULTS.json

CASES.json maps a case's name to a Python expression, evaluated with the names defined here; RESULTS.json maps
it to ``{"raised": null}`` or ``{"raised": "TypeError", "message": ..., "where": FILE:LINE}`` (the frame that
raised it, jax's internal frames shown). test_library_checks.py holds the cases.
"""

import dataclasses
import json
import os
import sys
import traceback
from typing import Any

os.environ["JAX_TRACEBACK_FILTERING"] = "off"  # an error's last frame is where it was raised, inside jax or not

import equinox as eqx
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from ppo_eqx import (
    ActorCritic,
    AgentHyperparameters,
    Batch,
    EnvOutput,
    EnvSpec,
    Pool,
    PPOConfig,
    RolloutCarry,
    compute_gae,
    init_episode_stats,
    make_iteration,
    make_optimizer,
    ppo_loss,
    rollout,
    sync_collector,
    update,
)

T, N, B, A, D = 8, 4, 16, 3, 4
"""Steps, envs, minibatch, actions, features of a vector observation."""
KEY = jax.random.PRNGKey(0)


def f32(*shape: int) -> jax.Array:
    return jnp.linspace(0.1, 0.9, int(np.prod(shape)), dtype=jnp.float32).reshape(shape)


def i32(*shape: int, value: int = 1) -> jax.Array:
    return jnp.full(shape, value, jnp.int32)


def no(*shape: int) -> jax.Array:
    return jnp.zeros(shape, bool)


vector_model = ActorCritic((D,), A, key=KEY)
frame_model = ActorCritic((4, 84, 84), A, conv_impl="matmul", key=KEY)
frames = jnp.zeros((2, 4, 84, 84), jnp.uint8)


def gae(**changes: Any) -> Any:
    args: dict[str, Any] = {"rewards": f32(T, N), "values": f32(T, N), "dones": no(T, N), "last_value": f32(N)}
    kwargs: dict[str, Any] = {"gamma": 0.99, "gae_lambda": 0.95}
    for name, value in changes.items():
        (args if name in args else kwargs)[name] = value
    return compute_gae(**args, **kwargs)


CONFIG = PPOConfig(env_id="CartPole-v1", num_envs=N, num_steps=T, num_minibatches=2, total_timesteps=4 * N * T)
HYPERPARAMETERS = CONFIG.agent_hyperparameters()
"""One agent's hyperparameters, scalar arrays (CartPole's clip_coef 0.2, vf_coef 0.5, ent_coef 0.01)."""


def hyperparameters(**changes: Any) -> AgentHyperparameters:
    """``HYPERPARAMETERS`` with some fields replaced, as a user's script replaces them."""
    return dataclasses.replace(HYPERPARAMETERS, **changes)


def loss(**changes: Any) -> Any:
    args: dict[str, Any] = {
        name: f32(B)
        for name in ("new_logprob", "new_value", "entropy", "old_logprob", "old_value", "advantages", "returns")
    }
    settings = {name: value for name, value in changes.items() if name not in args}
    args.update({name: value for name, value in changes.items() if name in args})
    return ppo_loss(**args, hyperparameters=hyperparameters(**settings))


def value_loss_when_values_are_the_returns(values: jax.Array, returns: jax.Array) -> float:
    _, info = loss(new_value=values, returns=returns)
    return float(info.value_loss)


def fake_env_step(handle: jax.Array, actions: jax.Array, obs_size: int = D) -> tuple[jax.Array, EnvOutput]:
    """N envs whose episodes last 3 steps; the observation counts the steps."""
    counter = handle + 1
    obs = jnp.broadcast_to(counter[:, None].astype(jnp.float32), (N, obs_size))
    reward = (actions == 0).astype(jnp.float32)
    done = counter % 3 == 0
    return counter, EnvOutput(obs, reward, done, reward, done, done & False, obs)


def carry(obs: jax.Array | None = None) -> RolloutCarry:
    return RolloutCarry(jnp.zeros(N, jnp.int32), f32(N, D) if obs is None else obs, init_episode_stats(N))


def roll(**changes: Any) -> Any:
    args: dict[str, Any] = {"model": vector_model, "env_step": fake_env_step, "carry": carry()}
    kwargs: dict[str, Any] = {"num_steps": T, "key": KEY}
    for name, value in changes.items():
        (args if name in args else kwargs)[name] = value
    return rollout(args["model"], args["env_step"], args["carry"], **kwargs)


def batch(**changes: Any) -> Batch:
    fields = {
        "obs": f32(B, D),
        "actions": i32(B),
        "logprobs": f32(B),
        "values": f32(B),
        "advantages": f32(B),
        "returns": f32(B),
    }
    return Batch(**{**fields, **changes})


OPT_STATE = make_optimizer(HYPERPARAMETERS, CONFIG.sizes).init(eqx.filter(vector_model, eqx.is_array))


def learn(**changes: Any) -> Any:
    """``update`` of ``batch()`` in 2 minibatches, 2 epochs; a change of ``num_minibatches`` or ``update_epochs``
    goes into ``sizes``."""
    args: dict[str, Any] = {"model": vector_model, "opt_state": OPT_STATE, "batch": batch()}
    kwargs: dict[str, Any] = {"sizes": CONFIG.sizes._replace(update_epochs=2), "key": KEY}
    for name, value in changes.items():
        if name in args:
            args[name] = value
        elif name in kwargs["sizes"]._fields:
            kwargs["sizes"] = kwargs["sizes"]._replace(**{name: value})
        else:
            kwargs[name] = value
    return update(args["model"], args["opt_state"], args["batch"], HYPERPARAMETERS, **kwargs)


def iteration(**changes: Any) -> Any:
    spec = EnvSpec("CartPole-v1", (D,), np.dtype(np.float32), A, "vector")
    pool = Pool(spec, jnp.zeros(N, jnp.int32), fake_env_step, np.ones((N, D), np.float32), lambda: None, None)  # type: ignore[arg-type]
    args: dict[str, Any] = {"collector": sync_collector(pool, num_steps=T), "sizes": CONFIG.sizes}
    args.update(changes)
    return make_iteration(args["collector"], args["sizes"])


def callbacks_in(fn: Any, *args: Any) -> list[str]:
    """The primitives of ``fn``'s jaxpr that call back into Python at run time (a check that is not free)."""
    jaxpr = jax.make_jaxpr(fn)(*args)
    found = []

    def visit(jaxpr: Any) -> None:
        for equation in jaxpr.eqns:
            if "callback" in equation.primitive.name or "check" in equation.primitive.name:
                found.append(equation.primitive.name)
            for sub in jax.extend.core.jaxprs_in_params(equation.params):
                visit(sub)

    visit(jaxpr.jaxpr)
    return found


def expect(condition: bool, what: str) -> None:
    """A good call's result, checked: a false ``condition`` is an error (``raised``) that the test reports."""
    if not condition:
        raise AssertionError(what)


def main() -> None:
    cases_path, results_path = sys.argv[1:]
    with open(cases_path) as file:
        cases = json.load(file)
    results = {}
    for name, expression in cases.items():
        try:
            jax.block_until_ready(eval(expression, globals()))
            results[name] = {"raised": None}
        except Exception as error:
            stack = traceback.extract_tb(error.__traceback__)
            results[name] = {
                "raised": type(error).__name__,
                "message": str(error)[:4000],
                "where": f"{stack[-1].filename}:{stack[-1].lineno}" if stack else "",
            }
    with open(results_path, "w") as out:
        json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
