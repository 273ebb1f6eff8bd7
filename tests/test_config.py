import dataclasses
import json
import math
import warnings
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from ppo_eqx import ConfigError, PPOConfig
from ppo_eqx.config import CONV_IMPLS, FIELD_RANGES, INT32_MAX, preset_for
from ppo_eqx.settings import FLOAT32_MAX, FLOAT32_TINY
from ppo_eqx.sweeps import sweep_item

pytestmark = pytest.mark.unit


CLEANRL = {
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
"""The settings of CleanRL's ppo_atari_envpool_xla_jax.py that PPOConfig has, with CleanRL's defaults."""


def test_defaults_are_cleanrls():
    config = PPOConfig()
    assert {name: getattr(config, name) for name in CLEANRL} == CLEANRL
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


CLEANRL_PPO_PY = {
    **CLEANRL,
    "env_id": "CartPole-v1",
    "total_timesteps": 500_000,
    "num_envs": 4,
    "clip_coef": 0.2,
    "clip_vloss": True,
}
"""CleanRL's ppo.py's defaults (its argparse): the Atari script's but for these."""


def test_vector_tasks_get_cleanrls_ppo_py_preset():
    """Every setting of CleanRL's ppo.py, the value loss clipped among them, and its torch loss: advantages
    standardised by the sample's std."""
    assert preset_for("frames") == {}
    config = PPOConfig(env_id="CartPole-v1", **preset_for("vector"))
    assert {name: getattr(config, name) for name in CLEANRL_PPO_PY} == CLEANRL_PPO_PY
    assert config.loss == "cleanrl-torch"
    # ppo_eqx's own: CartPole's iterations are short, so its envs are re-seeded (and recompiled) less often.
    assert (PPOConfig().checkpoint_every, config.checkpoint_every) == (200, 250)


def test_the_tpu_preset_keeps_cleanrls_update_over_64_envs_stepped_from_the_host():
    """``--preset tpu`` (Atari frames): 64 envs x 32 steps from host-envs, and CleanRL's update per env step:
    minibatches of CleanRL's size (8 envs x 128 steps / 4), as many gradient steps per env step, every other
    setting CleanRL's. Other tasks are refused in one line naming what they allow."""
    cleanrl, tpu = PPOConfig(**preset_for("frames")), PPOConfig(**preset_for("frames", preset="tpu"))
    assert (tpu.num_envs, tpu.num_steps, tpu.rollout_on, tpu.preset) == (64, 32, "host-envs", "tpu")
    assert tpu.batch_size // tpu.num_minibatches == 8 * 128 // 4 == cleanrl.minibatch_size
    per_step = [c.update_epochs * c.num_minibatches / c.batch_size for c in (cleanrl, tpu)]
    assert per_step[0] == per_step[1] == 4 * 4 / 1024
    same = {"num_envs", "num_steps", "num_minibatches", "rollout_on", "preset"}
    for field in dataclasses.fields(PPOConfig):
        if field.name not in same:
            assert getattr(tpu, field.name) == getattr(cleanrl, field.name), field.name
    refused = [
        ("vector", {}),
        ("grid", {"state_is_data": True}),
        ("frames", {"network": "lstm"}),
        ("frames", {"state_is_data": True}),
    ]
    for kind, options in refused:
        with pytest.raises(ConfigError, match=r"preset='tpu' is for Atari frames .*; allowed: cleanrl$"):
            preset_for(kind, preset="tpu", **options)
    with pytest.raises(ConfigError, match=r"this task has continuous observations.*; allowed: cleanrl, fast$"):
        preset_for("vector", continuous=True, preset="tpu")


def test_minatar_grids_get_gymnax_blines_preset_and_jax_envs_many_iterations_a_dispatch():
    config = PPOConfig(**preset_for("grid", state_is_data=True))
    assert (config.num_envs, config.num_steps, config.num_minibatches, config.update_epochs) == (64, 128, 8, 4)
    assert (config.learning_rate, config.anneal_lr, config.gamma, config.clip_coef) == (5e-4, False, 0.999, 0.2)
    assert config.clip_vloss and config.total_timesteps == 10_000_000 and config.iterations_per_dispatch == 10
    assert preset_for("vector", state_is_data=True)["iterations_per_dispatch"] == 250
    assert "iterations_per_dispatch" not in preset_for("vector") and preset_for("frames", state_is_data=True) == {}
    assert PPOConfig().iterations_per_dispatch == 1 and not PPOConfig().bootstrap_truncated
    with pytest.raises(ConfigError, match="bootstrap_truncated=True works with synchronous envs only"):
        PPOConfig(bootstrap_truncated=True, async_batch_size=4).validate()
    with pytest.raises(ConfigError, match="iterations_per_dispatch=0 must be a positive integer"):
        PPOConfig(iterations_per_dispatch=0).validate()


def test_an_async_batch_is_num_steps_receives_of_async_batch_size_envs():
    config = PPOConfig(num_envs=16, async_batch_size=8).validate()
    assert (config.batch_size, config.minibatch_size, config.num_iterations) == (1024, 256, 9765)
    assert PPOConfig(num_envs=16).batch_size == 2048


FIELDS = {field.name: field for field in dataclasses.fields(PPOConfig)}
# Wrong in kind, whatever the field's range: a value of another type, a string of digits, and one too long to show.
NOT_NUMBERS: list[Any] = ["0.1", "8", "", "9" * 10_000, None, [1], {"a": 1}]
NOT_INTS: list[Any] = [*NOT_NUMBERS, True, False, 1.5, 8.0, math.nan, math.inf, INT32_MAX + 1, -(2**31) - 1, 10**5000]
NOT_FLOATS: list[Any] = [*NOT_NUMBERS, True, False, math.nan, math.inf, -math.inf, 1e39, -1e39, 10**400, 2**128]
NOT_BOOLS: list[Any] = [1, 0, 1.0, "yes", "true", "", None]
NOT_STRINGS: list[Any] = ["", None, 1, 1.5, True, b"Pong-v5", ["Pong-v5"]]
# Of the right kind, out of the field's range.
OUT_OF_RANGE: dict[str, list[Any]] = {
    "total_timesteps": [0, -1],
    "learning_rate": [0.0, -1e-3, 0, 1e-40, FLOAT32_TINY / 2],
    "num_envs": [0, -8],
    "num_steps": [0, -1],
    "gamma": [-0.01, 1.01, 2, -1],
    "gae_lambda": [-0.01, 1.01],
    "num_minibatches": [0, -4],
    "update_epochs": [0, -1],
    "clip_coef": [-0.1, -1],
    "ent_coef": [-1e-9],
    "vf_coef": [-0.5],
    "max_grad_norm": [0.0, -0.5],
    "seed": [-1, -(2**31)],
    "conv_impl": ["fft", "AUTO", "x" * 10_000],
    "minibatch_unroll": [0, -1],
    "checkpoint_every": [0, -200],
    "num_seeds": [0, -2],
    "async_batch_size": [-1],
}
BAD_BY_TYPE: dict[object, list[Any]] = {bool: NOT_BOOLS, int: NOT_INTS, float: NOT_FLOATS, str: NOT_STRINGS}
BAD_VALUES = [
    pytest.param(name, value, id=f"{name}-{i}")
    for name, field in FIELDS.items()
    if name != "sweep"  # a structure of values, each checked as its field (tests/test_sweep.py)
    for i, value in enumerate(BAD_BY_TYPE[field.type] + OUT_OF_RANGE.get(name, []))
]


def assert_one_line_naming(error: ConfigError, name: str) -> None:
    message = str(error)
    assert message.startswith(f"{name}="), message
    assert "; allowed: " in message, message
    assert "\n" not in message and len(message) < 300, message


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_every_field_refuses_bad_values_naming_the_field(name, value):
    with pytest.raises(ConfigError) as error:
        PPOConfig(**{name: value}).validate()
    assert_one_line_naming(error.value, name)


def test_every_field_has_a_known_type_a_rule_and_a_one_line_help():
    for name, field in FIELDS.items():
        assert field.type in (bool, int, float, str) or name == "sweep", name
        assert field.type not in (int, float) or name in FIELD_RANGES, name
        help_text = field.metadata["help"]
        assert help_text and "\n" not in help_text, name
        assert help_text.endswith("(CleanRL's)" if name in CLEANRL else "(ppo_eqx's own)"), name


@pytest.mark.parametrize(
    "changes",
    [
        {"learning_rate": 1, "gamma": 1, "gae_lambda": 0, "vf_coef": 0, "ent_coef": 0, "clip_coef": 0},
        {"vf_coef": FLOAT32_MAX, "max_grad_norm": FLOAT32_MAX, "learning_rate": FLOAT32_TINY},
        {"seed": 0},
        {"seed": INT32_MAX - 7},  # env 7 of 8 gets the largest int32 seed
        {"seed": INT32_MAX - 9, "num_seeds": 3, "total_timesteps": INT32_MAX},
        {"num_envs": 2**20, "num_steps": 2**10, "num_minibatches": 1, "total_timesteps": 2**30},
        {"env_id": "x" * 10_000},  # any name here; the env backend refuses what it does not know
    ],
)
def test_edges_of_the_allowed_ranges_pass(changes):
    config = PPOConfig(**changes)
    assert config.validate() is config


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seed": INT32_MAX - 6}, r"seed=2147483641 gives env seeds up to .*=2147483648, but the env backend takes "),
        ({"seed": INT32_MAX - 8, "num_seeds": 3}, r"allowed: 0 \.\. 2147483638 with num_seeds=3, num_envs=8"),
        ({"seed": INT32_MAX}, r"allowed: 0 \.\. 2147483640"),
        ({"num_envs": 2**21, "num_steps": 2**10}, r"num_seeds\*num_envs\*num_steps=2147483648 transitions"),
        ({"num_seeds": 2**12, "num_envs": 2**10, "num_steps": 2**10}, "do not fit int32; allowed: at most 2147483647"),
    ],
)
def test_products_and_derived_seeds_must_fit_int32(changes, message):
    with pytest.raises(ConfigError, match=message) as error:
        PPOConfig(**changes).validate()
    assert "\n" not in str(error.value)


