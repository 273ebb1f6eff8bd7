"""The gymnax backend (``--env-backend gymnax``): envs written in JAX, their state data in the carry.

Skipped where gymnax is not installed (``pip install 'ppo_eqx[gymnax]'``; it needs jax < 0.12).
"""

import faulthandler
import importlib
import os
import re
import signal
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_eqx import (
    ActorCritic,
    ConfigError,
    PPOConfig,
    Trainer,
    load_checkpoint,
    read_checkpoint,
    run_agents,
    save_checkpoint,
)
from ppo_eqx.cli.command_line import build_parser
from ppo_eqx.cli.plan import config_from_args
from ppo_eqx.core.envs import backend
from ppo_eqx.core.networks import MLP
from ppo_eqx.errors import UsageError
from ppo_eqx.host.fresh import fresh_agents
from ppo_eqx.host.kernel_build import resolve_conv_impl_for

from .comparisons import ATOL, RTOL, final_checkpoint_bytes, leaves_equal, metrics

gymnax = pytest.importorskip("gymnax")
gymnax_backend = importlib.import_module("ppo_eqx.core.envs.gymnax")

pytestmark = pytest.mark.unit

WATCHDOG_S = 240
"""A test of this module that runs longer has hung: XLA:CPU (jax 0.10.2) was seen to wedge with every thread idle
in a program of many iterations. The watchdog prints every thread's stack and ends the test run, so that CI fails
instead of waiting forever."""


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


SHAPES = {
    "CartPole-v1": ((4,), 2, "vector"),
    "Acrobot-v1": ((6,), 3, "vector"),
    "Breakout-MinAtar": ((10, 10, 4), 3, "grid"),
    "SpaceInvaders-MinAtar": ((10, 10, 6), 4, "grid"),
    "Asterix-MinAtar": ((10, 10, 4), 5, "grid"),
    "Freeway-MinAtar": ((10, 10, 7), 3, "grid"),
}


def test_the_six_tasks_and_their_observations():
    env = backend("gymnax")
    assert env.state_is_data and env.rebinds and not env.has_async
    for env_id, (shape, actions, kind) in SHAPES.items():
        spec = env.spec(env_id)
        assert (spec.obs_shape, spec.num_actions, spec.kind, spec.obs_dtype) == (shape, actions, kind, np.float32)
    with pytest.raises(ConfigError, match="env_id='Pong-v5' is not a gymnax task .* allowed: CartPole-v1, Acrobot-v1"):
        env.spec("Pong-v5")
    with pytest.raises(ConfigError, match="async_batch_size=2 is not possible with --env-backend gymnax"):
        env.make_async("CartPole-v1", [1, 2, 3, 4], 2)
    with pytest.raises(ConfigError, match="do not render"):
        env.make("CartPole-v1", [1], render=True)


def test_a_tasks_config_for_a_library_user_is_the_command_lines():
    """``PPOConfig.for_task``: the values given, over the task's preset, over CleanRL's defaults; what
    ``ppo-eqx train --env-backend gymnax --env-id ...`` with those flags trains."""
    config = PPOConfig.for_task("CartPole-v1", env_backend="gymnax", num_seeds=64, learning_rate=1e-3)
    assert (config.env_id, config.env_backend) == ("CartPole-v1", "gymnax")
    assert (config.num_seeds, config.learning_rate) == (64, 1e-3)
    assert (config.num_envs, config.total_timesteps, config.iterations_per_dispatch) == (4, 500_000, 250)  # preset
    assert config.gamma == PPOConfig().gamma  # default
    args = build_parser().parse_args(
        ["train", "--env-backend", "gymnax", "--env-id", "CartPole-v1", "--num-seeds", "64", "--learning-rate", "1e-3"]
    )
    assert config_from_args(args)[0] == config
    minatar = PPOConfig.for_task("SpaceInvaders-MinAtar", env_backend="gymnax")
    assert (minatar.num_envs, minatar.gamma, minatar.iterations_per_dispatch) == (64, 0.999, 10)
    with pytest.raises(ConfigError, match="unknown config field"):
        PPOConfig.for_task("CartPole-v1", env_backend="gymnax", lr=1.0)
    with pytest.raises(ConfigError, match="num_seeds=0"):
        PPOConfig.for_task("CartPole-v1", env_backend="gymnax", num_seeds=0)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Breakout-MinAtar"])
