"""Play whole games with a trained model on envs of its own, and report the true game score."""

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PRNGKeyArray

from ..config import PPOConfig
from ..core._types import EpisodeStats
from ..core.envs import EnvBackend, EnvSpec, Pool, derived_seeds
from ..core.envs.jax_env import env_backend_of
from ..core.envs.normalize import NormalizedHandle, normalize_pool
from ..core.networks import Policy, conv_route_of
from ..core.recurrent import RecurrentPolicy
from ..core.rollout import RolloutCarry, init_episode_stats, update_episode_stats
from .compiled import own_jit
from .kernel_build import ready
from .named import backend_named

EVAL_STREAM = 2**32 - 1
"""Second word of the SeedSequence entropy of evaluation envs; training's segments use the iteration there."""

MAX_ENVS = 16
"""Envs played at once; each plays its share of the episodes, so that short games are not favoured."""


class Evaluation(NamedTuple):
    """Return (raw game score summed over all lives) and length in env steps of each episode, env-major."""

    returns: list[float]
    lengths: list[int]


def eval_env_seeds(seed: int, num_envs: int) -> list[int]:
    """Seeds of the evaluation envs: apart from every segment of training that shares ``seed``."""
    return derived_seeds(seed, EVAL_STREAM, num_envs)


def eval_key(seed: int) -> PRNGKeyArray:
    """The key of the evaluation's actions for ``seed`` (``ppo-eqx eval --seed SEED``): apart from training's."""
    return jax.random.fold_in(jax.random.PRNGKey(seed), EVAL_STREAM)


def episode_quotas(episodes: int, num_envs: int) -> list[int]:
    """How many episodes each env plays: ``episodes`` in all, as even as can be."""
    return [episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)]


def _eval_pool(
    chosen: EnvBackend, config: PPOConfig, seeds: list[int], render: bool, statistics: NormalizedHandle | None
) -> Pool:
    """The envs to play in, their observations normalised with ``statistics`` frozen where the run normalised."""
    pool = chosen.make(config.env_id, seeds, render=render)
    if not (config.normalize_obs or config.normalize_reward):
        return pool
    if statistics is None:
        raise ValueError(
            f"evaluate: {config.env_id} was trained on normalised observations; allowed: statistics=, the env "
            "handle of its checkpoint (ppo_eqx.host.evaluate.normalization_of)"
        )
    return normalize_pool(pool, gamma=config.gamma, obs=config.normalize_obs, reward=False, frozen=statistics)


def _action(model: Policy, outputs: Array, key: PRNGKeyArray, greedy: bool) -> Array:
    """The policy's action: sampled, or greedy (its distribution's mode: the argmax; a continuous policy's mean)."""
    return model.mode(outputs) if greedy else model.sample(key, outputs)[0]


def evaluate(
    model: Policy,
    config: PPOConfig,
    *,
    episodes: int,
    greedy: bool = False,
    on_frame: Callable[[np.ndarray], None] | None = None,
    env: Any = None,
    statistics: NormalizedHandle | None = None,
    seed: int,
    key: PRNGKeyArray,
) -> Evaluation:
    """Play ``episodes`` games of ``config.env_id`` with ``model``'s policy (sampled, or its argmax if ``greedy``).

    The envs are made as in training (Atari: episodic lives, clipped rewards) but seeded from ``seed`` apart
    from training's; an episode's return is the unclipped score summed until the game is over (all lives
    spent) or truncated, as training's ``episodic_return``. ``on_frame`` receives the screen
    (``[H, W, 3]`` uint8) before the first step and after every step of env 0's first game. ``env`` is the env
    object a config of ``PPOConfig.for_task(env)`` was made for (as ``Trainer`` takes it). A run that normalised its
    observations (``config.normalize_obs``) plays with the statistics it trained to, frozen: ``statistics``, the
    env handle of its checkpoint's carry (``normalization_of``); greedy continuous actions are the Gaussian's mean.
    A recurrent policy plays with a memory per env, reset where an episode begins (a lost life too, as in training).
    """
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes={episodes!r}; allowed: an integer >= 1")
    chosen = backend_named(config.env_backend) if env is None else env_backend_of(env, config.env_backend)
    check_plays(model, chosen.spec(config.env_id))
    ready(conv_route_of(model))
    num_envs = min(episodes, MAX_ENVS)
    quotas = episode_quotas(episodes, num_envs)
    pool = _eval_pool(chosen, config, eval_env_seeds(seed, num_envs), on_frame is not None, statistics)

    step = own_jit(_stepper(pool, greedy))  # freed with this call, and the pool with it: read below, synchronously
    carry = RolloutCarry(pool.handle, jnp.asarray(pool.first_obs), init_episode_stats(num_envs))
    if isinstance(model, RecurrentPolicy):
        carry = carry._replace(memory=model.initial_memory(num_envs), starts=jnp.ones((num_envs,), bool))
    finished = _play(step, model, carry, key, pool, quotas, on_frame)
    pool.close()
    games = [game for done in finished for game in done]
    return Evaluation([r for r, _ in games], [n for _, n in games])


def _stepper(pool: Any, greedy: bool) -> Callable[..., tuple[RolloutCarry, Any, EpisodeStats]]:
    """One step of every env of ``pool``: the policy's actions (sampled, or greedy), the envs' step, the episodes
    counted; a recurrent policy's memory carried, reset where an episode begins."""

    def act(model: Policy, carry: RolloutCarry, key: PRNGKeyArray) -> tuple[RolloutCarry, Any, EpisodeStats]:
        memory = None
        if isinstance(model, RecurrentPolicy) and carry.starts is not None:
            memory, outputs, _ = model.step(carry.memory, carry.obs, carry.starts)
        else:
            outputs, _ = model(carry.obs)
        handle, out = pool.step(carry.handle, _action(model, outputs, key, greedy))
        stats = update_episode_stats(carry.stats, out)
        starts = None if memory is None else out.done
        return RolloutCarry(handle, out.obs, stats, memory, starts), out.game_over, stats

    return act


