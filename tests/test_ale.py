"""ALE's vector env as the second Atari backend, checked against EnvPool (docs/backends.md).

Exactly equal where both can be: with ``noop_max=1`` a game with FIRE starts the same on both (a FIRE, no
no-ops), and both emulate deterministically without sticky actions, so one action sequence gives the same
frames, rewards, dones and lives until the first lost life (after which EnvPool spends a step on no-ops and
FIRE, ALE plays on). With CleanRL's ``noop_max=30`` the no-ops come from each library's own random stream, so
the scores are compared statistically instead (bench/backends.py).
"""

import dataclasses
import subprocess
import sys
import warnings

import envpool
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_eqx.core.envs import ale as ale_module
from ppo_eqx.core.envs import backend
from ppo_eqx.errors import ConfigError
from ppo_eqx_bench.atari_games import ATARI_57
from tests.processes import ROOT, run_processes, worker_env

pytestmark = pytest.mark.envpool


def test_the_57_games_have_the_same_actions_and_observations_on_both():
    ale, pool = backend("ale"), backend("envpool")
    for env_id in ATARI_57:  # ALE's spec makes (and closes) a one-env pool of the game
        a, e = ale.spec(env_id), pool.spec(env_id)
        assert (a.num_actions, a.obs_shape, a.obs_dtype, a.kind) == (e.num_actions, e.obs_shape, e.obs_dtype, "frames")


@pytest.mark.unit
@pytest.mark.parametrize("env_id", ["Breakout-v9", "breakout", "CartPole-v1", "Pong-v4"])
def test_an_id_ale_does_not_have_is_refused_by_name(env_id):
    with pytest.raises(ConfigError, match=f"env_id={env_id!r} is not a game of ALE's vector env; allowed: "):
        backend("ale").spec(env_id)


@pytest.mark.unit
def test_an_async_pool_or_a_rendering_one_is_refused():
    with pytest.raises(ConfigError, match="async_batch_size=2 .* allowed: 0 with --env-backend ale"):
        backend("ale").make_async("Pong-v5", [1, 2, 3, 4], 2)
    with pytest.raises(ConfigError, match="allowed for videos: --env-backend envpool"):
        backend("ale").make("Pong-v5", [1], render=True)


