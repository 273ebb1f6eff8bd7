"""An env of the user's (gymnax's interface, duck-typed: ``tests/user_env.py``) and a loss of the user's go through
the same doors as the built-in ones: ``PPOConfig.for_task(env)``, ``Trainer(config, env=env, loss=...)``,
checkpoints with the env's state, bit-exact resume, ``evaluate(..., env=env)``, and on the command line
``--env-id MODULE:CALLABLE`` and ``--loss MODULE:ATTRIBUTE``."""

import dataclasses
import json
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo_eqx
from ppo_eqx import ConfigError, PPOConfig, Trainer
from ppo_eqx.host.named import backend_named as backend

from .comparisons import final_checkpoint_bytes, leaves_equal, metrics, resume_a_copy
from .user_env import LENGTH, Corridor, CorridorParams, kl_penalty

pytestmark = pytest.mark.unit

SHORT = {"total_timesteps": 4 * 4 * 32, "num_steps": 32, "anneal_lr": False, "seed": 3}
"""Four iterations of 4 envs x 32 steps."""


def run(trainer: Trainer, **kwargs) -> list[dict]:
    """The records of ``ppo_eqx.run``, less the timings, NaN as None (so that equal runs compare equal)."""
    return [
        {k: None if v != v else v for k, v in r.items() if k not in ("sps", "time_elapsed")}
        for r in ppo_eqx.run(trainer, **kwargs)
    ]


def test_an_env_object_gets_its_kinds_preset_and_names_the_jax_backend():
    env = Corridor()
    config = PPOConfig.for_task(env, total_timesteps=10_000)
    assert (config.env_id, config.env_backend) == ("Corridor-v0", "jax")
    # A flat vector: CleanRL's ppo.py preset, many iterations a program (the envs run inside it).
    assert (config.num_envs, config.clip_coef, config.iterations_per_dispatch) == (4, 0.2, 250)
    spec = ppo_eqx.JaxEnv(env).spec()
    assert (spec.obs_shape, spec.num_actions, spec.kind, spec.obs_dtype) == ((LENGTH,), 2, "vector", np.float32)


def test_trains_saves_resumes_bit_exact_and_evaluates(tmp_path):
    """2 + 2 iterations through the README's calls equal 4 in one go: metrics, model, optimizer, key, env state."""
    env = Corridor()
    config = PPOConfig.for_task(env, **SHORT)
    with Trainer(config, env=env) as trainer:
        first = run(trainer, num_iterations=2)
        path = ppo_eqx.save_checkpoint(tmp_path, trainer.checkpoint(), config, trainer.spec, keep=2)
    checkpoint = ppo_eqx.load_checkpoint(ppo_eqx.read_checkpoint(path), config, trainer.spec)
    assert int(checkpoint.iteration) == 2 and checkpoint.envs.handle.state.position.shape == (4,)
    with Trainer(config, env=env, restore=checkpoint) as trainer:
        rest = run(trainer)
        resumed = trainer.checkpoint()
    with Trainer(config, env=env) as trainer:
        whole = run(trainer)
        uninterrupted = trainer.checkpoint()
    assert first + rest == whole and len(whole) == 4
    assert leaves_equal(resumed, uninterrupted)
    assert not leaves_equal(checkpoint.model, uninterrupted.model)  # it learned in between
    games = ppo_eqx.evaluate(checkpoint.model, config, env=env, episodes=5, seed=1, key=jax.random.key(0))
    assert len(games.returns) == 5 and all(-0.5 <= r <= 1 for r in games.returns)


def test_it_learns_the_corridor():
    """Random play reaches the end of 8 cells in about half the episodes before the time limit; PPO walks right."""
    env = Corridor()
    config = PPOConfig.for_task(env, total_timesteps=20_480, seed=1)
    with Trainer(config, env=env) as trainer:
        records = list(ppo_eqx.run(trainer))
        model = trainer.checkpoint().model
    assert records[0]["episodic_return"] < 0.6 < 0.9 < records[-1]["episodic_return"]
    games = ppo_eqx.evaluate(model, config, env=env, episodes=16, seed=2, key=jax.random.key(1), greedy=True)
    assert min(games.returns) >= 0.9  # the shortest path pays at least 1 - 6 x 0.01


