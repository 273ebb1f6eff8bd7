"""``ppo-eqx train`` of one or two agents on a gymnax vector task schedules XLA:CPU's ops for sequence
(``cli.environment.schedule_small_programs``): which runs get the flag, that a user's own flags win, and that
``XLA_FLAGS`` is put back as it was."""

import argparse
from pathlib import Path

import pytest

from ppo_eqx.cli import environment
from ppo_eqx.cli.command_line import build_parser
from ppo_eqx.cli.environment import SEQUENTIAL_SCHEDULER, restore_xla_flags, schedule_small_programs

pytestmark = pytest.mark.unit


def train_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["train", *flags])


@pytest.fixture
def no_backend(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """As in a fresh ``ppo-eqx`` process: jax has made no backend, XLA_FLAGS unset."""
    monkeypatch.setattr(environment, "_backend_started", lambda: False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    return monkeypatch


GYMNAX_CARTPOLE = ("--env-backend", "gymnax", "--env-id", "CartPole-v1")


@pytest.mark.parametrize(
    "flags",
    [
        GYMNAX_CARTPOLE,
        (*GYMNAX_CARTPOLE, "--num-seeds", "2"),
        (*GYMNAX_CARTPOLE, "--sweep", "learning_rate=1e-4,3e-4"),  # 2 settings x 1 seed
        ("--env-backend", "gymnax", "--env-id", "Acrobot-v1"),
    ],
)
def test_one_or_two_small_agents_get_the_sequential_scheduler_until_the_command_ends(no_backend, flags):
    saved = schedule_small_programs(train_args(*flags))
    assert environment.os.environ["XLA_FLAGS"] == SEQUENTIAL_SCHEDULER
    restore_xla_flags(saved)
    assert "XLA_FLAGS" not in environment.os.environ


@pytest.mark.parametrize(
    "flags",
    [
        (*GYMNAX_CARTPOLE, "--num-seeds", "4"),
        (*GYMNAX_CARTPOLE, "--sweep", "learning_rate=1e-4,3e-4", "--num-seeds", "2"),  # 2 settings x 2 seeds
        ("--env-backend", "gymnax", "--env-id", "Breakout-MinAtar"),
        ("--env-id", "CartPole-v1"),  # EnvPool's: its envs step on the host
        ("--env-id", "Breakout-v5"),
        ("--resume", "runs/some_run"),
    ],
)
def test_other_runs_keep_xla_defaults(no_backend, flags):
    assert schedule_small_programs(train_args(*flags)) is None
    assert "XLA_FLAGS" not in environment.os.environ


def test_a_users_flags_are_kept_and_their_scheduler_choice_wins(no_backend):
    no_backend.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
    saved = schedule_small_programs(train_args(*GYMNAX_CARTPOLE))
    assert environment.os.environ["XLA_FLAGS"] == f"--xla_cpu_max_isa=AVX2 {SEQUENTIAL_SCHEDULER}"
    restore_xla_flags(saved)
    assert environment.os.environ["XLA_FLAGS"] == "--xla_cpu_max_isa=AVX2"
    no_backend.setenv("XLA_FLAGS", "--xla_cpu_enable_concurrency_optimized_scheduler=true")
    assert schedule_small_programs(train_args(*GYMNAX_CARTPOLE)) is None
    assert environment.os.environ["XLA_FLAGS"] == "--xla_cpu_enable_concurrency_optimized_scheduler=true"


def test_nothing_changes_once_jax_has_a_backend(monkeypatch):
    monkeypatch.setattr(environment, "_backend_started", lambda: True)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert schedule_small_programs(train_args(*GYMNAX_CARTPOLE)) is None
    assert "XLA_FLAGS" not in environment.os.environ


@pytest.mark.envpool
def test_one_agent_of_a_continuous_envpool_task_gets_the_sequential_scheduler(no_backend):
    """Its rollout is a host loop (``auto`` is host-envs there): each step's policy is a program of its own."""
    saved = schedule_small_programs(train_args("--env-id", "HalfCheetah-v4"))
    assert environment.os.environ["XLA_FLAGS"] == SEQUENTIAL_SCHEDULER
    restore_xla_flags(saved)
    for flags in (("--num-seeds", "2"), ("--rollout-on", "device"), ("--env-id", "Breakout-v5"), ("--env-id", "Nope")):
        assert schedule_small_programs(train_args("--env-id", "HalfCheetah-v4", *flags)) is None, flags
        assert "XLA_FLAGS" not in environment.os.environ


def test_compilation_cache_on_a_tpu_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A TPU's process keeps its compiled programs in $PPO_EQX_CACHE/xla; a CPU's, or one whose cache is set by
    the user already, is left as it is."""
    import jax

    from ppo_eqx.cli.environment import use_compilation_cache

    monkeypatch.setenv("PPO_EQX_CACHE", str(tmp_path))
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    before = jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue]
    threshold = jax.config.jax_persistent_cache_min_compile_time_secs  # pyright: ignore[reportAttributeAccessIssue]
    try:
        assert use_compilation_cache() is None  # this machine's CPU
        assert jax.config.jax_persistent_cache_min_compile_time_secs == threshold  # pyright: ignore[reportAttributeAccessIssue]
        monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
        assert use_compilation_cache() == tmp_path / "xla"
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")  # pyright: ignore[reportAttributeAccessIssue]
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0  # pyright: ignore[reportAttributeAccessIssue]
        monkeypatch.setenv("PPO_EQX_CACHE", str(tmp_path / "other"))
        assert use_compilation_cache() is None  # one is set: kept
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", threshold)


def test_a_users_cache_threshold_is_kept_on_a_tpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import jax

    from ppo_eqx.cli.environment import use_compilation_cache

    monkeypatch.setenv("PPO_EQX_CACHE", str(tmp_path))
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "2.5")
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    before = jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue]
    threshold = jax.config.jax_persistent_cache_min_compile_time_secs  # pyright: ignore[reportAttributeAccessIssue]
    try:
        assert use_compilation_cache() == tmp_path / "xla"
        assert jax.config.jax_persistent_cache_min_compile_time_secs == threshold  # pyright: ignore[reportAttributeAccessIssue]
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
