"""The host loop of ``--rollout-on host-envs``: EnvPool's envs stepped through its host API by actor threads, each
with its own pools, acting in batches on the default device (the accelerator; a policy of vectors on the host's
CPU, ``placement.act_device_for``); the rollout's steps gathered on the host, then moved to the learner whole.

Each actor thread steps its envs in (at most) two pools, halves, so that one half steps while the policy acts for
the other; with several actors (``actor_threads``, the Sebulba manner of DeepMind's Podracer and of Cleanba), one
actor's policy call is on the device while the others' envs step, and the host's cores stay busy. Each step, for
each half of an actor in turn: receive its envs' step, act on their observations on the device, send the actions
(``send`` returns at once). The act program returns the actions, log-probabilities and values in one array (one
transfer back a step), and the host writes them, with the observations the policy saw and the env's rewards and
dones, into buffers ``[T, N, ...]`` of its own; after ``num_steps`` steps one program takes them all (one transfer
to the device a rollout), counts the episodes, normalises the rewards (CleanRL's ``NormalizeReward``) and computes
GAE. (Buffers on the device written in place by the act program cost more on a TPU v5e than the policy itself:
docs/performance.md, "One TPU v5e".)

It computes what the one-program iteration computes (the same keys split in the same order, the same seeds, each
half's actions those of its rows of the whole batch: ``rollout``'s ``total_envs``), to float32 rounding: the policy
sees a half's rows at a time, in a program of its own. The update waits for the whole rollout, and the rollout for
the update: one set of parameters per rollout, as CleanRL's PPO.
"""

import concurrent.futures
import functools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, PRNGKeyArray, UInt32

from ..core._types import Batch, EnvOutput, EpisodeStats
from ..core.envs import HostPool
from ..core.envs.normalize import Moments, NormalizedHandle, observed, scaled_rewards
from ..core.networks import Policy
from ..core.rollout import RolloutCarry, act, compute_gae, count_step
from .compiled import own_jit, same_static

HOST_ROWS = {
    "reward": np.float32,
    "done": np.bool_,
    "raw_reward": np.float32,
    "game_over": np.bool_,
    "truncated": np.bool_,
}
"""What the host keeps of each env step from the env: rows ``[T, N]``."""
Rows = dict[str, np.ndarray]
"""A rollout's host buffers: ``HOST_ROWS``' ``[T, N]``, and from the policy ``obs`` ``[T, N, ...]`` (as the policy
saw them), ``actions`` and ``logprob_value`` ``[T, N, 2]``."""