def test_a_step_is_gymnax_own_step_with_each_envs_key(env_id):
    seeds = [5, 6, 7]
    pool = backend("gymnax").make(env_id, seeds)
    env, params = gymnax.make(env_id)
    # Env i's stream: PRNGKey(seed), split once for the reset, then once every step.
    keys = [jax.random.PRNGKey(s) for s in seeds]
    first = [env.reset(jax.random.split(k)[1], params) for k in keys]
    np.testing.assert_array_equal(pool.first_obs, np.stack([np.asarray(obs) for obs, _ in first]))
    alone = [jax.tree.leaves(state) for _, state in first]  # the pool resets them in one program
    for i, leaf in enumerate(jax.tree.leaves(pool.handle.state)):
        np.testing.assert_array_equal(leaf, np.stack([np.asarray(leaves[i]) for leaves in alone]))
    np.testing.assert_array_equal(pool.handle.keys, np.stack([jax.random.split(k)[0] for k in keys]))
    assert all(not leaf.weak_type for leaf in jax.tree.leaves(pool.handle))  # a restored state is strong too
    actions = jnp.asarray([0, 1, 1], jnp.int32)
    handle, out = jax.jit(pool.step)(pool.handle, actions)
    for i, (key, (_, state)) in enumerate(zip(keys, first, strict=True)):
        carried, step_key = jax.random.split(jax.random.split(key)[0])
        obs, _, reward, terminated, truncated, info = env.step(step_key, state, actions[i], params)
        np.testing.assert_array_equal(out.obs[i], obs)
        np.testing.assert_array_equal(out.final_obs[i], info["final_observation"])
        assert (float(out.reward[i]), bool(out.done[i])) == (float(reward), bool(terminated | truncated))
        np.testing.assert_array_equal(handle.keys[i], carried)
    assert all(not leaf.weak_type for leaf in jax.tree.leaves(handle))


def test_a_time_limit_is_truncated_and_keeps_its_final_observation():
    pool = backend("gymnax").make("CartPole-v1", [1, 2])
    # Env 0 is at its last allowed step (gymnax: 500); env 1 has just started.
    state = pool.handle.state.replace(time=jnp.asarray([499, 0], jnp.int32))
    handle, out = jax.jit(pool.step)(pool.handle._replace(state=state), jnp.zeros(2, jnp.int32))
    assert out.done.tolist() == [True, False] and out.truncated.tolist() == [True, False]
    assert out.game_over.tolist() == [True, False] and out.reward.tolist() == [1.0, 1.0]
    assert int(handle.state.time[0]) == 0  # reset inside the step, as gymnax does
    assert not np.array_equal(out.final_obs[0], out.obs[0])  # the episode's last observation, not the reset one
    np.testing.assert_array_equal(out.final_obs[1], out.obs[1])


def test_the_minatar_network_is_two_wide_relu_mlps_on_the_flattened_grid():
    spec = backend("gymnax").spec("Breakout-MinAtar")
    model = ActorCritic(spec.obs_shape, spec.num_actions, kind=spec.kind, key=jax.random.PRNGKey(0))
    assert isinstance(model.actor, MLP) and isinstance(model.critic, MLP) and model.torso is None
    assert model.actor.activation == model.critic.activation == "relu"
    assert [layer.weight.shape for layer in model.actor.layers] == [(400, 256), (256, 256), (256, 3)]
    assert [layer.weight.shape for layer in model.critic.layers] == [(400, 256), (256, 256), (256, 1)]
    obs = jax.random.uniform(jax.random.PRNGKey(1), (5, *spec.obs_shape))
    logits, value = model(obs)
    hidden = obs.reshape(5, -1)
    for layer in model.actor.layers[:-1]:
        hidden = jax.nn.relu(hidden @ layer.weight + layer.bias)
    np.testing.assert_allclose(logits, hidden @ model.actor.layers[-1].weight + model.actor.layers[-1].bias, atol=1e-5)
    assert value.shape == (5,)
    # "auto" builds no CPU kernel for a model without convolutions, though its observations are 3-D.
    assert resolve_conv_impl_for("auto", spec) == "matmul"


