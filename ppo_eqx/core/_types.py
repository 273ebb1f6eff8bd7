"""Shape vocabulary and the small containers that flow between modules.

Axes: ``T`` time, ``N`` envs, ``B`` minibatch, ``A`` actions, ``E`` epochs, ``M`` minibatches, ``S`` seeds,
``R`` the envs of one receive from an async pool (``async_batch_size`` of its ``N``).
``*obs`` stands for the observation shape of one env (``4 84 84`` for Atari frames).
"""

from typing import Any, Literal, NamedTuple

from jaxtyping import Array, Bool, Float, Int, Shaped

Observation = Shaped[Array, "N *obs"]
ObsKind = Literal["frames", "vector", "grid"]
"""What an observation is, which decides the network (``ActorCritic``) and the preset: ``frames``, Atari's
stacked screens ``[C, H, W]`` uint8; ``vector``, a flat float vector (CartPole); ``grid``, MinAtar's ``[H, W, C]``
0/1 floats."""


class EnvOutput(NamedTuple):
    """What one call of ``env_step`` returns besides the handle, for all ``N`` envs.

    ``done`` is the learning signal (a life lost, a game over or a time limit: nothing is bootstrapped past
    it); ``game_over`` ends the episode that is reported (all lives spent, or truncated) and ``raw_reward``
    is the unclipped game score that the reported return sums. ``truncated`` marks the dones that a time limit
    caused and a terminal state did not (False where both did); ``final_obs`` is the observation the step
    reached before any reset: ``obs`` itself where the backend resets on the next step (EnvPool, ALE) or the
    episode goes on. The two let a time limit be bootstrapped (``gae.truncation_bootstrap``).
    """

    obs: Observation
    reward: Float[Array, " N"]
    done: Bool[Array, " N"]
    raw_reward: Float[Array, " N"]
    game_over: Bool[Array, " N"]
    truncated: Bool[Array, " N"]
    final_obs: Observation


class EpisodeStats(NamedTuple):
    """Running and last finished episode return/length of each env (CleanRL's ``EpisodeStatistics``).

    ``returned_*`` are NaN for an env that has not finished an episode yet.
    """

    episode_returns: Float[Array, " N"]
    episode_lengths: Int[Array, " N"]
    returned_episode_returns: Float[Array, " N"]
    returned_episode_lengths: Float[Array, " N"]


class Transition(NamedTuple):
    """One rollout, time-major. ``dones[t]`` is True when the transition at step ``t`` ended its episode."""

    obs: Shaped[Array, "T N *obs"]
    actions: Int[Array, "T N"] | Float[Array, "T N A"]
    logprobs: Float[Array, "T N"]
    values: Float[Array, "T N"]
    rewards: Float[Array, "T N"]
    dones: Bool[Array, "T N"]


class AsyncTransition(NamedTuple):
    """One rollout of an async pool: at step ``t``, one transition of each of the ``R`` envs ``env_ids[t]``.

    ``obs``, ``actions``, ``logprobs`` and ``values`` are those of the action that was sent to the env (perhaps
    in the previous rollout); ``rewards`` and ``dones`` came back with its next observation, whose value
    (under the model of this rollout) is ``next_values``.
    """

    obs: Shaped[Array, "T R *obs"]
    actions: Int[Array, "T R"]
    logprobs: Float[Array, "T R"]
    values: Float[Array, "T R"]
    rewards: Float[Array, "T R"]
    dones: Bool[Array, "T R"]
    next_values: Float[Array, "T R"]
    env_ids: Int[Array, "T R"]


class Batch(NamedTuple):
    """A flat batch of transitions with their advantage estimates, the input of the PPO update."""

    obs: Shaped[Array, " B *obs"]
    actions: Int[Array, " B"] | Float[Array, "B A"]
    logprobs: Float[Array, " B"]
    values: Float[Array, " B"]
    advantages: Float[Array, " B"]
    returns: Float[Array, " B"]


class SequenceBatch(NamedTuple):
    """A recurrent policy's batch (``core.recurrent``): whole env sequences, time-major, with what replaying them
    needs. ``starts[t, n]`` is True where ``obs[t, n]`` begins an episode (the memory was reset before it), and
    ``memory`` is each env's memory before the sequence's first step (leaves ``[N, ...]``)."""

    obs: Shaped[Array, "T N *obs"]
    actions: Int[Array, "T N"] | Float[Array, "T N A"]
    logprobs: Float[Array, "T N"]
    values: Float[Array, "T N"]
    advantages: Float[Array, "T N"]
    returns: Float[Array, "T N"]
    starts: Bool[Array, "T N"]
    memory: Any


class LossInfo(NamedTuple):
    """Diagnostics of one PPO loss evaluation (scalars, or stacked over epochs and minibatches)."""

    loss: Float[Array, "*batch"]
    policy_loss: Float[Array, "*batch"]
    value_loss: Float[Array, "*batch"]
    entropy: Float[Array, "*batch"]
    approx_kl: Float[Array, "*batch"]
    clip_fraction: Float[Array, "*batch"]