class ActPrograms:
    """The programs a host loop runs, shared by every segment of a run (they hold no envs): ``keys`` (a rollout's
    step keys, once), ``act`` (one half's step on the device: its actions, log-probabilities and values in one
    array, one transfer back), ``observe`` (a rollout's last observations counted and scaled, where they are
    normalised) and ``stack`` (the rollout's rows moved to the device at once, its episodes counted, its rewards
    normalised, GAE). ``normalize``: ``host_envs.Normalizing`` or None."""

    def __init__(self, pool_sizes: list[int], *, num_steps: int, device: Any, normalize: Any, act_device: Any = None):
        self.device, self.normalize, self.num_steps = device, normalize, num_steps
        # Where ``act`` runs: the learner's device, or the host's CPU (``placement.act_device_for``); the model's
        # leaves and the observations' statistics are moved there once a rollout, and back after it.
        self.act_device = device if act_device is None else act_device
        total = sum(pool_sizes) if len(pool_sizes) > 1 else None
        # The model is flattened once a rollout and ``act`` takes its leaves: a jitted function of the model itself
        # would flatten it and compare its structure at every call, most of a step's time on a CPU.
        self.structure: tuple[Any, Any] | None = None
        self.impl: Any = None
        # A trace for each size of pool, and one more where ``act`` also counts and scales observations.
        traces, most = [0], len(set(pool_sizes)) + int(normalize is not None and normalize.obs)

        def policy(
            leaves: list[Array], moments: Moments | None, obs: Any, key_data: Any, first: Any
        ) -> tuple[Moments | None, Array, Array, Float[Array, "N 2"]]:
            if self.structure is None:
                raise RuntimeError("the host loop's act program was called before the model's leaves")
            if moments is not None:  # a step's raw observations: counted, then scaled, as ``normalize_pool`` does
                moments, obs = observed(moments, jnp.asarray(obs, jnp.float32))
            treedef, static = self.structure
            model = eqx.combine(jax.tree.unflatten(treedef, leaves), static)
            step_key = jax.random.wrap_key_data(key_data, impl=self.impl)  # step t's, as ``rollout`` splits its key
            action, logprob, value = act(model, obs, step_key, first_env=first, total_envs=total)
            return moments, obs, action, jnp.stack([logprob, value], axis=-1)

        def act_on(
            leaves: list[Array], moments: Moments | None, obs: Any, step: UInt32[Array, " S"]
        ) -> tuple[Moments | None, Float[Array, "n K"]]:
            """The step's actions, log-probabilities and values (and where observations are normalised, the scaled
            observations), packed in one float32 array ``[n, K]``: one transfer back to the host a step. Writing
            them into buffers on the device costs more there than the whole policy (a TPU v5e: an uint8 frame buffer
            updated in place 4.7 ms a call against 1.1 ms without it). ``step``: the step key's data and the pool's
            first row, one array (``steps``): one transfer fewer a call."""
            traces[0] += 1
            if traces[0] > most:
                raise RuntimeError(f"the host loop's act program was traced {traces[0]} times, at most {most}")
            moments, seen, action, logprob_value = policy(leaves, moments, obs, step[:-1], step[-1].astype(jnp.int32))
            rows = [action.reshape(action.shape[0], -1).astype(jnp.float32), logprob_value]  # int32 < 2**24: exact
            if moments is not None:
                rows.append(seen.reshape(seen.shape[0], -1))
            return moments, jnp.concatenate(rows, axis=-1)

        def step_keys(key: PRNGKeyArray) -> Array:
            return jax.random.key_data(jax.random.split(key, num_steps))

        self._policy = policy
        self.act = jax.jit(act_on)
        self._keys = jax.jit(step_keys)
        self.observe = jax.jit(observed)
        self.stack = own_jit(functools.partial(_stacked, normalize=normalize))

    def steps(self, key: PRNGKeyArray, firsts: list[int]) -> UInt32[np.ndarray, "P T K"]:
        """What ``act`` takes for each pool and step besides the observations, on the host: ``[p, t]`` is the data of
        ``rollout``'s step key t for ``key`` and, last, pool p's first row (``firsts[p]``). One argument rather than
        two: each array a jitted call is given is a transfer of its own (on the 2-core AMD EPYC, a call of a small
        program with three NumPy arguments 56-65 us, with one 43-47)."""
        self.impl = jax.random.key_impl(key)
        key_data = np.asarray(self._keys(key))
        steps = np.empty((len(firsts), *key_data.shape[:-1], key_data.shape[-1] + 1), np.uint32)
        steps[..., :-1] = key_data
        steps[..., -1] = np.asarray(firsts, np.uint32)[:, None]
        return steps

    def leaves(self, model: Policy) -> list[Array]:
        """``model``'s array leaves on the act device, its structure (the same at every call) kept for ``act``."""
        params, static = eqx.partition(model, eqx.is_array)
        leaves, treedef = jax.tree.flatten(params)
        if self.structure is None:
            self.structure = (treedef, static)
        elif self.structure[0] != treedef or not same_static(self.structure[1], static):
            raise RuntimeError("the host loop's act program was called with another model's structure")
        return self.to_act(leaves)

    def to_act(self, tree: Any) -> Any:
        """``tree`` on the act device (as it is, where that is the learner's)."""
        return tree if self.act_device == self.device else jax.device_put(tree, self.act_device)

    def to_learner(self, tree: Any) -> Any:
        """``tree`` on the learner's device (as it is, where the act device is that one)."""
        return tree if self.act_device == self.device else jax.device_put(tree, self.device)

    def policy_rows(self, leaves: list[Array], step: np.ndarray, first_obs: np.ndarray) -> dict[str, Any]:
        """The shapes of what the policy gives for ``first_obs`` (one pool's; ``step``, a row of ``steps``): the
        observations it saw, its actions and ``logprob_value``, each a ``jax.ShapeDtypeStruct`` of one step's rows."""
        _, seen, action, logprob_value = jax.eval_shape(self._policy, leaves, None, first_obs, step[:-1], 0)
        if self.normalize is not None and self.normalize.obs:
            seen = jax.ShapeDtypeStruct(seen.shape, jnp.float32)
        return {"obs": seen, "actions": action, "logprob_value": logprob_value}


