"""Continuous actions (issue 38): the Gaussian policy against a NumPy reference, CleanRL's wrappers' arithmetic
against a NumPy loop of gymnasium's, and a box-action env of the user's trained, resumed and evaluated."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ppo_eqx
from ppo_eqx.core._types import EnvOutput
from ppo_eqx.core.envs import EnvSpec, Pool
from ppo_eqx.core.envs.normalize import normalize_pool
from ppo_eqx.core.gaussian import GaussianActorCritic, gaussian_logprob_entropy
from ppo_eqx.core.networks import ActorCritic, GaussianPolicy
from ppo_eqx.errors import ConfigError

from .user_env import Reach, Unbounded

pytestmark = pytest.mark.unit


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 5),
    dims=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_log_probability_and_entropy_are_the_diagonal_gaussians(rows, dims, seed):
    rng = np.random.default_rng(seed)
    mean = rng.normal(size=(rows, dims))
    log_std = rng.uniform(-2, 1, size=dims)
    actions = mean + rng.normal(size=(rows, dims)) * np.exp(log_std) * 2
    logprob, entropy = gaussian_logprob_entropy(*(jnp.asarray(x, jnp.float32) for x in (mean, log_std, actions)))
    std = np.exp(log_std)
    # The density of each dimension, multiplied (float64), its log; the entropy of N(m, s) is log(s sqrt(2 pi e)).
    density = np.prod(np.exp(-((actions - mean) ** 2) / (2 * std**2)) / (std * math.sqrt(2 * math.pi)), axis=1)
    np.testing.assert_allclose(logprob, np.log(density), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(entropy, np.full(rows, np.sum(np.log(std * math.sqrt(2 * math.pi * math.e)))), rtol=1e-5)


def test_the_gaussian_model_starts_as_cleanrls_agent():
    """Mean and critic: the 64-64 tanh MLPs of the discrete vector agent from the same key (orthogonal, gains
    sqrt 2, 0.01 and 1); the log standard deviation a zero vector, one per action dimension."""
    key = jax.random.PRNGKey(3)
    model = GaussianActorCritic((5,), 2, key=key)
    discrete = ActorCritic((5,), 2, key=key)
    obs = jax.random.normal(jax.random.PRNGKey(4), (7, 5))
    mean, value = model(obs)
    logits, discrete_value = discrete(obs)
    np.testing.assert_array_equal(mean, logits)
    np.testing.assert_array_equal(value, discrete_value)
    np.testing.assert_array_equal(model.log_std, np.zeros(2, np.float32))
    assert model.num_actions == 2 and isinstance(model, GaussianPolicy) and not isinstance(model, ActorCritic)


def test_a_share_of_envs_draws_what_those_envs_draw_in_the_whole_batch():
    model = GaussianActorCritic((3,), 2, key=jax.random.PRNGKey(0))
    mean = jax.random.normal(jax.random.PRNGKey(1), (8, 2))
    key = jax.random.PRNGKey(2)
    whole, whole_logprob = model.sample(key, mean)
    part, part_logprob = model.sample(key, mean[3:6], first_env=3, total_envs=8)
    np.testing.assert_array_equal(part, whole[3:6])
    np.testing.assert_array_equal(part_logprob, whole_logprob[3:6])


# --- CleanRL's wrappers' arithmetic ---------------------------------------------------------------------------------


class RunningMeanStd:
    """gymnasium's running moments (float64), as its ``NormalizeObservation`` and ``NormalizeReward`` keep them."""

    def __init__(self, shape=()):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, batch):
        batch_mean, batch_var, batch_count = batch.mean(axis=0), batch.var(axis=0), batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        m_2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.mean, self.var, self.count = self.mean + delta * batch_count / total, m_2 / total, total


