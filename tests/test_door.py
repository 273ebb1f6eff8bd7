"""User code is checked at the door (issue 53): a loss, an env factory or a backend of the user's that breaks its
contract, raises, or calls ``sys.exit``, is one line naming it, its message and where in the user's file, exit
status 2, and nothing written; through the library, one ``ConfigError``."""

from pathlib import Path

import pytest

import ppo_eqx
from ppo_eqx.cli import main

from .user_env import Corridor

pytestmark = pytest.mark.subprocess

CORRIDOR = ["--env-id", "tests.hostile:corridor", "--num-steps", "16", "--total-timesteps", "256", "--no-progress"]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--loss", "tests.hostile:loss_not_scalar"], "loss of array of float32[3]; allowed: a float scalar"),
        (["--loss", "tests.hostile:loss_integer"], "returned a loss of array of int32[]; allowed: a float scalar"),
        (["--loss", "tests.hostile:loss_not_tuple"], "returned a array of float32[]"),
        (["--loss", "tests.hostile:loss_raises"], "raised RuntimeError: the user's loss failed"),
        (["--loss", "tests.hostile:loss_wrong_signature"], "raised TypeError"),
        (["--loss", "tests.hostile:loss_string_metric"], "reports note as str; allowed: a number"),
        (["--loss", "tests.hostile:loss_builtin_name"], "reports 'sps'; allowed: names that are identifiers"),
        (["--loss", "tests.hostile:loss_exits"], "called sys.exit(0)"),
        (["--env-id", "tests.hostile:env_exits"], "called sys.exit(3) when called"),
        (["--env-id", "tests.hostile:env_interrupts"], "raised KeyboardInterrupt when called"),
        (["--env-id", "tests.hostile:env_exits_when_stepped"], "step(key, state, action, params) called sys.exit(0)"),
        (["--env-backend", "tests.hostile:spec_raises"], "raised ValueError: no such task here in spec("),
        (["--env-backend", "tests.hostile:makes_no_pool"], "make(...) returned a str; allowed: a ppo_eqx Pool"),
        (["--env-backend", "tests.hostile:exits"], "called sys.exit(0) in spec("),
    ],
)
def test_user_code_that_breaks_its_contract_is_one_line_at_the_door(
    tmp_path: Path, capsys, flags: list[str], words: str
) -> None:
    run = tmp_path / "run"
    assert main(["train", *CORRIDOR, *flags, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    named = flags[-1]
    assert named in err[0] or named.split(":")[1] in err[0], err
    if "raised" in words or "sys.exit" in words:
        assert "tests/hostile.py:" in err[0], err  # where in the user's file
    assert not run.exists()


@pytest.mark.envpool
def test_the_library_refuses_a_broken_loss_when_the_trainer_is_made() -> None:
    from .hostile import loss_not_tuple

    env = Corridor()
    config = ppo_eqx.PPOConfig.for_task(env, num_steps=16, total_timesteps=256)
    with pytest.raises(ppo_eqx.ConfigError, match=r"loss=tests.hostile:loss_not_tuple returned a array of float32\[\]"):
        ppo_eqx.Trainer(config, env=env, loss=loss_not_tuple)  # type: ignore[arg-type]