class HostLoop:
    """The envs of one segment: ``actors``, each a list of (at most two) ``HostPool`` halves, their envs in row
    order; called as a collector's ``collect``: the host loop of one rollout, each actor in a thread of its own
    (inline where there is one), then ``programs.stack`` on what they gathered."""

    def __init__(self, actors: list[list[HostPool]], programs: ActPrograms, *, num_steps: int):
        self.programs, self.num_steps = programs, num_steps
        self.pools = [pool for group in actors for pool in group]
        sizes = [int(pool.first_obs.shape[0]) for pool in self.pools]
        self.rows = [slice(sum(sizes[:p]), sum(sizes[: p + 1])) for p in range(len(self.pools))]
        firsts = np.cumsum([0] + [len(group) for group in actors])
        self.actors = [list(range(int(a), int(b))) for a, b in zip(firsts[:-1], firsts[1:], strict=True)]
        self.total = sum(sizes)
        self.obs = [pool.first_obs for pool in self.pools]
        self.host: Rows | None = None
        self.action_width = 0  # the actions' columns of ``act``'s packed array (1 for a discrete action)
        self._threads = (
            concurrent.futures.ThreadPoolExecutor(len(actors), thread_name_prefix="ppo-eqx-actor")
            if len(actors) > 1
            else None
        )

    @property
    def first_obs(self) -> np.ndarray:
        return np.concatenate([pool.first_obs for pool in self.pools])

    def _act_and_send(
        self, p: int, t: int, leaves: list[Array], moments: Moments | None, obs: Any, step: np.ndarray
    ) -> Moments | None:
        """Pool ``p``'s step ``t``: act on ``obs`` (raw, counted and scaled first where ``moments`` are given), send
        the actions, and write the step's rows into the host's buffers (after ``act`` has returned: the program
        that read the last rollout's buffers is done by then, since ``act`` waited for the update after it)."""
        host = self.host
        assert host is not None
        moments, packed = self.programs.act(leaves, moments, obs, step)
        packed = np.asarray(packed)
        rows, width, taken = self.rows[p], self.action_width, host["actions"]
        actions = packed[:, :width].astype(taken.dtype).reshape(-1, *taken.shape[2:])
        self.pools[p].send(actions)
        taken[t, rows] = actions
        host["logprob_value"][t, rows] = packed[:, width : width + 2]
        seen = obs if moments is None else packed[:, width + 2 :].reshape(-1, *host["obs"].shape[2:])
        host["obs"][t, rows] = seen
        return moments

    def _actor(
        self, pools: list[int], leaves: list[Array], steps: np.ndarray, moments: Moments | None, first: Any
    ) -> Moments | None:
        """One actor's rollout over its ``pools``: each acts for step t + 1 as soon as its step t is received,
        while the actor's other pool steps. ``first``: the rollout's first observations where they are normalised
        (one pool: the carry's, counted and scaled already), else None (each pool's last)."""
        host, count = self.host, self.num_steps
        assert host is not None
        for p in pools:
            self._act_and_send(p, 0, leaves, None, self.obs[p] if first is None else first, steps[p, 0])
        for t in range(count):
            for p in pools:
                out: EnvOutput = self.pools[p].recv()
                for name in HOST_ROWS:
                    host[name][t, self.rows[p]] = getattr(out, name)
                self.obs[p] = np.asarray(out.obs)
                if t + 1 < count:
                    moments = self._act_and_send(p, t + 1, leaves, moments, self.obs[p], steps[p, t + 1])
        return moments

    def __call__(
        self, model: Policy, carry: RolloutCarry, key: PRNGKeyArray, *, gamma: Any, gae_lambda: Any
    ) -> tuple[RolloutCarry, Batch]:
        """``Collector.collect``: one rollout with ``key`` (``rollout``'s), its batch with GAE. Where observations
        are normalised (one actor, one pool), ``act`` counts and scales each step's as it comes back (the rollout's
        first are ``carry.obs``, counted and scaled already)."""
        programs = self.programs
        leaves, steps = self._ready(model, key)
        observing = isinstance(carry.handle, NormalizedHandle) and programs.normalize.obs
        moments: Moments | None = programs.to_act(carry.handle.obs) if observing else None
        first = np.asarray(carry.obs) if observing else None
        if self._threads is None:
            moments = self._actor(self.actors[0], leaves, steps, moments, first)
        else:  # normalised observations have one actor: no moments cross the threads
            futures = [self._threads.submit(self._actor, pools, leaves, steps, None, None) for pools in self.actors]
            for future in futures:
                future.result()
        if moments is not None:
            moments, last_obs = programs.to_learner(programs.observe(moments, self.obs[0]))
            handle = carry.handle._replace(obs=moments)
        else:
            last_obs, handle = jax.device_put(np.concatenate(self.obs), programs.device), carry.handle
        # jax may read the host's NumPy buffers in place: they are written again only after the next rollout's first
        # ``act`` has returned, and it waits for the update that waits for this program.
        return programs.stack(model, carry.stats, handle, self.host, last_obs, gamma, gae_lambda)

    def _ready(self, model: Policy, key: PRNGKeyArray) -> tuple[list[Array], np.ndarray]:
        """What ``act`` takes for a rollout with ``key``: ``model``'s leaves on the act device and each pool's
        ``steps``; and the host buffers of a rollout's steps, made once: the env's rows and the policy's."""
        leaves, steps = self.programs.leaves(model), self.programs.steps(key, [rows.start for rows in self.rows])
        if self.host is None:
            shapes = self.programs.policy_rows(leaves, steps[0, 0], self.obs[0])
            self.host = {name: np.zeros((self.num_steps, self.total), dtype) for name, dtype in HOST_ROWS.items()}
            for name, x in shapes.items():
                self.host[name] = np.zeros((self.num_steps, self.total, *x.shape[1:]), x.dtype)
            self.action_width = int(np.prod(shapes["actions"].shape[1:], dtype=np.int64))
        return leaves, steps

    def compile(self, model: Policy, carry: RolloutCarry, key: PRNGKeyArray, hyperparameters: Any) -> Any:
        """Compile ``act`` (for each size of pool), ``observe`` and ``stack`` for states like these; returns the
        shapes of what a call returns."""
        programs = self.programs
        leaves, steps = self._ready(model, key)
        # A call of ``act`` on zeros for each pool, as the loop calls it (``lower`` with shapes alone would compile
        # another entry of jax's caches than the call finds).
        for p, obs in enumerate(self.obs):
            programs.act(leaves, None, np.zeros_like(obs), steps[p, 0])
        handle = carry.handle
        if isinstance(handle, NormalizedHandle) and programs.normalize and programs.normalize.obs:
            zeros, moments = np.zeros_like(self.obs[0]), programs.to_act(handle.obs)
            programs.act(leaves, moments, zeros, steps[0, 0])
            programs.observe(moments, zeros)
        h = hyperparameters
        args = (model, carry.stats, handle, self.host, carry.obs, h.gamma, h.gae_lambda)
        programs.stack.compile(*args)
        on_device = jax.sharding.SingleDeviceSharding(programs.device)  # as the stacking program's outputs are
        shapes = jax.eval_shape(functools.partial(_stacked, normalize=programs.normalize), *args)
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_device), shapes)

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True)
        for pool in self.pools:
            pool.close()


