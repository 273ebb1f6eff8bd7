import json

import imageio.v3 as iio
import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppo_eqx import PPOConfig
from ppo_eqx.cli import main
from ppo_eqx.core.envs import env_spec
from ppo_eqx.host.checkpoint import save_checkpoint
from ppo_eqx.host.evaluate import MAX_ENVS, episode_quotas, evaluate, summarise
from ppo_eqx.host.fresh import init_checkpoint

pytestmark = pytest.mark.envpool


@pytest.mark.unit
@given(st.integers(1, 200), st.integers(1, MAX_ENVS))
def test_episodes_are_shared_evenly(episodes, num_envs):
    quotas = episode_quotas(episodes, num_envs)
    assert sum(quotas) == episodes and max(quotas) - min(quotas) <= 1


def untrained_run(run_dir, config: PPOConfig):
    """A run directory whose only checkpoint is the freshly initialised model."""
    spec = env_spec(config.env_id)
    (run_dir / "config.json").parent.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    save_checkpoint(run_dir, init_checkpoint(config, spec, conv_impl="matmul"), config, spec, keep=3)
    return run_dir


def test_cartpole_returns_are_the_number_of_steps():
    """CartPole pays 1 per step, so the score of a game is its length; 20 games on 16 envs: envs 0-3 play 2."""
    config = PPOConfig(env_id="CartPole-v1", num_envs=4)
    model = init_checkpoint(config, env_spec(config.env_id), conv_impl="matmul").model
    result = evaluate(model, config, episodes=20, seed=5, key=jax.random.PRNGKey(0))
    assert len(result.returns) == len(result.lengths) == 20
    second_games = {1, 3, 5, 7}  # env-major: env i's games are consecutive
    for index, (score, length) in enumerate(zip(result.returns, result.lengths, strict=True)):
        # EnvPool's reset step (reward 0) opens every game after an env's first and counts in its length.
        assert length == score + (index in second_games), index
    again = evaluate(model, config, episodes=20, seed=5, key=jax.random.PRNGKey(0))
    assert again == result
    other = evaluate(model, config, episodes=20, seed=6, key=jax.random.PRNGKey(0))
    assert other != result
    summary = summarise(result)
    assert summary["mean_return"] == pytest.approx(np.mean(result.returns))
    assert summary["std_return"] == pytest.approx(np.std(result.returns))
    assert (summary["min_return"], summary["max_return"]) == (min(result.returns), max(result.returns))


def test_eval_writes_eval_json_and_a_video_that_decodes(tmp_path, capsys):
    config = PPOConfig(env_id="Breakout-v5", num_envs=4, num_steps=32, total_timesteps=768, checkpoint_every=2)
    run_dir = untrained_run(tmp_path / "run", config)
    video = tmp_path / "game.mp4"
    argv = ["eval", str(run_dir), "--episodes", "3", "--video", str(video)]
    assert main(argv) == 0
    result = json.loads((run_dir / "eval.json").read_text())
    assert (result["episodes"], len(result["returns"]), len(result["lengths"])) == (3, 3, 3)
    assert (result["env_id"], result["iteration"], result["greedy"], result["video"]) == (
        "Breakout-v5", 0, False, str(video),
    )  # fmt: skip
    assert result["mean_return"] == pytest.approx(np.mean(result["returns"]))
    assert all(score >= 0 for score in result["returns"])
    frames = iio.imread(video, plugin="pyav")
    # The screen before the first step, then one per step of env 0's first game; RGB at the emulator's size.
    assert len(frames) == result["lengths"][0] + 1
    assert frames.shape[1:] == (210, 160, 3) and frames.dtype == np.uint8
    assert len({frame.tobytes() for frame in frames}) > 1
    assert "over 3 episodes" in capsys.readouterr().out


def test_greedy_eval_of_a_checkpoint_file_with_a_gif(tmp_path):
    config = PPOConfig(env_id="CartPole-v1", num_envs=4)
    run_dir = untrained_run(tmp_path / "run", config)
    output, video = tmp_path / "greedy.json", tmp_path / "game.gif"
    checkpoint = run_dir / "checkpoints" / "iter_000000.eqx"
    argv = ["eval", str(checkpoint), "--greedy", "--episodes", "2", "--output", str(output), "--video", str(video)]
    assert main(argv) == 0
    result = json.loads(output.read_text())
    assert result["greedy"] and len(result["returns"]) == 2 and not (run_dir / "eval.json").exists()
    frames = iio.imread(video, index=None)
    assert len(frames) == result["lengths"][0] + 1 and frames[0].shape[:2] == (400, 600)


def test_a_video_that_cannot_be_written_at_its_end_keeps_the_evaluation(tmp_path, capsys, monkeypatch):
    """A ``.gif`` is written when the video closes; a place that refuses it then lost eval.json too (issue 41)."""
    from ppo_eqx.host.evaluate import VideoWriter

    run_dir = untrained_run(tmp_path / "run", PPOConfig(env_id="CartPole-v1", num_envs=4))
    video = tmp_path / "game.gif"

    def refused(self):
        raise PermissionError(13, "Permission denied", str(self.path))

    monkeypatch.setattr(VideoWriter, "close", refused)
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2", "--video", str(video)]) == 1
    result = json.loads((run_dir / "eval.json").read_text())
    assert len(result["returns"]) == 2 and result["video"] is None
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and str(video) in line and "eval.json" in line and "Permission denied" in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--episodes", "0"], "argument --episodes: 0 is out of range; allowed: 1 .. 1000000"),
        (["--video", "game.avi"], "--video game.avi: the name must end in .mp4 or .gif"),
    ],
)
def test_bad_eval_input_is_one_line(tmp_path, capsys, argv, message):
    run_dir = untrained_run(tmp_path / "run", PPOConfig(env_id="CartPole-v1", num_envs=4))
    capsys.readouterr()
    assert main(["eval", str(run_dir), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ppo-eqx: error: {message}"]
    assert not (run_dir / "eval.json").exists()
    assert main(["eval", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"ppo-eqx: error: {tmp_path} is neither a run directory nor a checkpoint"