def test_seeds_and_sweeps_of_a_user_env_train_in_one_program():
    env = Corridor()
    config = PPOConfig.for_task(env, **SHORT, num_seeds=2, sweep={"ent_coef": [0.0, 0.01]})
    with Trainer(config, env=env) as trainer:
        rows = list(ppo_eqx.run_agents(trainer))
    assert len(rows) == 4 and len(rows[-1]) == 4
    assert len({row["loss"] for row in rows[-1]}) == 4  # four agents, four runs


def test_gymnax_envs_go_through_the_same_door_and_compute_what_the_gymnax_backend_does():
    gymnax = pytest.importorskip("gymnax")
    by_name = PPOConfig.for_task("CartPole-v1", "gymnax", **SHORT)
    pair = gymnax.make("CartPole-v1")
    by_object = PPOConfig.for_task(pair, **SHORT)
    assert dataclasses.replace(by_object, env_backend="gymnax", env_id="CartPole-v1") == by_name
    with Trainer(by_name) as trainer:
        want = run(trainer)
    with Trainer(by_object, env=pair) as trainer:
        got = run(trainer)
    assert got == want


class Broken(Corridor):
    """Corridor with one thing wrong, set by the test."""


def broken(**methods) -> Broken:
    env = Broken()
    for name, method in methods.items():
        setattr(env, name, method)
    return env


def _step_with(env: Corridor, change):
    def step(key, state, action, params):
        return change(*Corridor.step(env, key, state, action, params))

    return step


BAD_ENVS = {
    "no step": (lambda: SimpleNamespace(reset=Corridor().reset, default_params=None), "has no step"),
    "a step of four values": (
        lambda: broken(step=_step_with(Corridor(), lambda obs, state, reward, done, info: (obs, state, reward, done))),
        "step(key, state, action, params) returns 4 values",
    ),
    "a reward per cell": (
        lambda: broken(step=_step_with(Corridor(), lambda o, s, r, d, i: (o, s, jnp.full(LENGTH, r), d, i))),
        "step's reward has shape (8,)",
    ),
    "observations of another shape than declared": (
        lambda: broken(observation_space=lambda params: SimpleNamespace(shape=(4,), dtype=jnp.float32)),
        "reset's observation has shape (8,); allowed: shape (4,)",
    ),
    "an infinite reward": (
        lambda: broken(step=_step_with(Corridor(), lambda o, s, r, d, i: (o, s, r / 0.0, d, i))),
        "non-finite reward",
    ),
    "a box of actions that is a matrix": (
        lambda: broken(action_space=lambda params: SimpleNamespace(low=-1.0, high=1.0, shape=(2, 3))),
        "a box of actions of shape (2, 3); allowed: () or (A,)",
    ),
    "a box of actions without bounds": (
        lambda: broken(action_space=lambda params: SimpleNamespace(low=0.0, high=float("inf"), shape=(1,))),
        "allowed: finite bounds",
    ),
    "a 4-D observation": (
        lambda: broken(observation_space=lambda params: SimpleNamespace(shape=(2, 2, 2, 1), dtype=jnp.float32)),
        "observations of shape (2, 2, 2, 1) are neither",
    ),
    "a reset that raises": (
        lambda: broken(reset=lambda key, params: 1 / 0),
        "reset(key, params) raised ZeroDivisionError",
    ),
    "a step whose state changes shape": (
        lambda: broken(step=_step_with(Corridor(), lambda o, s, r, d, i: (o, s._replace(time=s.time[None]), r, d, i))),
        "returns a state of other shapes",
    ),
}


@pytest.mark.parametrize("case", BAD_ENVS)
def test_a_bad_env_is_one_line_naming_what_is_wrong(case):
    make, message = BAD_ENVS[case]
    with pytest.raises(ConfigError) as raised:
        PPOConfig.for_task(make(), total_timesteps=4096)
    assert message in str(raised.value) and "\n" not in str(raised.value)


class ScalarCorridor(Corridor):
    """Corridor whose observation is the position itself, a number (int32), and its grid twin, ``[1, LENGTH]``."""

    def observation_space(self, params):
        return SimpleNamespace(shape=(), dtype=jnp.int32)

    def _obs(self, state):
        return state.position


