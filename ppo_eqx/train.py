"""TrainState, the one jitted PPO iteration (rollout, GAE, update), and the host loop.

The envs of a run live in segments of ``config.checkpoint_every`` iterations: each segment's envs are made
afresh and seeded from (seed, first iteration of the segment) alone, so a run restored from a checkpoint at a
segment boundary goes on exactly as the uninterrupted run did.
"""

import concurrent.futures
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from ._types import Batch, EpisodeStats
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


class Checkpoint(eqx.Module):
    """What a checkpoint holds: the TrainState less the envs (EnvPool's state cannot be saved).

    ``stats`` keeps the last finished episode of every env; its running episodes are dropped on restore, as
    the envs are made afresh.
    """

    model: ActorCritic
    opt_state: PyTree
    key: PRNGKeyArray
    stats: EpisodeStats
    iteration: Int[Array, ""]


def segment_env_seeds(seed: int, iteration: int, num_envs: int) -> list[int] | None:
    """EnvPool seeds of the envs that play from ``iteration`` on, a function of ``(seed, iteration)`` only.

    ``None`` for iteration 0: EnvPool's own seeding (env i gets ``seed + i``), as CleanRL's script. Later
    segments draw ``num_envs`` seeds below 2**31 from NumPy's ``SeedSequence((seed, iteration))``.
    """
    if iteration == 0:
        return None
    entropy = [seed % 2**32, iteration]
    return [int(s) % 2**31 for s in np.random.SeedSequence(entropy).generate_state(num_envs)]


def fresh_episodes(stats: EpisodeStats) -> EpisodeStats:
    """Statistics for new envs: no running episode, the last finished ones kept."""
    return stats._replace(
        episode_returns=jnp.zeros_like(stats.episode_returns),
        episode_lengths=jnp.zeros_like(stats.episode_lengths),
    )


def init_train_state(
    config: PPOConfig, spec: EnvSpec, handle: Any, first_obs: np.ndarray, optimizer: optax.GradientTransformation
) -> TrainState:
    key, model_key = jax.random.split(jax.random.PRNGKey(config.seed))
    model = ActorCritic(spec.obs_shape, spec.num_actions, conv_impl=config.conv_impl, key=model_key)
    carry = RolloutCarry(handle, jnp.asarray(first_obs), init_episode_stats(config.num_envs))
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
    return TrainState(model, opt_state, carry, key, jnp.zeros((), jnp.int32))


def init_checkpoint(config: PPOConfig, spec: EnvSpec) -> Checkpoint:
    """A fresh run's checkpoint; under ``eqx.filter_eval_shape`` the "like" tree that a checkpoint loads into."""
    optimizer = make_optimizer(config)
    key, model_key = jax.random.split(jax.random.PRNGKey(config.seed))
    model = ActorCritic(spec.obs_shape, spec.num_actions, conv_impl=config.conv_impl, key=model_key)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
    return Checkpoint(model, opt_state, key, init_episode_stats(config.num_envs), jnp.zeros((), jnp.int32))


@eqx.filter_jit
def all_finite(tree: PyTree) -> Bool[Array, ""]:
    """True when every floating-point leaf of ``tree`` is finite (no NaN, no inf)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


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


class _Segment(NamedTuple):
    """The envs that play from iteration ``start`` on, and the iteration compiled against their pool."""

    start: int
    pool: Any
    handle: Any
    first_obs: np.ndarray
    iteration: Callable[[TrainState], tuple[TrainState, Metrics]]


class NonFiniteError(FloatingPointError):
    """The loss or the parameters became NaN or inf; ``record`` is the iteration's metrics."""

    def __init__(self, message: str, record: dict[str, Any]):
        super().__init__(message)
        self.record = record


