"""TrainState, the one jitted PPO iteration (rollout, GAE, update), and the host loop."""

import time
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree

from ._types import Batch
from .config import PPOConfig
from .envs import EnvSpec, EnvStep, make_env
from .gae import compute_gae
from .networks import ActorCritic
from .rollout import RolloutCarry, init_episode_stats, rollout
from .update import current_learning_rate, make_optimizer, update

Metrics = dict[str, Float[Array, ""]]


class TrainState(eqx.Module):
    """Everything one iteration reads and writes. ``iteration`` counts finished iterations."""

    model: ActorCritic
    opt_state: PyTree
    carry: RolloutCarry
    key: PRNGKeyArray
    iteration: Int[Array, ""]


def init_train_state(
    config: PPOConfig, spec: EnvSpec, handle: Any, first_obs: np.ndarray, optimizer: optax.GradientTransformation
) -> TrainState:
    key, model_key = jax.random.split(jax.random.PRNGKey(config.seed))
    model = ActorCritic(spec.obs_shape, spec.num_actions, conv_impl=config.conv_impl, key=model_key)
    carry = RolloutCarry(handle, jnp.asarray(first_obs), init_episode_stats(config.num_envs))
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
    return TrainState(model, opt_state, carry, key, jnp.zeros((), jnp.int32))


def make_iteration(
    config: PPOConfig, env_step: EnvStep, optimizer: optax.GradientTransformation
) -> Callable[[TrainState], tuple[TrainState, Metrics]]:
    """The pure PPO iteration: ``num_steps`` env steps, GAE, ``update_epochs`` epochs of minibatch steps.

    Metrics follow CleanRL: the losses are those of the last minibatch step, ``clip_fraction`` is the mean
    over all steps, ``episodic_return``/``episodic_length`` the mean over envs of each env's last finished
    episode (NaN until one has finished).
    """

    def iteration(state: TrainState) -> tuple[TrainState, Metrics]:
        key, rollout_key, update_key = jax.random.split(state.key, 3)
        carry, transitions, last_value = rollout(
            state.model, env_step, state.carry, num_steps=config.num_steps, key=rollout_key
        )
        advantages, returns = compute_gae(
            transitions.rewards,
            transitions.values,
            transitions.dones,
            last_value,
            gamma=config.gamma,
            gae_lambda=config.gae_lambda,
        )
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        batch = Batch(
            flat(transitions.obs),
            flat(transitions.actions),
            flat(transitions.logprobs),
            flat(transitions.values),
            flat(advantages),
            flat(returns),
        )
        model, opt_state, infos = update(
            state.model,
            state.opt_state,
            batch,
            optimizer=optimizer,
            num_minibatches=config.num_minibatches,
            update_epochs=config.update_epochs,
            clip_coef=config.clip_coef,
            vf_coef=config.vf_coef,
            ent_coef=config.ent_coef,
            norm_adv=config.norm_adv,
            clip_vloss=config.clip_vloss,
            unroll=config.minibatch_unroll,
            key=update_key,
        )
        stats = carry.stats
        finished = jnp.isfinite(stats.returned_episode_returns)
        any_finished = jnp.any(finished)
        metrics = {
            "episodic_return": jnp.where(any_finished, jnp.nanmean(stats.returned_episode_returns), jnp.nan),
            "episodic_length": jnp.where(any_finished, jnp.nanmean(stats.returned_episode_lengths), jnp.nan),
            "learning_rate": current_learning_rate(opt_state),
            "loss": infos.loss[-1],
            "policy_loss": infos.policy_loss[-1],
            "value_loss": infos.value_loss[-1],
            "entropy": infos.entropy[-1],
            "approx_kl": infos.approx_kl[-1],
            "clip_fraction": infos.clip_fraction.mean(),
        }
        return TrainState(model, opt_state, carry, key, state.iteration + 1), metrics

    return iteration


class Trainer:
    """Owns the EnvPool, the optimizer and the compiled iteration; ``state`` is the only thing that changes.

    ``step()`` runs one jitted iteration. The iteration is traced once: a retrace (a changed shape or
    dtype in the state) raises instead of silently recompiling.
    """

    def __init__(self, config: PPOConfig):
        self.config = config.validate()
        self.spec, handle, env_step, self._pool, first_obs = make_env(config)
        self.optimizer = make_optimizer(config)
        self.state = init_train_state(config, self.spec, handle, first_obs, self.optimizer)
        iteration = eqx.debug.assert_max_traces(make_iteration(config, env_step, self.optimizer), max_traces=1)
        self._iteration = eqx.filter_jit(iteration, donate="all")

    def compile(self) -> float:
        """Compile the iteration ahead of the first step; returns the seconds it took."""
        start = time.perf_counter()
        self._iteration.lower(self.state).compile()
        return time.perf_counter() - start

    def step(self) -> Metrics:
        self.state, metrics = self._iteration(self.state)
        return metrics


def train(config: PPOConfig, *, num_iterations: int | None = None) -> Iterator[dict[str, float]]:
    """Train with ``config``, yielding one dict of host-side metrics per iteration.

    Each dict holds ``iteration``, ``global_step``, ``sps`` (env steps per second of this iteration),
    ``time_elapsed`` (seconds since the trainer was built, compilation included) and the iteration's
    metrics as floats. The final state is ``Trainer.state``; use ``Trainer`` directly to keep it.
    """
    trainer = Trainer(config)
    yield from run(trainer, num_iterations=num_iterations)


def run(trainer: Trainer, *, num_iterations: int | None = None) -> Iterator[dict[str, float]]:
    """The host loop over ``trainer.step()``; stops after ``config.num_iterations`` in all."""
    config = trainer.config
    start = time.perf_counter()
    last = start
    total = config.num_iterations if num_iterations is None else num_iterations
    while int(trainer.state.iteration) < total:
        metrics = jax.device_get(trainer.step())
        now = time.perf_counter()
        iteration = int(trainer.state.iteration)
        record = {"iteration": iteration, "global_step": iteration * config.batch_size}
        record["sps"] = config.batch_size / (now - last)
        record["time_elapsed"] = now - start
        record.update({name: float(value) for name, value in metrics.items()})
        last = now
        yield record
