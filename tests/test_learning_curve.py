"""bench/learning_curve.py on a hand-made `--num-seeds 2` run directory: the curves, the final returns, null for
NaN, the written PNG and JSON, and what it does with a finished, an unfinished and a missing run."""

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from ppo_eqx.config import PPOConfig
from ppo_eqx_bench.anchors import load_anchors
from ppo_eqx_bench.plots import learning_curve_figure
from ppo_eqx_bench.stats import moving_average

from .bench_scripts import load_bench_script

pytestmark = pytest.mark.unit

BATCH = 512  # num_envs 4 x num_steps 128, as the config below says
HARDWARE = {
    "cpu_model": "AMD EPYC",
    "cpu_count": 2,
    "gpu_name": None,
    "jax_version": "0.10.2",
    "jaxlib_version": "0.10.2",
    "envpool_version": "1.2.5",
    "python_version": "3.11.7",
    "platform": "Linux",
}


@pytest.fixture(scope="module")
def lc() -> ModuleType:
    return load_bench_script("learning_curve")


def seeds_config(env_id: str, iterations: int, num_seeds: int = 2, seed: int = 1) -> dict[str, Any]:
    """seeds.json as `ppo-eqx train --env-id ENV_ID --num-seeds 2` writes it: the task's own preset (a MinAtar game's
    on gymnax). The metrics written beside it count BATCH steps an iteration whatever its envs."""
    backend = "gymnax" if env_id.endswith("-MinAtar") else "envpool"
    if backend == "gymnax":
        pytest.importorskip("gymnax")  # the task's preset is read from its backend (not in the newest set)
    values = {"total_timesteps": iterations * BATCH, "seed": seed, "num_seeds": num_seeds}
    return PPOConfig.for_task(env_id, backend, **values).to_dict()