def test_the_env_backend_takes_exactly_the_int32_seeds():
    """What the seed's range rests on: EnvPool asserts that every env seed fits int32."""
    envpool = pytest.importorskip("envpool")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium's Box warns about its float64 bounds
        envpool.make("CartPole-v1", env_type="gymnasium", num_envs=2, env_seed=[0, INT32_MAX])
        with pytest.raises(AssertionError, match="int32"):
            envpool.make("CartPole-v1", env_type="gymnasium", num_envs=2, env_seed=[0, INT32_MAX + 1])


def test_from_dict_refuses_what_is_not_a_dict_of_known_fields():
    for values in ([1, 2], "learning_rate", None, {1: 2}, {"env_id": "Pong-v5", "x" * 1000: 1}):
        with pytest.raises(ConfigError, match="config") as error:
            PPOConfig.from_dict(values)  # type: ignore[arg-type]
        assert "\n" not in str(error.value) and len(str(error.value)) < 600
    with pytest.raises(ConfigError, match="learning_rate='0.1' is a str, not a number"):
        PPOConfig.from_dict({"learning_rate": "0.1"})


def test_from_dict_turns_a_constructor_type_error_into_a_config_error(monkeypatch):
    def refuse(*args, **kwargs):
        raise TypeError("something the constructor did not take")

    monkeypatch.setattr(PPOConfig, "__init__", refuse)
    with pytest.raises(ConfigError, match="something the constructor did not take"):
        PPOConfig.from_dict({"seed": 3})


