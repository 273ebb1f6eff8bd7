"""A model and an optimizer of the user's (issue 51): by object (``Trainer(model=..., optimizer=...)``) and by
``--network``/``--optimizer MODULE:CALLABLE``, each trains, checkpoints, resumes bit for bit and evaluates; a
checkpoint of another model is refused in one line; a factory that breaks its contract is one line naming it,
before anything is written."""

import json
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest

import ppo_eqx
from ppo_eqx.cli import main
from ppo_eqx.errors import CheckpointError, ConfigError

from .comparisons import leaves_equal, metrics
from .user_model import TinyPolicy, make_tiny, sgd

pytestmark = pytest.mark.envpool

CARTPOLE = ["--env-id", "CartPole-v1", "--num-envs", "4", "--num-steps", "128", "--no-progress", "--no-tensorboard"]


def _config(iterations: int) -> ppo_eqx.PPOConfig:
    return ppo_eqx.PPOConfig.for_task("CartPole-v1", total_timesteps=4 * 128 * iterations, checkpoint_every=2)


def test_a_model_and_optimizer_by_object_train_checkpoint_and_resume_bit_for_bit(tmp_path: Path) -> None:
    config = _config(4)
    with ppo_eqx.Trainer(config, model=make_tiny, optimizer=sgd) as trainer:
        whole = [r for r in ppo_eqx.run(trainer)]
        final = trainer.checkpoint()
    assert isinstance(final.model, TinyPolicy)
    assert "learning_rate" not in whole[0]  # sgd's state holds no injected learning rate
    with ppo_eqx.Trainer(config, model=make_tiny, optimizer=sgd) as trainer:
        first = list(ppo_eqx.run(trainer, num_iterations=2))
        path = ppo_eqx.save_checkpoint(tmp_path / "run", trainer.checkpoint(), config, trainer.spec, keep=1)
    loaded = ppo_eqx.load_checkpoint(
        ppo_eqx.read_checkpoint(path), config, trainer.spec, model=make_tiny, optimizer=sgd
    )
    with ppo_eqx.Trainer(config, restore=loaded, model=make_tiny, optimizer=sgd) as trainer:
        rest = list(ppo_eqx.run(trainer))
        again = trainer.checkpoint()
    volatile = ("sps", "time_elapsed")
    strip = [{k: v for k, v in r.items() if k not in volatile} for r in first + rest]
    assert strip == [{k: v for k, v in r.items() if k not in volatile} for r in whole]
    assert leaves_equal(eqx.tree_at(lambda c: c.envs, again, None), eqx.tree_at(lambda c: c.envs, final, None))
    # Loaded as ppo_eqx's own network, it is refused: another model's arrays.
    refused = "holds a model of class TinyPolicy .6 arrays.; network='feedforward' makes one of class ActorCritic"
    with pytest.raises(CheckpointError, match=refused):
        ppo_eqx.load_checkpoint(ppo_eqx.read_checkpoint(path), config, trainer.spec, optimizer=sgd)
    games = ppo_eqx.evaluate(again.model, config, episodes=2, seed=1, key=jax.random.key(0))
    assert len(games.returns) == 2


@pytest.mark.subprocess
def test_network_and_optimizer_by_name_train_resume_and_evaluate(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    names = ["--network", "tests.user_model:make_tiny", "--optimizer", "tests.user_model:sgd"]
    assert main(["train", *CARTPOLE, *names, "--total-timesteps", "2048", "--checkpoint-every", "2", "--run-dir",
                 str(run)]) == 0  # fmt: skip
    config = json.loads((run / "config.json").read_text())
    assert (config["network"], config["optimizer"]) == ("tests.user_model:make_tiny", "tests.user_model:sgd")
    whole = metrics(run)
    from .comparisons import resume_a_copy

    resume_a_copy(run, tmp_path / "resumed", capsys)
    assert metrics(tmp_path / "resumed") == whole
    assert main(["eval", str(run), "--episodes", "2", "--output", str(tmp_path / "eval.json")]) == 0
    assert len(json.loads((tmp_path / "eval.json").read_text())["returns"]) == 2


@pytest.mark.subprocess
def test_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", *CARTPOLE, "--network", "tests.user_model:make_tiny", "--total-timesteps", "1024",
                 "--run-dir", str(run)]) == 0  # fmt: skip
    newest = sorted((run / "checkpoints").glob("iter_*.json"))[-1]
    metadata = json.loads(newest.read_text())
    metadata["config"]["network"] = "feedforward"  # as if it named ppo_eqx's own network
    newest.write_text(json.dumps(metadata))
    before = sorted(p.name for p in run.rglob("*"))
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "1", "--output", str(tmp_path / "eval.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a model of class TinyPolicy" in err[0], err
    assert "the network it was trained with" in err[0], err
    assert sorted(p.name for p in run.rglob("*")) == before


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--network", "tests.user_model:not_a_policy", "returned a dict; allowed: a ppo_eqx.Policy"),
        ("--network", "tests.user_model:wrong_actions", "made a model of observations (4,) and 3 actions"),
        ("--network", "tests.user_model:raises", "raised RuntimeError: the user's factory failed"),
        ("--network", "tests.user_model:nowhere", "has no 'nowhere'"),
        (
            "--optimizer",
            "tests.user_model:not_an_optimizer",
            "returned a str; allowed: an optax.GradientTransformation",
        ),
        ("--optimizer", "tests.user_model:make_tiny", "raised"),
    ],
)
def test_a_factory_that_breaks_its_contract_is_one_line_and_nothing_written(
    tmp_path: Path, capsys, flag: str, value: str, words: str
) -> None:
    run = tmp_path / "run"
    assert main(["train", *CARTPOLE, flag, value, "--total-timesteps", "512", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and value.split(":")[1] in err[0], err
    assert not run.exists()


def test_the_library_refuses_a_broken_factory_by_object() -> None:
    from .user_model import not_a_policy

    with pytest.raises(ConfigError, match="returned a dict"):
        ppo_eqx.Trainer(_config(1), model=not_a_policy)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="PPOConfig"):  # the test run's type checker, or the Trainer's own line
        ppo_eqx.Trainer("CartPole-v1")  # type: ignore[arg-type]


def test_cleanrls_optimizer_by_name_is_make_optimizer() -> None:
    with ppo_eqx.Trainer(_config(1)) as trainer:
        assert trainer.optimizer is ppo_eqx.make_optimizer and trainer.model is None
        record = next(iter(ppo_eqx.run(trainer)))
    assert np.isclose(record["learning_rate"], 2.5e-4)