@pytest.mark.unit
@pytest.mark.parametrize("missing", ["ale_py", "chex"])
def test_ale_not_installed_is_a_one_line_config_error(missing, monkeypatch):
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` now fails as if it were not installed
    monkeypatch.delitem(sys.modules, "ppo_eqx.core.envs.ale")
    with pytest.raises(ConfigError) as error:
        backend("ale")
    assert str(error.value) == (
        f"env backend 'ale' is not installed (no module {missing!r}); pip install 'ppo_eqx[ale]'"
    )


def _envpool_env(env_id: str, noop_max: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return envpool.make(
            env_id, env_type="gymnasium", num_envs=1, seed=0, noop_max=noop_max, episodic_life=True, reward_clip=True
        )


def _ale_step(env_id: str, noop_max: int):
    """A one-env ALE pool made as the backend's, but with ``noop_max``: its first obs, handle and jitted step."""
    env = ale_module._vector_env(env_id, 1, noop_max=noop_max)
    ale_handle, _reset, xla_step = env.xla()
    obs, info = ale_module._reset(env, [0])
    lives = jnp.asarray(info["lives"], jnp.int32)
    handle = ale_module.AleHandle(jnp.asarray(ale_handle), lives, jnp.ones(1, jnp.int32), jnp.zeros(1, bool))

    @jax.jit
    def step(handle, actions):
        ale, timestep = xla_step(handle.ale, actions)
        return ale_module._env_output(handle._replace(ale=ale), timestep)

    return env, obs, handle, step


@pytest.mark.parametrize(("env_id", "steps"), [("Pong-v5", 2000), ("Breakout-v5", 200), ("SpaceInvaders-v5", 400)])
def test_one_action_sequence_plays_the_same_on_both_until_a_life_is_lost(env_id, steps):
    envpool_env = _envpool_env(env_id, noop_max=1)
    ale_env, ale_obs, handle, step = _ale_step(env_id, noop_max=1)
    obs, info = envpool_env.reset()
    np.testing.assert_array_equal(ale_obs, obs)  # ALE's zero frames are EnvPool's repeated first frame
    rng = np.random.default_rng(0)
    for t in range(steps):
        actions = rng.integers(0, envpool_env.action_space.n, 1).astype(np.int32)
        obs, reward, terminated, truncated, info = envpool_env.step(actions)
        handle, out = step(handle, jnp.asarray(actions))
        done = bool(terminated[0] | truncated[0])
        assert (float(out.raw_reward[0]), float(out.reward[0])) == (info["reward"][0], reward[0]), t
        assert (bool(out.done[0]), bool(out.game_over[0])) == (done, bool(info["terminated"][0] | truncated[0])), t
        assert int(handle.lives[0]) == info["lives"][0], t
        if done:
            break
        # On a game's last step ALE stops before it grabs the frame that EnvPool grabs: only the others agree.
        np.testing.assert_array_equal(np.asarray(out.obs), obs, err_msg=f"step {t}")
    else:
        pytest.fail(f"{env_id}: no life lost in {steps} steps")
    assert t > 10
    if env_id == "Pong-v5":  # no lives: the whole game, score and length, is the same
        assert bool(out.game_over[0])
    else:
        assert int(handle.lives[0]) > 0 and not bool(out.game_over[0])
    envpool_env.close()
    ale_env.close()


def test_a_random_game_on_the_backend_has_envpools_meaning_of_done_game_over_and_reward():
    pool = backend("ale").make("Breakout-v5", [1, 2])
    step = jax.jit(pool.step)
    handle, rng = pool.handle, np.random.default_rng(1)
    lives, game_overs, life_losses, length = np.asarray(handle.lives), 0, 0, np.zeros(2, int)
    after_game_over = np.zeros(2, bool)
    for _ in range(3000):
        handle, out = step(handle, jnp.asarray(rng.integers(0, 4, 2), jnp.int32))
        raw, reward, done, game_over = (np.asarray(x) for x in (out.raw_reward, out.reward, out.done, out.game_over))
        new_lives = np.asarray(handle.lives)
        np.testing.assert_array_equal(reward, np.sign(raw))
        # The step after a game over is the reset: reward 0, not done, all lives back, the stack one frame.
        assert not (done[after_game_over] | (raw[after_game_over] != 0)).any()
        assert (new_lives[after_game_over] == 5).all()
        for frame in range(1, 4):
            np.testing.assert_array_equal(
                np.asarray(out.obs)[after_game_over, frame], np.asarray(out.obs)[after_game_over, 0]
            )
        lost = (new_lives < lives) & ~after_game_over
        assert (done == (lost | game_over)).all()  # done is a lost life or the game over
        assert (game_over == (done & (new_lives == 0))).all()  # Breakout ends with the last life
        game_overs, life_losses = game_overs + game_over.sum(), life_losses + (lost & ~game_over).sum()
        length = np.where(after_game_over, 1, length + 1)
        assert (length <= 27_000 + 1).all()
        lives, after_game_over = new_lives, game_over
    assert game_overs >= 2 and life_losses >= 4 * game_overs
    pool.close()


def test_a_program_traced_with_one_pool_drives_another_without_recompiling():
    ale = backend("ale")
    assert ale.rebinds
    first, second = ale.make("Pong-v5", [5, 6]), ale.make("Pong-v5", [5, 6])
    actions = jnp.asarray(np.random.default_rng(0).integers(0, 6, (50, 2)), jnp.int32)

    @jax.jit
    def play(handle, actions):
        return jax.lax.scan(first.step, handle, actions)

    _, out_first = play(first.handle, actions)
    _, out_second = play(second.handle, actions)
    assert play._cache_size() == 1  # pyright: ignore[reportAttributeAccessIssue]
    jax.tree.map(np.testing.assert_array_equal, out_first, out_second)  # same seeds: the same games
    first.close()
    second.close()


def test_a_trainer_on_ale_compiles_one_iteration_for_every_segment(caplog):
    import logging

    from ppo_eqx import PPOConfig, Trainer, run

    config = PPOConfig(
        env_id="Pong-v5",
        env_backend="ale",
        num_envs=2,
        num_steps=16,
        num_minibatches=2,
        update_epochs=1,
        total_timesteps=6 * 32,
        checkpoint_every=2,
        conv_impl="matmul",
    )
    trainer = Trainer(config)
    try:
        with jax.log_compiles(True), caplog.at_level(logging.WARNING):
            records = list(run(trainer))
    finally:
        trainer.close()
    assert [r["iteration"] for r in records] == [1, 2, 3, 4, 5, 6]  # three segments of envs
    compiles = [r for r in caplog.records if "Finished XLA compilation of jit(iteration)" in r.getMessage()]
    assert len(compiles) == 1


@pytest.mark.subprocess
def test_the_ale_backend_trains_where_envpool_is_not_installed(tmp_path):
    code = (
        "import sys; sys.modules['envpool'] = None\n"  # `import envpool` fails as if it were not installed
        "from ppo_eqx.cli import main\n"
        f"code = main(['train', '--env-id', 'Breakout-v5', '--env-backend', 'ale', '--num-envs', '4', "
        f"'--num-steps', '32', '--total-timesteps', '128', '--no-progress', '--run-dir', {str(tmp_path / 'run')!r}])\n"
        "assert 'envpool' not in [m for m in sys.modules if sys.modules[m] is not None], 'envpool was imported'\n"
        "sys.exit(code)\n"
    )
    (log,) = run_processes([[sys.executable, "-c", code]])
    assert "done, 128 steps" in log, log[-2000:]


@pytest.mark.subprocess
@pytest.mark.parametrize(("train_on", "eval_on"), [("ale", "envpool"), ("envpool", "ale")])
def test_a_model_trained_on_one_backend_plays_on_the_other(train_on, eval_on, tmp_path):
    from ppo_eqx.host.checkpoint import config_of, load_checkpoint, read_checkpoint
    from ppo_eqx.host.evaluate import evaluate

    run_dir = tmp_path / "run"
    train = [sys.executable, "-m", "ppo_eqx", "train", "--env-id", "Breakout-v5", "--env-backend", train_on]
    train += ["--num-envs", "4", "--num-steps", "32", "--total-timesteps", "256", "--no-progress"]
    run_processes([[*train, "--run-dir", str(run_dir)]])
    checkpoint = read_checkpoint(run_dir)
    config = config_of(checkpoint)
    assert config.env_backend == train_on
    other = dataclasses.replace(config, env_backend=eval_on)
    model = load_checkpoint(checkpoint, other, backend(eval_on).spec(other.env_id), conv_impl="matmul").model
    evaluation = evaluate(model, other, episodes=2, seed=3, key=jax.random.key(0))
    assert len(evaluation.returns) == 2 and all(r >= 0 for r in evaluation.returns)
    assert all(0 < length <= 27_000 for length in evaluation.lengths)


def test_the_cli_refuses_an_async_pool_on_ale_before_anything_is_written(tmp_path, capsys):
    from ppo_eqx.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", "--env-backend", "ale", "--async-batch-size", "4", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ppo-eqx: error: async_batch_size=4 is not possible with --env-backend ale; allowed: 0"]
    assert not run_dir.exists()


@pytest.mark.subprocess
def test_the_cli_refuses_an_ale_game_it_does_not_have_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "ppo_eqx", "train", "--env-backend", "ale", "--env-id", "CartPole-v1"]
        + ["--run-dir", str(tmp_path / "run")],
        env=worker_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "env_id='CartPole-v1' is not a game of ALE's vector env; allowed: " in line
    assert not (tmp_path / "run").exists()