ANYTHING = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),  # nan, inf and beyond float32 included
    st.text(max_size=20),
    st.booleans(),
    st.none(),
)


def plausible(field: dataclasses.Field) -> st.SearchStrategy[Any]:
    """Values near and inside the field's range, so that many configs pass and the cross-checks run."""
    if field.name == "sweep":
        names = st.sampled_from(["learning_rate", "gamma", "norm_adv", "num_envs", "bogus"])
        values = st.lists(st.one_of(st.booleans(), st.floats(-0.5, 1.5), st.integers(-2, 3)), max_size=3)
        return st.one_of(st.just(()), st.dictionaries(names, values, max_size=3))
    if field.type is bool:
        return st.booleans()
    if field.type is str:
        return st.sampled_from([*CONV_IMPLS, "Pong-v5", ""])
    if field.type is int:
        return st.one_of(st.integers(-2, 1100), st.sampled_from([INT32_MAX - 8, INT32_MAX, 2**31]))
    return st.one_of(st.floats(-0.5, 1.5), st.sampled_from([0, 1, FLOAT32_MAX, 3.5e38, 1e-39]))


INSTANCE_OF: dict[object, type | tuple[type, ...]] = {bool: bool, int: int, float: (int, float), str: str}
"""What a valid value of each declared type is an instance of: an int is a number too."""