def write_agent(agent_dir: Path, config: dict[str, Any], returns: list[float | None], *, finished: bool) -> None:
    """One agent's run directory: config.json, hardware.json, metrics.jsonl (null where no episode finished)
    and, when finished, summary.json."""
    agent_dir.mkdir(parents=True)
    (agent_dir / "config.json").write_text(json.dumps(config, indent=2))
    (agent_dir / "hardware.json").write_text(json.dumps(HARDWARE, indent=2))
    rows = []
    for iteration, value in enumerate(returns, start=1):
        rows.append(
            {
                "iteration": iteration,
                "global_step": iteration * BATCH,
                "sps": 1000.0,
                "approx_kl": 0.001,
                "clip_fraction": 0.0,
                "entropy": 0.69,
                "episodic_length": None if value is None else 20.0,
                "episodic_return": value,
                "learning_rate": 0.00025,
                "loss": 1.0,
                "policy_loss": 0.0,
                "value_loss": 2.0,
                "time_elapsed": 0.5 * iteration,
            }
        )
    (agent_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if finished:
        summary = {"global_step": len(returns) * BATCH, "time_elapsed": 0.5 * len(returns) + 0.25}
        summary["episodic_return"] = next((v for v in reversed(returns) if v is not None), None)
        (agent_dir / "summary.json").write_text(json.dumps(summary, indent=2))


# 20 iterations each: the final return is the mean over the last 2 (10%) that finished an episode.
SEED1 = [None, None, 1.0, 2.0, None, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 10.0, 14.0]
SEED2 = [None, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.0, 7.0, 7.0, 8.0, 8.0, 9.0, 9.0, 9.0, 8.0, None]


def make_run(root: Path, env_id: str = "CartPole-v1", *, finished: bool = True) -> Path:
    """A `--num-seeds 2` run directory: seeds.json, checkpoints/, seed1/ and seed2/."""
    run_dir = root / "run"
    run_dir.mkdir()
    config = seeds_config(env_id, len(SEED1))
    (run_dir / "seeds.json").write_text(json.dumps(config, indent=2))
    (run_dir / "checkpoints").mkdir()
    for seed, returns in ((1, SEED1), (2, SEED2)):
        write_agent(run_dir / f"seed{seed}", {**config, "seed": seed, "num_seeds": 1}, returns, finished=finished)
    return run_dir


def no_nan(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON")

    return json.loads(text, parse_constant=refuse)


def test_moving_average_matches_a_numpy_reference() -> None:
    assert np.array_equal(moving_average([1.0, np.nan, 3.0, 5.0], 2), [1.0, 1.0, 3.0, 4.0])
    assert np.isnan(moving_average([np.nan, np.nan, 2.0], 2)[:2]).all()  # no finite value in the window yet
    values = np.random.default_rng(0).normal(5.0, 3.0, 300)
    values[np.random.default_rng(1).random(300) < 0.2] = np.nan
    values[:7] = np.nan
    for window in (1, 3, 20):
        reference = []
        for i in range(values.size):
            recent = values[max(0, i - window + 1) : i + 1]
            recent = recent[np.isfinite(recent)]
            reference.append(recent.mean() if recent.size else np.nan)
        np.testing.assert_allclose(moving_average(values, window), reference, rtol=1e-12, equal_nan=True)
    with pytest.raises(ValueError, match="window"):
        moving_average(values, 0)


def test_curves_final_returns_and_null_for_nan(lc: ModuleType, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    runs = lc.read_runs(run_dir)
    assert [run.seed for run in runs] == [1, 2]
    data = lc.curve_data(
        runs, lc.saved_config(run_dir), run_dir, random_score=None, cleanrl_10m=None, out=tmp_path / "lc"
    )
    seed1, seed2 = data["seeds"]
    assert seed1["global_step"] == [BATCH * i for i in range(1, 21)]
    assert seed1["episodic_return"] == SEED1 and seed2["episodic_return"] == SEED2  # null where NaN
    assert seed1["final_return"] == pytest.approx((10.0 + 14.0) / 2)  # the last 2 of 20 iterations
    assert seed2["final_return"] == pytest.approx(8.0)  # the last 2 are [8, null]: the finite one
    assert (data["finished"], data["steps_done"], data["wall_seconds"]) == (True, 20 * BATCH, 10.25)
    assert data["hardware_text"] == "2-core CPU"
    assert "--num-seeds 2" in data["command"] and "--env-id CartPole-v1" in data["train_command"]
    assert no_nan(lc.json_text(data)) == data


def test_plot_only_writes_png_and_json(lc: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = make_run(tmp_path, "Breakout-v5")
    out = tmp_path / "results" / "lc"
    assert lc.main(["--plot-only", "--run-dir", str(run_dir), "--out", str(out)]) == 0
    assert (tmp_path / "results" / "lc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = no_nan((tmp_path / "results" / "lc.json").read_text())
    anchors, human_random = load_anchors()
    assert data["random_score"] == human_random["Breakout-v5"].random_score
    assert data["cleanrl_10m_return"]["mean"] == anchors["Breakout-v5"].cleanrl_return_mean
    assert data["cleanrl_10m_return"]["label"] == "CleanRL at 10M steps (GPU)"
    assert [seed["final_return"] for seed in data["seeds"]] == [12.0, 8.0]
    assert data["hardware"] == HARDWARE
    assert "lc.png" in capsys.readouterr().out


def test_a_game_without_a_random_score_gets_null_and_no_line(lc: ModuleType, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "CartPole-v1", finished=False)
    out = tmp_path / "lc"
    assert lc.main(["--plot-only", "--run-dir", str(run_dir), "--out", str(out)]) == 0
    data = no_nan((tmp_path / "lc.json").read_text())
    assert (data["random_score"], data["cleanrl_10m_return"], data["finished"]) == (None, None, False)
    figure = learning_curve_figure(data)
    assert not any("random" in str(line.get_label()) for line in figure.axes[0].get_lines())
    assert "under way" in figure.axes[0].get_title()


def test_a_minatar_game_gets_its_published_10m_step_return_drawn(lc: ModuleType, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "Breakout-MinAtar")
    assert lc.main(["--plot-only", "--run-dir", str(run_dir), "--out", str(tmp_path / "lc")]) == 0
    data = no_nan((tmp_path / "lc.json").read_text())
    assert data["published_return"]["mean"] == 28.0 and data["published_return"]["steps"] == 10_000_000
    figure = learning_curve_figure(data)
    assert any("gymnax-blines' PPO at 10M steps (28)" in str(line.get_label()) for line in figure.axes[0].get_lines())
    assert "gymnax-blines' hyperparameters" in figure.axes[0].get_title()


def test_plot_only_refuses_an_empty_run_dir_in_one_line(
    lc: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    for run_dir in (tmp_path / "empty", tmp_path / "missing"):
        assert lc.main(["--plot-only", "--run-dir", str(run_dir), "--out", str(tmp_path / "lc")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no run" in err
    assert not list(tmp_path.glob("lc*"))


def test_run_state(lc: ModuleType, tmp_path: Path) -> None:
    assert lc.run_state(tmp_path / "missing") == lc.NO_RUN
    run_dir = make_run(tmp_path)
    assert lc.run_state(run_dir) == lc.FINISHED
    (run_dir / "seed2" / "summary.json").unlink()
    assert lc.run_state(run_dir) == lc.UNFINISHED


class FakeTrain:
    """Stands in for the training process: records its arguments and finishes the run (writes summaries)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.calls: list[list[str]] = []

    def __call__(self, arguments: list[str]) -> None:
        self.calls.append(arguments)
        if not (self.run_dir / "seed1").exists():
            config = seeds_config("Breakout-v5", len(SEED1))
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "seeds.json").write_text(json.dumps(config))
            for seed, returns in ((1, SEED1), (2, SEED2)):
                write_agent(
                    self.run_dir / f"seed{seed}", {**config, "seed": seed, "num_seeds": 1}, returns, finished=True
                )
        for seed in (1, 2):
            summary = self.run_dir / f"seed{seed}" / "summary.json"
            if not summary.exists():
                summary.write_text(json.dumps({"global_step": 20 * BATCH, "time_elapsed": 10.0}))


def test_training_starts_continues_or_is_skipped(
    lc: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "new"
    flags = ["--run-dir", str(run_dir), "--out", str(tmp_path / "lc"), "--total-timesteps", str(20 * BATCH)]
    fake = FakeTrain(run_dir)
    monkeypatch.setattr(lc, "train", fake)
    assert lc.main(flags) == 0  # nothing there: a new run
    assert fake.calls == [lc.train_args("Breakout-v5", 20 * BATCH, 2, 1, run_dir)]
    assert "--no-progress" in fake.calls[0]
    assert lc.main(flags) == 0  # finished: plotted, not trained
    assert len(fake.calls) == 1
    (run_dir / "seed1" / "summary.json").unlink()
    assert lc.main(flags) == 0  # unfinished: continued
    assert fake.calls[-1] == ["train", "--resume", str(run_dir), "--no-progress"]
    (run_dir / "seed1" / "summary.json").unlink()
    assert lc.main([*flags, "--env-id", "Pong-v5"]) == 1  # another run's flags: refused, nothing trained
    assert len(fake.calls) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("learning_curve.py: ")


def test_network_init_is_passed_on_recorded_and_a_run_saved_before_it_counts_as_cleanrls(
    lc: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "blines"
    fake = FakeTrain(run_dir)
    monkeypatch.setattr(lc, "train", fake)
    flags = ["--run-dir", str(run_dir), "--out", str(tmp_path / "lc"), "--total-timesteps", str(20 * BATCH)]
    assert lc.main([*flags, "--network-init", "gymnax-blines"]) == 0
    assert fake.calls[0][:3] == ["train", "--network-init", "gymnax-blines"]
    assert "--network-init" not in lc.train_args("Breakout-v5", BATCH, 2, 1, run_dir)  # the default goes unsaid
    # The plot records the run's initialisation, read from its config, in both commands.
    for name in ("seeds.json", "seed1/config.json", "seed2/config.json"):
        config = json.loads((run_dir / name).read_text())
        (run_dir / name).write_text(json.dumps({**config, "network_init": "gymnax-blines"}))
    assert lc.main(["--plot-only", *flags]) == 0
    data = json.loads((tmp_path / "lc.json").read_text())
    assert "--network-init gymnax-blines" in data["command"] and "--network-init gymnax-blines" in data["train_command"]
    assert data["hyperparameters_text"] == "CleanRL's hyperparameters, gymnax-blines' initialisation"
    assert lc.main(flags) == 1  # the flags ask for another run: refused
    # A config saved before network_init existed: CleanRL's start, the default; no flag in its commands.
    old = make_run(tmp_path)
    for name in ("seeds.json", "seed1/config.json", "seed2/config.json"):
        config = json.loads((old / name).read_text())
        del config["network_init"]
        (old / name).write_text(json.dumps(config))
    assert lc.saved_setting(json.loads((old / "seeds.json").read_text()), "network_init") == "cleanrl"
    assert lc.main(["--plot-only", "--run-dir", str(old), "--out", str(tmp_path / "old")]) == 0
    assert "--network-init" not in (tmp_path / "old.json").read_text()
    assert json.loads((tmp_path / "old.json").read_text())["hyperparameters_text"] == "CleanRL's hyperparameters"


@pytest.mark.subprocess
def test_a_failed_training_exits_non_zero_in_one_line(
    lc: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real child process, `python -m ppo_eqx train`, refusing a run directory that does not exist.
    with pytest.raises(lc.LearningCurveError, match=r"^training failed \(exit [1-9]"):
        lc.train(["train", "--resume", str(tmp_path / "missing"), "--no-progress"])
    monkeypatch.setattr(lc, "train_args", lambda *args: ["train", "--resume", str(tmp_path / "missing")])
    capsys.readouterr()
    assert lc.main(["--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "lc")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("learning_curve.py: training failed (exit ")
    assert not list(tmp_path.glob("lc*"))


def test_many_seeds_get_colours_of_their_own_and_a_legend_beside_the_curves(lc: ModuleType, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "Breakout-MinAtar")
    assert lc.main(["--plot-only", "--run-dir", str(run_dir), "--out", str(tmp_path / "lc")]) == 0
    data = no_nan((tmp_path / "lc.json").read_text())
    data["seeds"] = [{**data["seeds"][i % 2], "seed": 5 + i} for i in range(16)]
    figure = learning_curve_figure(data)
    ax = figure.axes[0]
    seed_lines = [line for line in ax.get_lines() if str(line.get_label()).startswith("seed ")]
    assert [line.get_label() for line in seed_lines] == [f"seed {5 + i}" for i in range(16)]
    assert len({line.get_color() for line in seed_lines}) == 16
    assert [text.get_text() for text in figure.legends[0].get_texts()] == [f"seed {5 + i}" for i in range(16)]
    legend = ax.get_legend()
    assert legend is not None
    inside = [text.get_text() for text in legend.get_texts()]
    assert inside and not any(text.startswith("seed ") for text in inside)  # the published line, dots, lines
    figure.savefig(tmp_path / "many.png")
    legend_box = figure.legends[0].get_window_extent()
    assert legend_box.x0 >= ax.get_window_extent().x1 - 1  # no overlap with the curves


def test_a_few_seeds_keep_the_legend_in_the_axes(lc: ModuleType, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "Breakout-MinAtar")
    assert lc.main(["--plot-only", "--run-dir", str(run_dir), "--out", str(tmp_path / "lc")]) == 0
    figure = learning_curve_figure(no_nan((tmp_path / "lc.json").read_text()))
    assert figure.axes[0].get_legend() is not None and not figure.legends


class FakeEval:
    """Stands in for `ppo-eqx eval AGENT_DIR --episodes N`: writes the agent's eval.json with made-up returns."""

    RETURNS = {"seed1": [10.0, 20.0, 30.0, 40.0], "seed2": [5.0, 7.0, 9.0, 11.0]}

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, arguments: list[str]) -> int:
        self.calls.append(arguments)
        agent_dir, episodes = Path(arguments[1]), int(arguments[arguments.index("--episodes") + 1])
        returns = self.RETURNS[agent_dir.name][:episodes]
        record = {"episodes": episodes, "greedy": False, "seed": 1, "global_step": 20 * BATCH, "returns": returns}
        (agent_dir / "eval.json").write_text(json.dumps({**record, "mean_return": float(np.mean(returns))}))
        return 0


def test_eval_episodes_play_each_seeds_final_policy_once(
    lc: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = make_run(tmp_path, "Breakout-MinAtar")
    fake = FakeEval()
    monkeypatch.setattr(lc.launch, "run_to_end", fake)
    out = ["--plot-only", "--run-dir", str(run_dir), "--out", str(tmp_path / "lc"), "--eval-episodes", "4"]
    assert lc.main(out) == 0
    assert fake.calls == [["eval", str(run_dir / f"seed{seed}"), "--episodes", "4"] for seed in (1, 2)]
    data = no_nan((tmp_path / "lc.json").read_text())
    assert [seed["eval"]["mean_return"] for seed in data["seeds"]] == [25.0, 8.0]  # np.mean of the returns above
    assert [seed["eval"]["episodes"] for seed in data["seeds"]] == [4, 4]
    assert data["eval_mean_return"] == pytest.approx((25.0 + 8.0) / 2)
    assert "played afresh" in learning_curve_figure(data).get_supxlabel()
    assert lc.main(out) == 0  # the same episodes again: each eval.json is read, nothing played
    assert len(fake.calls) == 2
    assert lc.main([*out[:-1], "2"]) == 0  # other episodes: played again
    assert len(fake.calls) == 4 and no_nan((tmp_path / "lc.json").read_text())["eval_mean_return"] == 10.5


def test_eval_episodes_refuse_an_unfinished_run_in_one_line(
    lc: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path, "Breakout-MinAtar", finished=False)
    monkeypatch.setattr(lc.launch, "run_to_end", FakeEval())
    out = ["--plot-only", "--run-dir", str(run_dir), "--out", str(tmp_path / "lc"), "--eval-episodes", "4"]
    assert lc.main(out) == 1
    assert capsys.readouterr().err.strip() == (
        f"learning_curve.py: --eval-episodes 4 plays finished runs' final policies; {run_dir} is not finished"
    )
    assert not list(tmp_path.glob("lc*"))


def test_a_run_trained_with_other_settings_is_plotted_with_them(lc: ModuleType, tmp_path: Path) -> None:
    """A run trained elsewhere (`--plot-only`) with settings this script has no flags for: the JSON and caption
    name them, the training command carries them, and the script's command is the plot's, not a retraining."""
    run_dir = make_run(tmp_path, "Breakout-v5")
    shape = {"num_envs": 64, "num_steps": 32, "num_minibatches": 8}
    for name in ("seeds.json", "seed1/config.json", "seed2/config.json"):
        config = json.loads((run_dir / name).read_text())
        (run_dir / name).write_text(json.dumps({**config, **shape}))
    assert lc.main(["--plot-only", "--run-dir", str(run_dir), "--out", str(tmp_path / "lc")]) == 0
    data = json.loads((tmp_path / "lc.json").read_text())
    assert data["settings_apart"] == shape
    assert data["hyperparameters_text"] == "CleanRL's hyperparameters, num_envs=64, num_steps=32, num_minibatches=8"
    assert "--num-envs 64 --num-steps 32 --num-minibatches 8" in data["train_command"]
    assert data["command"].startswith("python bench/learning_curve.py --plot-only --run-dir")
    # A preset's run: the preset named, and what it sets not repeated; a false boolean as --no-NAME.
    tpu = seeds_config("Breakout-v5", len(SEED1)) | {"preset": "tpu", "num_envs": 64, "num_steps": 32,
                                                     "num_minibatches": 8, "rollout_on": "host-envs"}  # fmt: skip
    assert lc.settings_apart(tpu) == {"preset": "tpu"}
    assert lc.settings_apart(tpu | {"anneal_lr": False}) == {"preset": "tpu", "anneal_lr": False}
    assert lc.flags_of({"preset": "tpu", "anneal_lr": False}) == ["--preset", "tpu", "--no-anneal-lr"]
    assert lc.settings_apart(seeds_config("CartPole-v1", len(SEED1))) == {}
    with pytest.raises(lc.LearningCurveError, match="cannot tell the run's settings .*not an EnvPool task"):
        lc.settings_apart(seeds_config("CartPole-v1", len(SEED1)) | {"env_id": "Breakout-MinAtar"})