class GridCorridor(Corridor):
    def observation_space(self, params):
        return SimpleNamespace(shape=(1, LENGTH), dtype=jnp.float32)

    def _obs(self, state):
        return super()._obs(state)[None]


@pytest.mark.parametrize(
    ("env", "shape", "kind"), [(ScalarCorridor(), (1,), "vector"), (GridCorridor(), (1, LENGTH, 1), "grid")]
)
def test_a_number_or_a_2d_grid_observed_is_a_vector_or_a_grid_of_one_channel(env, shape, kind):
    spec = ppo_eqx.JaxEnv(env).spec()
    assert (spec.obs_shape, spec.kind, spec.obs_dtype) == (shape, kind, np.float32)
    config = PPOConfig.for_task(env, **SHORT, num_envs=2)
    with Trainer(config, env=env) as trainer:
        assert trainer.state.carry.obs.shape == (2, *shape)
        assert len(run(trainer, num_iterations=1)) == 1


def test_a_config_of_an_env_object_needs_the_object_to_make_its_envs():
    config = PPOConfig.for_task(Corridor(), **SHORT)
    with pytest.raises(ConfigError, match="names an env object, which the run cannot make again"):
        Trainer(config)
    with pytest.raises(ConfigError, match="PPOConfig.for_task"):
        Trainer(PPOConfig.for_task("CartPole-v1", "envpool", **SHORT), env=Corridor())


CLI_RUN = [
    "--env-id", "tests.user_env:make_corridor", "--num-steps", "32", "--total-timesteps", str(6 * 128),
    "--checkpoint-every", "2", "--iterations-per-dispatch", "2", "--no-progress", "--no-tensorboard",
]  # fmt: skip


@pytest.mark.subprocess
def test_the_command_line_trains_resumes_and_evaluates_a_module_callable(tmp_path, capsys):
    from ppo_eqx.cli import main

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert main(["train", *CLI_RUN, "--run-dir", str(whole)]) == 0
    saved = json.loads((whole / "config.json").read_text())
    assert (saved["env_id"], saved["env_backend"]) == ("tests.user_env:make_corridor", "jax")
    resume_a_copy(whole, resumed, capsys)
    assert metrics(resumed) == metrics(whole) and len(metrics(whole)) == 6
    assert final_checkpoint_bytes(resumed) == final_checkpoint_bytes(whole)
    assert main(["eval", str(whole), "--episodes", "3"]) == 0
    assert len(json.loads((whole / "eval.json").read_text())["returns"]) == 3


class InfiniteReward(Corridor):
    def step(self, key, state, action, params):
        obs, state, reward, done, info = super().step(key, state, action, params)
        return obs, state, reward / 0.0, done, info


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--env-id", "tests.test_user_env:InfiniteReward"], "step returned a non-finite reward"),
        (["--env-id", "tests.user_env:make_corridor", "--loss", "tests.user_env:nothing"], "has no 'nothing'"),
        (["--env-id", "tests.user_env:make_corridor", "--env-backend", "gymnax"], "not a gymnax task"),
        (["--env-id", "tests.user_env:make_corridor", "--async-batch-size", "2"], "async_batch_size=2 is not"),
    ],
)
def test_bad_user_code_on_the_command_line_is_one_line_and_exit_2_before_anything_is_written(
    tmp_path, capsys, flags, message
):
    from ppo_eqx.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", *flags, "--run-dir", str(run_dir)]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1, error
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("tests.no_such_module:make", "no module named 'tests.no_such_module'"),
        ("tests.user_env:no_such_name", "has no 'no_such_name'"),
        ("tests.user_env:LENGTH", "is a int, not callable"),
    ],
)
def test_a_module_callable_that_makes_no_env_is_one_line(env_id, message):
    with pytest.raises(ConfigError, match=message):
        backend("jax").spec(env_id)