def _play(
    step: Callable[..., tuple[RolloutCarry, Any, EpisodeStats]],
    model: Policy,
    carry: RolloutCarry,
    key: PRNGKeyArray,
    pool: Any,
    quotas: list[int],
    on_frame: Callable[[np.ndarray], None] | None,
) -> list[list[tuple[float, int]]]:
    """Each env's finished games (return, length) from stepping until env i has finished ``quotas[i]``; env 0's
    first game's screens to ``on_frame``, before the first step and after each."""
    finished: list[list[tuple[float, int]]] = [[] for _ in quotas]
    recording = on_frame is not None
    if on_frame is not None:
        on_frame(pool.render(0))
    while any(len(done) < quota for done, quota in zip(finished, quotas, strict=True)):
        key, step_key = jax.random.split(key)
        carry, game_over, stats = step(model, carry, step_key)
        over = np.asarray(game_over)
        if recording and on_frame is not None:
            on_frame(pool.render(0))
            recording = not over[0]
        if over.any():
            returns, lengths = np.asarray(stats.returned_episode_returns), np.asarray(stats.returned_episode_lengths)
            for i in np.flatnonzero(over):
                if len(finished[i]) < quotas[i]:
                    finished[i].append((float(returns[i]), int(lengths[i])))
    return finished


def normalization_of(checkpoint: Any) -> NormalizedHandle | None:
    """The observation and return statistics in a checkpoint's carry (a run with ``normalize_obs`` or
    ``normalize_reward``), else None."""
    handle = getattr(getattr(checkpoint, "envs", None), "handle", None)
    return handle if isinstance(handle, NormalizedHandle) else None


def check_plays(model: Policy, spec: EnvSpec) -> None:
    """ValueError unless ``model`` takes ``spec``'s observations and gives one logit per action of it (a model of
    another env would play: an out-of-range action, or the first of too many, without a word)."""
    if tuple(model.obs_shape) != tuple(spec.obs_shape):
        raise ValueError(
            f"the model takes observations {tuple(model.obs_shape)}; {spec.env_id} has observations {spec.obs_shape}"
        )
    logits, _ = eqx.filter_eval_shape(model, jax.ShapeDtypeStruct((1, *spec.obs_shape), spec.obs_dtype))
    if logits.shape[-1] != spec.num_actions:
        raise ValueError(
            f"the model has {logits.shape[-1]} actions; {spec.env_id} has {spec.num_actions} actions: allowed, a model "
            "of this env"
        )


def summarise(evaluation: Evaluation) -> dict[str, float | None]:
    """Mean, (population) standard deviation, minimum and maximum of the finite returns (None where there is none);
    mean length; and how many returns were not finite (an env of the user's can pay NaN or inf)."""
    returns = np.asarray(evaluation.returns, np.float64)
    finite = returns[np.isfinite(returns)]

    def of(statistic: Any) -> float | None:
        return float(statistic(finite)) if finite.size else None

    return {
        "mean_return": of(np.mean),
        "std_return": of(np.std),
        "min_return": of(np.min),
        "max_return": of(np.max),
        "mean_length": float(np.mean(evaluation.lengths)),
        "non_finite_returns": int(returns.size - finite.size),
    }


VIDEO_FORMATS = {".mp4": ("av", "PyAV: pip install av"), ".gif": ("PIL", "Pillow: pip install pillow")}
"""The video files ``VideoWriter`` writes, by suffix: the module each needs and how to install it."""


class VideoWriter:
    """Frames (``[H, W, 3]`` uint8) to an ``.mp4`` (H.264 through PyAV) or a ``.gif`` (Pillow): ``VIDEO_FORMATS``.

    Both encode in this process: no ffmpeg subprocess is forked from the multithreaded JAX process.
    An ``.mp4`` is streamed to disk frame by frame; a ``.gif`` is kept in memory until ``close()``.
    """

    def __init__(self, path: Path, fps: int):
        self.path, self.fps = path, fps
        self._frames: list[np.ndarray] = []
        self._container: Any = None
        self._stream: Any = None
        if path.suffix.lower() not in VIDEO_FORMATS:
            raise ValueError(f"video {path}: the name must end in {' or '.join(VIDEO_FORMATS)}")
        if path.suffix.lower() == ".mp4":
            import av

            self._container = av.open(str(path), mode="w")

    def append(self, frame: np.ndarray) -> None:
        if self._container is None:
            self._frames.append(frame)
            return
        import av

        if self._stream is None:
            self._stream = self._container.add_stream("libx264", rate=self.fps)
            self._stream.height, self._stream.width = frame.shape[:2]
            self._stream.pix_fmt = "yuv420p"
        for packet in self._stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
            self._container.mux(packet)

    def close(self) -> None:
        if self._container is not None:
            if self._stream is not None:
                for packet in self._stream.encode():
                    self._container.mux(packet)
            self._container.close()
        elif self._frames:
            from PIL import Image

            first, *rest = (Image.fromarray(frame) for frame in self._frames)
            first.save(self.path, save_all=True, append_images=rest, duration=round(1000 / self.fps), loop=0)