def _stacked(
    model: Policy,
    stats: EpisodeStats,
    handle: Any,
    host: dict[str, Array],
    last_obs: Array,
    gamma: Any,
    gae_lambda: Any,
    *,
    normalize: Any,
) -> tuple[RolloutCarry, Batch]:
    """The rollout's steps (``HostLoop``'s host buffers, ``Rows``, moved to the device in one call) as ``rollout``
    returns them, its episodes counted, its rewards normalised (where ``normalize.reward``, as ``normalize_pool``
    does, step by step) and GAE computed (``collect``)."""
    logprobs, values = host["logprob_value"][..., 0], host["logprob_value"][..., 1]

    def count(stats: EpisodeStats, row: tuple[Float[Array, " N"], Bool[Array, " N"]]) -> tuple[EpisodeStats, None]:
        return count_step(stats, *row), None

    stats, _ = jax.lax.scan(count, stats, (host["raw_reward"], host["game_over"]))
    rewards = host["reward"]
    if normalize is not None and normalize.reward:

        def scale(carry: tuple[Moments, Array], row: tuple[Array, Array, Array]) -> tuple[tuple[Moments, Array], Array]:
            reward, done, truncated = row
            moments, discounted, scaled = scaled_rewards(*carry, reward, done & ~truncated, gamma=normalize.gamma)
            return (moments, discounted), scaled

        (return_moments, discounted), rewards = jax.lax.scan(
            scale, (handle.returns, handle.discounted), (rewards, host["done"], host["truncated"])
        )
        handle = handle._replace(returns=return_moments, discounted=discounted)
    _, last_value = model(last_obs)
    advantages, returns = compute_gae(rewards, values, host["done"], last_value, gamma=gamma, gae_lambda=gae_lambda)
    batch = Batch(host["obs"], host["actions"], logprobs, values, advantages, returns)
    return RolloutCarry(handle, last_obs, stats), batch