def test_a_loss_of_the_users_trains_and_its_values_are_metrics():
    env = Corridor()
    config = PPOConfig.for_task(env, **SHORT)
    with Trainer(config, env=env, loss=kl_penalty(0.5)) as trainer:
        records = run(trainer)
    with Trainer(config, env=env) as trainer:
        clean = run(trainer)
    assert all(r["kl_penalty"] >= 0 for r in records) and records[-1]["kl_penalty"] > 0
    assert set(records[-1]) == set(clean[-1]) | {"kl_penalty"}
    assert records[-1]["loss"] != clean[-1]["loss"]  # another loss was descended


@pytest.mark.subprocess
def test_the_command_lines_loss_reaches_metrics_and_tensorboard(tmp_path):
    from ppo_eqx.cli import main

    from .run_files import tensorboard_points

    run_dir = tmp_path / "kl"
    flags = [f for f in CLI_RUN if f != "--no-tensorboard"]
    assert main(["train", *flags, "--loss", "tests.user_env:kl_loss", "--run-dir", str(run_dir)]) == 0
    rows = metrics(run_dir)
    assert all("kl_penalty" in row for row in rows)
    assert json.loads((run_dir / "config.json").read_text())["loss"] == "tests.user_env:kl_loss"
    points = tensorboard_points(run_dir, "losses/kl_penalty")
    assert [value for _, value in points] == pytest.approx([r["kl_penalty"] for r in rows])


def test_a_loss_that_reports_a_reserved_name_or_an_array_is_refused():
    env = Corridor()
    config = PPOConfig.for_task(env, **SHORT)

    def array_report(model, minibatch, hyperparameters, *, prepared):
        loss, info = ppo_eqx.model_loss(model, minibatch, hyperparameters, prepared=prepared)
        return loss, {**info._asdict(), "per_sample": minibatch.advantages}

    def reserved(model, minibatch, hyperparameters, *, prepared):
        loss, info = ppo_eqx.model_loss(model, minibatch, hyperparameters, prepared=prepared)
        return loss, {**info._asdict(), "learning_rate": loss}

    refusals = [(array_report, "reports per_sample as array of float32"), (reserved, "reports 'learning_rate'")]
    for loss, message in refusals:
        with pytest.raises(ValueError, match=message), Trainer(config, env=env, loss=loss) as trainer:
            trainer.dispatch()


def test_the_pure_path_composes_init_iteration_and_scan_in_one_program():
    """PureJaxRL's ``make_train``: the envs, the state and every iteration in one jitted function of a key."""
    env = ppo_eqx.JaxEnv(Corridor())
    sizes = ppo_eqx.Sizes(num_agents=1, num_steps=32, num_minibatches=4, update_epochs=4, num_iterations=8)
    hyperparameters = ppo_eqx.Hyperparameters(clip_coef=0.2, anneal_lr=False)

    @jax.jit
    def train(key):
        env_key, key = jax.random.split(key)
        pool = env.pool(jax.random.randint(env_key, (4,), 0, 2**31 - 1))
        collector = ppo_eqx.jax_env_collector(pool, num_steps=sizes.num_steps)
        state = ppo_eqx.init_train_state(collector, pool.spec, hyperparameters, sizes, num_envs=4, key=key)
        iteration = ppo_eqx.make_iteration(collector, sizes)
        return jax.lax.scan(lambda state, _: iteration(state), state, length=sizes.num_iterations)

    state, metrics_ = train(jax.random.PRNGKey(0))
    assert int(state.iteration) == 8 and metrics_["loss"].shape == (8,)
    assert np.isfinite(metrics_["loss"]).all()
    again, _ = train(jax.random.PRNGKey(0))
    assert leaves_equal(state.model, again.model)
    assert CorridorParams().max_steps == 50  # the env's own params were used (its default)


def test_a_backend_of_the_users_is_named_by_module_attribute():
    config = PPOConfig(env_id="tests.user_env:make_corridor", env_backend="tests.test_user_env:OUTSIDE")
    assert config.validate().env_backend == "tests.test_user_env:OUTSIDE"
    assert backend(config.env_backend) is OUTSIDE
    with pytest.raises(ConfigError, match="without name"):
        backend("tests.user_env:CorridorParams")


OUTSIDE = ppo_eqx.JaxEnv(Corridor(), env_id="corridor-outside")
"""A backend object from outside the package (any ``EnvBackend``), named ``tests.test_user_env:OUTSIDE``."""
