import pytest

from ppo_eqx import ConfigError, PPOConfig
from ppo_eqx.config import preset_for


def test_defaults_are_cleanrls():
    config = PPOConfig()
    cleanrl = {
        "env_id": "Breakout-v5",
        "total_timesteps": 10_000_000,
        "learning_rate": 2.5e-4,
        "num_envs": 8,
        "num_steps": 128,
        "anneal_lr": True,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "num_minibatches": 4,
        "update_epochs": 4,
        "norm_adv": True,
        "clip_coef": 0.1,
        "clip_vloss": False,
        "ent_coef": 0.01,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "seed": 1,
    }
    assert {name: getattr(config, name) for name in cleanrl} == cleanrl
    assert (config.batch_size, config.minibatch_size, config.num_iterations) == (1024, 256, 9765)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_minibatches": 3}, "num_minibatches=3 does not divide"),
        ({"num_envs": 0}, "num_envs=0 must be a positive integer"),
        ({"update_epochs": -1}, "update_epochs=-1"),
        ({"total_timesteps": 1000}, "total_timesteps=1000 is smaller than one batch"),
        ({"gamma": 1.5}, r"gamma=1.5 must be in \[0, 1\]"),
        ({"learning_rate": 0.0}, "learning_rate=0.0 must be > 0"),
        ({"conv_impl": "fft"}, "conv_impl='fft'"),
        ({"env_id": ""}, "env_id=''"),
        ({"checkpoint_every": 0}, "checkpoint_every=0 must be a positive integer"),
        ({"async_batch_size": -1}, "async_batch_size=-1 must be 0 .off. or a positive integer"),
        ({"async_batch_size": 3}, "async_batch_size=3 must be 0 .off. or a divisor of num_envs=8"),
        ({"async_batch_size": 8}, "async_batch_size=8 must be 0 .off. or a divisor of num_envs=8 smaller"),
        ({"async_batch_size": 4, "num_seeds": 2}, "async_batch_size=4 works with one seed only, not num_seeds=2"),
        ({"async_batch_size": 4, "num_minibatches": 3}, "batch of async_batch_size.num_steps=512"),
    ],
)
def test_impossible_configs_are_rejected_with_the_value(changes, message):
    with pytest.raises(ConfigError, match=message):
        PPOConfig(**changes).validate()


def test_round_trip_through_a_dict():
    config = PPOConfig(env_id="Pong-v5", seed=7)
    assert PPOConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="unknown config field"):
        PPOConfig.from_dict({"env_id": "Pong-v5", "lr": 1.0})


def test_vector_tasks_get_cleanrls_ppo_py_preset():
    assert preset_for(is_atari=True) == {}
    config = PPOConfig(**preset_for(is_atari=False))
    assert (config.total_timesteps, config.num_envs, config.clip_coef) == (500_000, 4, 0.2)
    # ppo_eqx's own: CartPole's iterations are short, so its envs are re-seeded (and recompiled) less often.
    assert (PPOConfig().checkpoint_every, config.checkpoint_every) == (200, 250)


def test_an_async_batch_is_num_steps_receives_of_async_batch_size_envs():
    config = PPOConfig(num_envs=16, async_batch_size=8).validate()
    assert (config.batch_size, config.minibatch_size, config.num_iterations) == (1024, 256, 9765)
    assert PPOConfig(num_envs=16).batch_size == 2048