def test_network_init_on_the_command_line_starts_each_agents_model_so():
    flags = ["train", "--env-backend", "gymnax", "--env-id", "Breakout-MinAtar", "--num-seeds", "2"]
    spec = backend("gymnax").spec("Breakout-MinAtar")
    for extra, nonzero_biases in (([], False), (["--network-init", "gymnax-blines"], True)):
        config, _, _ = config_from_args(build_parser().parse_args([*flags, *extra]))
        model = fresh_agents(config, spec, conv_impl="matmul").model
        assert isinstance(model, ActorCritic) and isinstance(model.actor, MLP)
        biases = np.asarray(model.actor.layers[0].bias)
        assert biases.shape == (2, 256)  # one model per agent
        assert bool(np.all(biases > 0)) is nonzero_biases and bool(np.any(biases)) is nonzero_biases
        assert not np.array_equal(biases[0], biases[1]) or not nonzero_biases  # each agent draws its own
    with pytest.raises(UsageError, match="--network-init: invalid choice: 'flax'"):
        build_parser().parse_args([*flags, "--network-init", "flax"])


GYMNAX_RUN = PPOConfig(
    env_backend="gymnax",
    env_id="CartPole-v1",
    num_envs=4,
    num_steps=16,
    num_minibatches=2,
    clip_coef=0.2,
    total_timesteps=8 * 64,
    checkpoint_every=8,
)


def records(trainer: Trainer, **kwargs) -> list[list[dict]]:
    return [
        [{k: v for k, v in r.items() if k not in ("sps", "time_elapsed")} for r in rs]
        for rs in run_agents(trainer, **kwargs)
    ]


@pytest.mark.compile
def test_a_run_resumed_at_any_iteration_in_chunks_of_any_size_is_the_uninterrupted_run(tmp_path):
    """Two agents, one program each dispatch; the whole run one iteration a dispatch, stopped after iteration 5
    and saved; restored, it goes on three iterations a dispatch (5, 8) and ends where the whole run ended."""
    config = GYMNAX_RUN.replace(num_seeds=2)
    with Trainer(config) as whole:
        first = records(whole, num_iterations=5)
        path = save_checkpoint(tmp_path, whole.checkpoint(), config, whole.spec, keep=1)
        rest = records(whole)
        final, spec = whole.checkpoint(), whole.spec
    assert [rs[0]["iteration"] for rs in first + rest] == list(range(1, 9))
    restored = load_checkpoint(read_checkpoint(path), config, spec)
    assert int(restored.iteration) == 5 and restored.envs.handle.state.time.shape == (2, 4)
    with Trainer(config.replace(iterations_per_dispatch=3), restore=restored) as resumed:
        assert records(resumed) == rest
        assert leaves_equal(resumed.checkpoint(), final)
    # Not trivially equal: the agents learned, and differ from each other.
    assert not leaves_equal(restored.model, final.model)
    assert first[-1][0]["loss"] != first[-1][1]["loss"]


@pytest.mark.compile
def test_a_held_checkpoint_is_the_paused_runs_while_the_next_program_runs():
    """At a segment's end ``hold`` keeps a copy of the state and the next program is dispatched at once: the
    checkpoint read while that iteration's records are taken is the one a run paused there reads, bit for bit, and
    the records are the paused run's."""
    config = GYMNAX_RUN.replace(checkpoint_every=3, num_seeds=2)
    boundary = lambda i: i % 3 == 0  # noqa: E731

    def taken(trainer: Trainer, **kwargs) -> tuple[list, dict, dict]:
        rows, checkpoints, ahead = [], {}, {}
        for rs in run_agents(trainer, **kwargs):
            rows.append([{k: v for k, v in r.items() if k not in ("sps", "time_elapsed")} for r in rs])
            k = rs[0]["iteration"]
            if boundary(k) and k < config.num_iterations:
                assert trainer.state_iteration == k
                checkpoints[k], ahead[k] = jax.device_get(trainer.checkpoint()), trainer.iteration
        return rows, checkpoints, ahead

    with Trainer(config) as paused:
        want_rows, want, stood = taken(paused, pause=boundary)
    with Trainer(config) as held:
        rows, got, ahead = taken(held, hold=boundary)
        assert held.state_iteration == held.iteration == config.num_iterations  # released
    assert stood == {3: 3, 6: 6} and ahead == {3: 4, 6: 7}
    assert repr(rows) == repr(want_rows) and leaves_equal(got, want)  # repr: NaN (no episode ended yet) as itself