def assert_valid_or_refused(values: dict[str, Any]) -> bool:
    """validate() returns a config that survives JSON (numbers finite and within int32/float32), or refuses."""
    try:
        config = PPOConfig(**values).validate()
    except ConfigError as error:
        assert "\n" not in str(error) and "; allowed: " in str(error)
        return False
    for agent in config.agent_configs() if config.sweep else []:  # every swept value is a valid value too
        assert_valid_or_refused(agent.to_dict())
    for name, field in FIELDS.items():
        value = getattr(config, name)
        if name == "sweep":
            assert isinstance(value, tuple) and all(isinstance(values, tuple) for _, values in value)
            continue
        assert isinstance(value, INSTANCE_OF[field.type]) and (field.type is bool or not isinstance(value, bool)), name
        if field.type is int:
            assert -(2**31) <= value <= INT32_MAX, name
        if field.type is float:
            assert math.isfinite(value) and abs(value) <= FLOAT32_MAX, name
    text = json.dumps(config.to_dict(), allow_nan=False)
    assert PPOConfig.from_dict(json.loads(text)) == config
    return True


@given(st.fixed_dictionaries({}, optional={name: ANYTHING for name in FIELDS}))
def test_validate_returns_a_usable_config_or_raises_config_error_for_any_values(values):
    assert_valid_or_refused(values)


@settings(max_examples=200)
@given(st.fixed_dictionaries({}, optional={name: plausible(field) for name, field in FIELDS.items()}))
def test_validate_returns_a_usable_config_or_raises_config_error_near_the_edges(values):
    event("valid" if assert_valid_or_refused(values) else "refused")


@pytest.mark.unit
def test_a_sweep_written_as_its_flag_is_an_item_of_the_configs_sweep():
    assert sweep_item("learning-rate=0.001, 3e-4") == ("learning_rate", (0.001, 0.0003))
    assert sweep_item("norm-adv=true,FALSE") == ("norm_adv", (True, False))
    config = PPOConfig(env_id="CartPole-v1", sweep=(sweep_item("gamma=0.9,0.99"),)).validate()
    assert config.num_agents == 2
    for text, said in [
        ("gamma", "is not NAME=V1,V2"),
        ("gama=0.9", "is not a hyperparameter"),
        ("num-envs=4,8", "num-envs cannot be swept in one program"),
        ("gamma=0.9,,0.99", "has an empty value"),
        ("norm-adv=yes", "is not true or false"),
        ("gamma=high", "is not a number"),
    ]:
        with pytest.raises(ConfigError, match=said):
            sweep_item(text)


def test_every_field_is_sweepable_or_says_why_not() -> None:
    from ppo_eqx.sweeps import NOT_SWEEPABLE, SWEEPABLE

    fields = {field.name for field in dataclasses.fields(PPOConfig)}
    assert set(SWEEPABLE) | set(NOT_SWEEPABLE) == fields
    assert not set(SWEEPABLE) & set(NOT_SWEEPABLE)


def test_the_lstm_on_frames_takes_cleanrls_ppo_atari_lstm_settings() -> None:
    assert preset_for("frames", network="lstm") == {"clip_vloss": True, "loss": "cleanrl-torch"}
    assert preset_for("vector", network="lstm") == preset_for("vector")  # PureJaxRL's ppo_rnn: CleanRL's ppo.py's
