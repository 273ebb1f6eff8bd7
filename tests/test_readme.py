"""The README's library example runs as written and does what its comments say."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.envpool

README = Path(__file__).resolve().parents[1] / "README.md"


def library_example() -> str:
    section = README.read_text().split("## Library\n", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, "README's Library section has no python example"
    return found.group(1)


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
def test_the_public_face_has_the_library_and_not_its_internals():
    import ppo_eqx

    for name in ("Trainer", "run", "train", "save_checkpoint", "read_checkpoint", "load_checkpoint", "evaluate"):
        assert callable(getattr(ppo_eqx, name)), name
    for name in ("init_state", "make_iteration", "resolve_conv_impl", "AgentHyperparameters", "PPOConfig"):
        assert hasattr(ppo_eqx, name), name
    for internal in ("AsyncRolloutCarry", "OneDevice", "Placement", "agent_axes"):
        assert not hasattr(ppo_eqx, internal), internal