class Trainer:
    """Owns the envs, the optimizer and the compiled iteration; ``state`` is the only thing that changes.

    ``step()`` runs one jitted iteration. After every ``config.checkpoint_every``-th iteration (but the last)
    the envs are replaced by new ones seeded from (seed, iteration) and reset; the running episodes are
    dropped from the statistics. EnvPool's XLA call is bound to one pool, so each segment of envs has its
    own compiled iteration; the next one is made and compiled in a background thread while the current
    segment runs. Each is traced once: a retrace (a changed shape or dtype in the state) raises instead of
    silently recompiling.

    ``restore`` continues from a checkpoint: its model, optimizer state, key, iteration and finished-episode
    statistics, with the envs of the segment that starts at its iteration. Call ``close()`` when done.
    """

    def __init__(self, config: PPOConfig, *, restore: Checkpoint | None = None):
        self.config = config.validate()
        self.optimizer = make_optimizer(config)
        start = 0 if restore is None else int(restore.iteration)
        self.spec, self._segment = self._make_envs(start)
        segment = self._segment
        state = init_train_state(config, self.spec, segment.handle, segment.first_obs, self.optimizer)
        if restore is not None:
            carry = RolloutCarry(segment.handle, jnp.asarray(segment.first_obs), fresh_episodes(restore.stats))
            state = TrainState(restore.model, restore.opt_state, carry, restore.key, restore.iteration)
        self.state = state
        # The state's shapes and dtypes in arrays that are never donated: later segments compile against it.
        self._example = jax.tree.map(lambda x: jnp.zeros_like(x) if eqx.is_array(x) else x, state)
        self._prefetch = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppo-eqx-envs")
        self._next: concurrent.futures.Future[_Segment] | None = None
        self._prepare_after(start)

    def _make_envs(self, start: int) -> tuple[EnvSpec, _Segment]:
        config = self.config
        spec, handle, env_step, pool, first_obs = make_env(
            config, env_seed=segment_env_seeds(config.seed, start, config.num_envs)
        )
        iteration = eqx.debug.assert_max_traces(make_iteration(config, env_step, self.optimizer), max_traces=1)
        return spec, _Segment(start, pool, jnp.asarray(handle), first_obs, eqx.filter_jit(iteration, donate="all"))

    def _make_compiled_envs(self, start: int) -> _Segment:
        _, segment = self._make_envs(start)
        segment.iteration.lower(self._example).compile()  # type: ignore[attr-defined]
        return segment

    def _prepare_after(self, start: int) -> None:
        """Make and compile the next segment's envs in the background, if the run gets there."""
        every = self.config.checkpoint_every
        next_start = (start // every + 1) * every
        if next_start < self.config.num_iterations:
            self._next = self._prefetch.submit(self._make_compiled_envs, next_start)

    def compile(self) -> float:
        """Compile the iteration ahead of the first step; returns the seconds it took."""
        start = time.perf_counter()
        self._segment.iteration.lower(self.state).compile()  # type: ignore[attr-defined]
        return time.perf_counter() - start

    def step(self) -> Metrics:
        self.state, metrics = self._segment.iteration(self.state)
        iteration = int(self.state.iteration)
        if iteration % self.config.checkpoint_every == 0 and iteration < self.config.num_iterations:
            self._new_envs(iteration)
        return metrics

    def _new_envs(self, iteration: int) -> None:
        if self._next is None:
            raise RuntimeError(f"no envs were prepared for iteration {iteration}")
        segment = self._next.result()
        if segment.start != iteration:
            raise RuntimeError(f"envs were prepared for iteration {segment.start}, not {iteration}")
        old, self._segment, self._next = self._segment, segment, None
        carry = RolloutCarry(segment.handle, jnp.asarray(segment.first_obs), fresh_episodes(self.state.carry.stats))
        self.state = eqx.tree_at(lambda s: s.carry, self.state, carry)
        old.pool.close()
        self._prepare_after(iteration)

    def checkpoint(self) -> Checkpoint:
        """The state to save now; the next ``step()`` donates its arrays, so save it before."""
        state = self.state
        return Checkpoint(state.model, state.opt_state, state.key, state.carry.stats, state.iteration)

    def finite(self) -> bool:
        """Whether the model and the optimizer state are free of NaN and inf."""
        return bool(all_finite((self.state.model, self.state.opt_state)))

    def close(self) -> None:
        """Stop preparing envs (waiting for a compile under way) and let the worker thread go."""
        if self._next is not None:
            self._next.cancel()
            self._next = None
        self._prefetch.shutdown(wait=True)


def train(config: PPOConfig, *, num_iterations: int | None = None) -> Iterator[dict[str, float]]:
    """Train with ``config``, yielding one dict of host-side metrics per iteration.

    Each dict holds ``iteration``, ``global_step``, ``sps`` (env steps per second of this iteration),
    ``time_elapsed`` (seconds since the trainer was built, compilation included) and the iteration's
    metrics as floats. The final state is ``Trainer.state``; use ``Trainer`` directly to keep it.
    """
    trainer = Trainer(config)
    try:
        yield from run(trainer, num_iterations=num_iterations)
    finally:
        trainer.close()


def run(trainer: Trainer, *, num_iterations: int | None = None) -> Iterator[dict[str, float]]:
    """The host loop over ``trainer.step()``; stops after ``config.num_iterations`` in all.

    Raises NonFiniteError (naming the iteration) instead of yielding an iteration whose loss or parameters
    are NaN or inf.
    """
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
        if not math.isfinite(record["loss"]):
            raise NonFiniteError(f"the loss is {record['loss']} at iteration {iteration}", record)
        if not trainer.finite():
            raise NonFiniteError(f"the parameters are not finite after iteration {iteration}", record)
        yield record