@pytest.mark.compile
def test_many_iterations_a_dispatch_compute_what_one_a_dispatch_does():
    config = GYMNAX_RUN.replace(env_id="Breakout-MinAtar", num_steps=8, total_timesteps=5 * 32)
    with Trainer(config) as one:
        expected = records(one)
    with Trainer(config.replace(iterations_per_dispatch=4)) as chunked:
        dispatched = chunked.dispatch()
        assert (dispatched.count, dispatched.end, dispatched.stacked) == (4, 4, True)
        assert dispatched.metrics["loss"].shape == (4,)
        assert records(chunked) == expected[4:]
    # The reported return is the game's score: Breakout-MinAtar pays 1 a brick.
    assert all(r[0]["episodic_return"] is None or r[0]["episodic_return"] >= 0 for r in expected)


@pytest.mark.compile
def test_an_agent_of_many_has_its_single_runs_envs_and_learns_as_it_to_float_rounding():
    config = GYMNAX_RUN.replace(total_timesteps=2 * 64, num_seeds=2, seed=3)
    with Trainer(config) as agents:
        # A copy: the run donates the trainer's state, the first carry with it.
        first = jax.tree.map(np.array, (agents.state.carry.handle, agents.state.carry.obs))
        together = records(agents)
    for k, agent in enumerate(config.agent_configs()):
        with Trainer(agent) as single:
            own = jax.tree.map(lambda x: x[k], first)  # noqa: B023
            assert leaves_equal(own, (single.state.carry.handle, single.state.carry.obs))
            alone = records(single)
        for got, want in zip(together, alone, strict=True):
            for name, value in want[0].items():
                np.testing.assert_allclose(got[k][name], value, rtol=RTOL, atol=ATOL, err_msg=name)


QUIET = ["--no-progress", "--no-tensorboard"]
CLI_RUN = [
    "--env-backend", "gymnax", "--env-id", "CartPole-v1", "--num-envs", "4", "--num-steps", "16",
    "--num-minibatches", "2", "--total-timesteps", str(9 * 64), "--checkpoint-every", "8",
    "--iterations-per-dispatch", "3", *QUIET,
]  # fmt: skip


@pytest.mark.subprocess
def test_ctrl_c_between_checkpoints_and_resume_gives_the_uninterrupted_run(tmp_path, monkeypatch, capsys):
    """Stopped in the middle of a checkpoint interval (after the program under way when iteration 2's records came,
    as many iterations as ``loop._Pace`` gives it), the run checkpoints there; resumed, it ends as the uninterrupted
    run, metrics and final checkpoint bit for bit."""
    from ppo_eqx.cli import main

    supervisor = importlib.import_module("ppo_eqx.cli.supervisor")
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert main(["train", *CLI_RUN, "--run-dir", str(whole)]) == 0
    real_run_seeds = supervisor.run_agents

    def interrupted(trainer, **kwargs):
        for records in real_run_seeds(trainer, **kwargs):
            if records[0]["iteration"] == 2:
                os.kill(os.getpid(), signal.SIGINT)  # handled by the supervisor: stop after the program under way
            yield records

    monkeypatch.setattr(supervisor, "run_agents", interrupted)
    assert main(["train", *CLI_RUN, "--run-dir", str(stopped)]) == 130
    monkeypatch.undo()
    said = re.search(r"stopped by SIGINT after iteration (\d+)", capsys.readouterr().err)
    assert said and 2 < int(said.group(1)) < 9, said  # after the program under way (its length is the pace's)
    assert main(["train", "--resume", str(stopped), *QUIET]) == 0
    assert metrics(stopped) == metrics(whole)
    assert [row["iteration"] for row in metrics(whole)] == list(range(1, 10))
    assert final_checkpoint_bytes(stopped) == final_checkpoint_bytes(whole)