def scripted_pool(obs: np.ndarray, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> Pool:
    """A pool whose step ``t`` returns row ``t + 1`` of ``obs`` and row ``t`` of the rest (its handle: ``t``)."""
    spec = EnvSpec("Scripted", obs.shape[2:], np.dtype(np.float32), 1, "vector", None, ((-1.0,), (1.0,)))

    def step(t, actions):
        out = EnvOutput(
            jnp.asarray(obs)[t + 1],
            jnp.asarray(rewards)[t],
            jnp.asarray(terminated | truncated)[t],
            jnp.asarray(rewards)[t],
            jnp.asarray(terminated | truncated)[t],
            jnp.asarray(truncated & ~terminated)[t],
            jnp.asarray(obs)[t + 1],
        )
        return t + 1, out

    return Pool(spec, jnp.zeros((), jnp.int32), step, obs[0], lambda: None, lambda i: np.zeros(0))


def test_observations_and_rewards_are_normalised_as_gymnasiums_wrappers_do():
    rng = np.random.default_rng(0)
    steps, num_envs, gamma = 40, 3, 0.99
    obs = (rng.normal(size=(steps + 1, num_envs, 2)) * [5.0, 0.1] + [3.0, -1.0]).astype(np.float32)
    obs[steps, 1, 0] = 1e4  # far out after 120 observations: more than 10 standard deviations, clipped
    rewards = (rng.normal(size=(steps, num_envs)) * 20).astype(np.float32)
    terminated = rng.random((steps, num_envs)) < 0.1
    truncated = rng.random((steps, num_envs)) < 0.05
    pool = normalize_pool(scripted_pool(obs, rewards, terminated, truncated), gamma=gamma)
    # The reference: gymnasium's NormalizeObservation, clip +-10, NormalizeReward (terminated only), clip +-10.
    obs_rms, ret_rms, returns = RunningMeanStd((2,)), RunningMeanStd(), np.zeros(num_envs)
    obs_rms.update(obs[0].astype(np.float64))
    expected_first = np.clip((obs[0] - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10)
    np.testing.assert_allclose(pool.first_obs, expected_first, rtol=1e-4, atol=1e-4)
    step = jax.jit(pool.step)
    handle = pool.handle
    for t in range(steps):
        handle, out = step(handle, jnp.zeros((num_envs, 1)))
        obs_rms.update(obs[t + 1].astype(np.float64))
        expected_obs = np.clip((obs[t + 1] - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10)
        returns = returns * gamma * (1 - terminated[t]) + rewards[t]
        ret_rms.update(returns)
        expected_reward = np.clip(rewards[t] / np.sqrt(ret_rms.var + 1e-8), -10, 10)
        np.testing.assert_allclose(out.obs, expected_obs, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out.reward, expected_reward, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(out.raw_reward, rewards[t])  # the reported return stays raw
        if t == steps - 1:
            assert out.obs[1, 0] == 10.0  # the far observation, clipped


def test_frozen_statistics_are_never_updated():
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(6, 2, 3)).astype(np.float32)
    zeros = np.zeros((5, 2), np.float32)
    learning = normalize_pool(scripted_pool(obs, zeros, zeros > 0, zeros > 0), gamma=0.9)
    handle = learning.handle
    for _ in range(5):
        handle, _ = learning.step(handle, jnp.zeros((2, 1)))
    frozen = normalize_pool(scripted_pool(obs, zeros, zeros > 0, zeros > 0), gamma=0.9, frozen=handle)
    played = frozen.handle
    for _ in range(5):
        played, out = frozen.step(played, jnp.zeros((2, 1)))
    np.testing.assert_array_equal(played.obs.mean, jnp.broadcast_to(handle.obs.mean[0], (2, 3)))
    expected = (obs[5] - np.asarray(handle.obs.mean[0])) / np.sqrt(np.asarray(handle.obs.var[0]) + 1e-8)
    np.testing.assert_allclose(out.obs, expected, rtol=1e-5, atol=1e-5)


# --- an env of the user's with a box of actions ---------------------------------------------------------------------


def test_a_box_of_actions_gets_cleanrls_continuous_preset_and_is_clipped_on_its_way_in():
    env = ppo_eqx.JaxEnv(Reach())
    spec = env.spec()
    assert spec.continuous and spec.num_actions == 1 and spec.action_bounds == ((-1.0,), (1.0,))
    config = ppo_eqx.PPOConfig.for_task(Reach())
    assert (config.num_envs, config.num_steps, config.num_minibatches, config.update_epochs) == (1, 2048, 32, 10)
    assert (config.learning_rate, config.ent_coef, config.clip_vloss) == (3e-4, 0.0, True)
    assert config.normalize_obs and config.normalize_reward and config.total_timesteps == 1_000_000
    pool = env.pool([0, 1])
    _, far = env.step(pool.handle, jnp.asarray([[50.0], [-50.0]]))
    _, edge = env.step(pool.handle, jnp.asarray([[1.0], [-1.0]]))
    np.testing.assert_array_equal(far.obs, edge.obs)  # clipped to [-1, 1] before the env moves


def test_the_fast_preset_changes_only_the_envs_and_steps_and_stays_off_other_tasks():
    """``preset="fast"`` (``--preset fast``): CleanRL's continuous preset with more envs stepped at once and more
    steps in all, chosen for wall time to CleanRL's return (docs/performance.md); CleanRL's stays the default. The
    update (minibatch size aside), the loss and the normalisation are CleanRL's."""
    from ppo_eqx.presets import CONTINUOUS_FAST_PRESET, CONTINUOUS_PRESET

    cleanrl = ppo_eqx.PPOConfig.for_task(Reach())
    fast = ppo_eqx.PPOConfig.for_task(Reach(), preset="fast")
    assert (cleanrl.preset, fast.preset) == ("cleanrl", "fast")
    changed = {name for name in CONTINUOUS_PRESET if getattr(cleanrl, name) != getattr(fast, name)}
    assert changed == set(CONTINUOUS_FAST_PRESET) - set(
        name for name, value in CONTINUOUS_FAST_PRESET.items() if CONTINUOUS_PRESET.get(name) == value
    )
    assert fast.num_envs > cleanrl.num_envs and fast.batch_size == cleanrl.batch_size
    assert (fast.loss, fast.normalize_obs, fast.normalize_reward) == ("cleanrl-torch", True, True)
    assert ppo_eqx.PPOConfig.for_task(Reach(), preset="fast", num_envs=8).num_envs == 8  # a flag still wins
    with pytest.raises(ConfigError, match="preset='fast' is for tasks of continuous actions"):
        ppo_eqx.PPOConfig.for_task("CartPole-v1", preset="fast")


def test_an_action_box_without_bounds_is_one_line():
    with pytest.raises(ConfigError, match="finite bounds"):
        ppo_eqx.JaxEnv(Unbounded()).spec()


def test_normalisation_needs_a_pool_stepped_at_once_and_vector_observations():
    with pytest.raises(ConfigError, match="normalize_obs=True needs a pool stepped at once"):
        ppo_eqx.PPOConfig(env_id="CartPole-v1", normalize_obs=True, async_batch_size=4, num_envs=8).validate()
    from ppo_eqx.core.envs.normalize import check_normalizable

    frames = EnvSpec("Pong-v5", (4, 84, 84), np.dtype(np.uint8), 6, "frames")
    with pytest.raises(ConfigError, match="normalize_reward=True with Pong-v5's frames observations"):
        check_normalizable(False, True, frames)


@pytest.mark.compile
def test_the_reach_env_is_learned_and_greedy_play_uses_the_frozen_statistics():
    env = Reach()
    config = ppo_eqx.PPOConfig.for_task(env, total_timesteps=40960, seed=2)
    with ppo_eqx.Trainer(config, env=env) as trainer:
        rows = list(ppo_eqx.run(trainer))
        checkpoint = trainer.checkpoint()
    first, last = rows[0]["episodic_return"], np.mean([row["episodic_return"] for row in rows[-3:]])
    assert first < -8 and last > -4, (first, last)  # random actions: about -13; the best: about -1.5
    statistics = ppo_eqx.normalization_of(checkpoint)
    assert statistics is not None
    played = ppo_eqx.evaluate(
        checkpoint.model, config, episodes=8, greedy=True, env=env, statistics=statistics, seed=5,
        key=jax.random.PRNGKey(0),
    )  # fmt: skip
    assert np.mean(played.returns) > -4, played.returns
    with pytest.raises(ValueError, match="normalised observations"):
        ppo_eqx.evaluate(checkpoint.model, config, episodes=1, env=env, seed=5, key=jax.random.PRNGKey(0))


# --- through the command line ---------------------------------------------------------------------------------------

REACH = ["--env-id", "tests.user_env:Reach", "--total-timesteps", "16384", "--checkpoint-every", "2"]
REACH += ["--iterations-per-dispatch", "1", "--no-progress"]


@pytest.mark.subprocess
def test_a_resumed_continuous_run_goes_on_bit_for_bit_with_its_statistics(tmp_path):
    from .comparisons import metrics
    from .processes import ppo_eqx as command
    from .processes import run_child
    from .run_files import interrupted_copy

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    code, out, err = run_child(command("train", *REACH, "--run-dir", str(whole)))
    assert code == 0, out + err
    interrupted_copy(whole, resumed, at=4)
    code, out, err = run_child(command("train", "--resume", str(resumed), "--no-progress"))
    assert code == 0, out + err
    assert metrics(resumed) == metrics(whole)
    newest = "checkpoints/iter_000008.eqx"
    assert (resumed / newest).read_bytes() == (whole / newest).read_bytes()  # the statistics are in the carry
    code, out, err = run_child(command("eval", str(whole), "--episodes", "2", "--greedy"))
    assert code == 0 and "over 2 episodes" in out[-1], out + err


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--env-id", "HalfCheetah-v4", "--num-envs", "4", "--async-batch-size", "2"], ("async_batch_size=2",)),
        (["--env-id", "tests.user_env:Unbounded"], ("finite bounds",)),
        (["--env-id", "Pong-v5", "--normalize-obs"], ("normalize_obs", "frames observations")),
        (["--env-id", "CheetahRun-v1"], ("CheetahRun-v1", "observations Dict")),  # dm_control's
    ],
)
def test_continuous_input_that_cannot_train_is_one_line(tmp_path, argv, words):
    """Each refused before the run directory is made (in a child: a process that steps EnvPool's float64 XLA
    buffers as float32 ends with glibc's "corrupted double-linked list")."""
    from .processes import ppo_eqx as command
    from .processes import run_child

    code, out, err = run_child(command("train", *argv, "--run-dir", str(tmp_path / "run")))
    assert code == 2 and len(err) == 1 and err[0].startswith("ppo-eqx: error:"), out + err
    assert all(word in err[0] for word in words), err
    assert not (tmp_path / "run").exists()


def test_envpools_box_task_steps_under_jit_as_its_host_api_does():
    """In this process, under pytest's jaxtyping checks: EnvPool's Pendulum-v1 (float64 actions) stepped from a
    jitted function through its host API equals a second pool stepped directly with the clipped actions."""
    import envpool

    from ppo_eqx.core.envs import backend

    pool = backend("envpool").make("Pendulum-v1", [5, 6, 7])
    twin = envpool.make("Pendulum-v1", env_type="gymnasium", num_envs=3, seed=5, env_seed=[5, 6, 7])
    assert pool.spec.action_bounds is not None
    low, high = (np.asarray(b) for b in pool.spec.action_bounds)
    step = jax.jit(pool.step)
    handle, actions = pool.handle, np.random.default_rng(0).normal(0, 3, (4, 3, 1)).astype(np.float32)
    try:
        np.testing.assert_allclose(pool.first_obs, twin.reset()[0].astype(np.float32))
        for row in actions:
            handle, out = step(handle, jnp.asarray(row))
            obs, reward, *_ = twin.step(np.clip(row.astype(np.float64), low, high))
            np.testing.assert_allclose(np.asarray(out.obs), obs.astype(np.float32))
            np.testing.assert_allclose(np.asarray(out.reward), reward.astype(np.float32))
    finally:
        pool.close()
        twin.close()


MUJOCO = ["--env-id", "Hopper-v4", "--num-steps", "256", "--num-minibatches", "4", "--update-epochs", "2"]
MUJOCO += ["--total-timesteps", "2048", "--checkpoint-every", "2", "--no-progress"]


@pytest.mark.subprocess
def test_envpools_mujoco_trains_resumes_bit_for_bit_and_plays(tmp_path):
    """EnvPool's float64 MuJoCo task stepped through its host API from inside the program (never its XLA call):
    its normalisation statistics kept in each checkpoint (the envs are made afresh at each), a resume equal to the
    whole run, eval with the statistics frozen, and --video played or refused in one line."""
    from .comparisons import metrics
    from .processes import ppo_eqx as command
    from .processes import run_child
    from .run_files import interrupted_copy

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    code, out, err = run_child(command("train", *MUJOCO, "--run-dir", str(whole)))
    assert code == 0, out + err
    interrupted_copy(whole, resumed, at=4)
    code, out, err = run_child(command("train", "--resume", str(resumed), "--no-progress"))
    assert code == 0, out + err
    assert metrics(resumed) == metrics(whole)
    newest = "checkpoints/iter_000008.eqx"
    assert (resumed / newest).read_bytes() == (whole / newest).read_bytes()
    code, out, err = run_child(command("eval", str(whole), "--episodes", "1"))
    assert code == 0 and "over 1 episodes" in out[-1], out + err
    # A video where EnvPool can render MuJoCo (OpenGL); elsewhere one line before anything is played or written.
    video = tmp_path / "play.mp4"
    code, out, err = run_child(command("eval", str(whole), "--episodes", "1", "--video", str(video)), cwd=tmp_path)
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()  # MuJoCo's log of a failed frame is left in a scratch dir
    if code == 0:
        assert video.stat().st_size > 0, out + err
    else:
        assert code == 2 and len(err) == 1 and "cannot render Hopper-v4" in err[0], out + err
        assert not video.exists() and not any("evaluating" in line for line in out)
