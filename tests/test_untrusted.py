"""Untrusted numbers (issue 53): a checkpoint whose parameters or normalisation statistics are not finite, or whose
variances are negative, is refused by ``load_checkpoint``, ``--resume`` and ``eval`` in one line; ``eval`` writes a
return that is not finite as JSON null and never loses its results; every output path is tried before the first
episode."""

import hashlib
import io
import json
from pathlib import Path

import equinox as eqx
import jax.numpy as jnp
import pytest

import ppo_eqx
from ppo_eqx.cli import main
from ppo_eqx.host.checkpoint import list_checkpoints

pytestmark = pytest.mark.subprocess

QUIET = ["--no-progress", "--no-tensorboard"]


def forge(run: Path, change) -> Path:
    """The run's newest checkpoint with ``change`` applied to its arrays, its size and hash made to match: what a
    damaged or hostile file that passes the hash check holds."""
    path = list_checkpoints(run)[-1]
    file = ppo_eqx.read_checkpoint(path)
    config = ppo_eqx.PPOConfig.from_dict(file.metadata["config"])
    from ppo_eqx.host.named import backend_named

    spec = backend_named(config.env_backend).spec(config.env_id)
    checkpoint = change(ppo_eqx.load_checkpoint(file, config, spec))
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, checkpoint)
    data = buffer.getvalue()
    path.with_suffix(".eqx").write_bytes(data)
    metadata = {**file.metadata, "arrays_bytes": len(data), "arrays_sha256": hashlib.sha256(data).hexdigest()}
    path.write_text(json.dumps(metadata))
    return path


def _nan_bias(checkpoint):
    return eqx.tree_at(lambda c: c.model.critic.layers[-1].bias, checkpoint, jnp.full((1,), jnp.nan))


def _negative_variance(checkpoint):
    return eqx.tree_at(lambda c: c.envs.handle.obs.var, checkpoint, -checkpoint.envs.handle.obs.var)


@pytest.mark.parametrize(
    ("task", "change", "words"),
    [
        (["--env-id", "CartPole-v1", "--num-steps", "32"], _nan_bias, "parameters or optimizer state that are not"),
        (["--env-id", "Pendulum-v1", "--env-backend", "gymnax", "--num-steps", "64"], _negative_variance,
         "impossible normalisation statistics of the observations'"),
    ],
)  # fmt: skip
def test_a_checkpoint_of_untrusted_numbers_is_refused_in_one_line(tmp_path: Path, capsys, task, change, words) -> None:
    pytest.importorskip("gymnax")
    run = tmp_path / "run"
    steps, every = str(4 * 64 * 4), ["--checkpoint-every", "2"]
    assert (
        main(["train", *task, "--num-envs", "4", "--total-timesteps", steps, *every, "--run-dir", str(run), *QUIET])
        == 0
    )
    last = list_checkpoints(run)[-1]  # as if it stopped after iteration 2: there is something to resume
    last.unlink()
    last.with_suffix(".eqx").unlink()
    forged = forge(run, change)
    before = forged.read_bytes()
    for argv, status in ((["train", "--resume", str(run), *QUIET], 2), (["eval", str(run), "--episodes", "1"], 2)):
        capsys.readouterr()
        assert main(argv) == status
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0] and str(forged) in err[0], err
    assert forged.read_bytes() == before and not (run / "eval.json").exists()


def test_eval_writes_returns_that_are_not_finite_as_null(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    flags = ["--env-id", "tests.hostile:late_nan", "--num-envs", "4", "--num-steps", "16", "--total-timesteps", "64"]
    assert main(["train", *flags, "--run-dir", str(run), *QUIET]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "4"]) == 0
    out = capsys.readouterr().out
    result = json.loads((run / "eval.json").read_text())
    assert len(result["returns"]) == 4 and None in result["returns"], result["returns"]
    odd = result["non_finite_returns"]
    assert odd == sum(r is None for r in result["returns"]) and f"({odd} not finite, written as null)" in out


def test_an_unwritable_video_path_is_refused_before_the_first_episode(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    flags = ["--env-id", "CartPole-v1", "--num-steps", "32", "--num-envs", "4", "--total-timesteps", "128"]
    assert main(["train", *flags, "--run-dir", str(run), *QUIET]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "2", "--video", "/proc/nope.mp4"]) == 2
    captured = capsys.readouterr()
    assert "evaluating" not in captured.out  # no episode was played
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "--video /proc/nope.mp4" in err[0], err
