"""The README's library example runs as written and does what its comments say."""

import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.envpool

README = Path(__file__).resolve().parents[1] / "README.md"
OWN = "Your own env, loss, network and optimizer"


def library_example(heading: str = "Library", number: int = 0) -> str:
    """The ``number``-th python example of the README's section ``heading``."""
    section = README.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(found) > number, f"README's {heading} section has no python example {number}"
    return found[number]


def test_the_library_example_trains_saves_resumes_and_plays(tmp_path, monkeypatch, capsys):
    code = library_example()
    assert len(code.splitlines()) <= 22  # an example, not a program
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    lines = capsys.readouterr().out.splitlines()
    steps = [int(line.split()[0]) for line in lines[:-1]]
    assert steps == [512, 1024, 1536, 2048]  # one row per iteration of 4 envs x 128 steps
    last_iteration, returns = lines[-1].split(" ", 1)
    assert last_iteration == "6"  # resumed at 4, two more
    assert returns.startswith("[") and len(eval(returns)) == 4  # four games played
    assert [p.name for p in (tmp_path / "runs" / "library" / "checkpoints").iterdir()] != []


@pytest.mark.unit
def test_the_your_own_env_example_trains_resumes_and_plays_a_users_env(tmp_path, monkeypatch, capsys):
    """The README's "Your own env" section, with ``my_envs`` standing for the user's module (tests/user_env.py)."""
    from . import user_env

    section = README.read_text().split(f"## {OWN}\n", 1)[1].split("\n## ", 1)[0]
    assert len(section.strip().splitlines()) <= 65
    monkeypatch.setitem(sys.modules, "my_envs", user_env)
    monkeypatch.chdir(tmp_path)
    exec(compile(library_example(OWN), str(README), "exec"), {"__name__": "readme"})
    last_iteration, returns = capsys.readouterr().out.strip().split(" ", 1)
    assert last_iteration == "4"  # two iterations, saved, and two more after the restore
    assert len(eval(returns)) == 8
    assert "--env-id my_envs:Corridor" in section


@pytest.mark.envpool
def test_the_your_own_network_and_optimizer_example_trains(tmp_path, monkeypatch, capsys):
    """The section's second example: a network and an optimizer of the user's, by object."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme"}
    exec(compile(library_example(OWN, 1), str(README), "exec"), namespace)
    returns = eval(capsys.readouterr().out.strip())
    assert len(returns) == 2  # two iterations of CartPole's preset, 4 envs x 128 steps
    import ppo_eqx

    linear = namespace["Linear"]
    assert isinstance(linear, type) and issubclass(linear, ppo_eqx.CategoricalPolicy)


@pytest.mark.unit
def test_the_public_face_has_the_library_and_not_its_internals():
    import ppo_eqx

    for name in ("Trainer", "run", "train", "save_checkpoint", "read_checkpoint", "load_checkpoint", "evaluate"):
        assert callable(getattr(ppo_eqx, name)), name
    for name in ("init_state", "make_iteration", "resolve_conv_impl", "AgentHyperparameters", "PPOConfig"):
        assert hasattr(ppo_eqx, name), name
    # The pure functions that users are promised, each with what it takes (rollout: its carry).
    for name in ("rollout", "RolloutCarry", "init_episode_stats", "compute_gae", "ppo_loss", "update", "ActorCritic"):
        assert hasattr(ppo_eqx, name), name
    for internal in ("AsyncRolloutCarry", "OneDevice", "Placement", "agent_axes"):
        assert not hasattr(ppo_eqx, internal), internal
