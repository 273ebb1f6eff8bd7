"""The report of a hyperparameter sweep (``ppo-eqx train --sweep``) on hand-made run directories.

The sweep: Breakout-v5, learning_rate 0.001 and 0.0003 times ent_coef 0.01 and 0.02, laid out as the trainer
writes it (RUN/seeds.json, RUN/learning-rate=0.001,ent-coef=0.01/seed1/, ...). Seeds 1 and 2 of every
setting, and a seed 3 of one, so that the seed counts differ. Each run logs 10 iterations, so its final return
is its last iteration's (the last 10%), which ``FINALS`` gives.
"""

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ppo_eqx_bench import anchors, plots, report, runs, stats

from .test_report import ANCHORS_CSV, HUMAN_RANDOM_CSV, write_run

pytestmark = pytest.mark.unit

NAN = float("nan")
STEPS = [1024 * i for i in range(1, 11)]
FINALS: dict[tuple[float, float], list[float]] = {
    (0.001, 0.01): [30.0, 50.0],
    (0.001, 0.02): [12.0, 20.0, 40.0],
    (0.0003, 0.01): [8.0, 9.0],
    (0.0003, 0.02): [70.0, 110.0],
}
"""(learning_rate, ent_coef): the final return of seeds 1, 2, ..."""


@pytest.fixture
def anchors_dir(tmp_path: Path) -> Path:
    """test_report's synthetic reference tables."""
    directory = tmp_path / "anchors"
    directory.mkdir()
    (directory / anchors.ANCHORS_CSV).write_text(ANCHORS_CSV)
    (directory / anchors.HUMAN_RANDOM_CSV).write_text(HUMAN_RANDOM_CSV)
    return directory


def agent_config(env_id: str, seed: int, **changes: Any) -> dict[str, Any]:
    """An agent's config.json as the trainer writes it (a subset of PPOConfig's fields)."""
    config: dict[str, Any] = {
        "env_id": env_id,
        "total_timesteps": STEPS[-1],
        "learning_rate": 2.5e-4,
        "num_envs": 8,
        "num_steps": 128,
        "ent_coef": 0.01,
        "seed": seed,
        "conv_impl": "auto",
        "num_seeds": 1,
        "sweep": {},
    }
    return {**config, **changes}


def write_agent(run_dir: Path, config: dict[str, Any], final: float) -> Path:
    """A run directory of 10 iterations whose last return is ``final`` (the earlier ones are lower)."""
    returns = [final - 10.0 * (10 - i) for i in range(1, 10)] + [final]
    write_run(
        run_dir, config["env_id"], config["seed"], steps=STEPS, returns=returns, times=[6.0 * i for i in range(1, 11)]
    )
    (run_dir / "config.json").write_text(json.dumps(config))
    return run_dir


def setting_dir_name(**values: Any) -> str:
    """The trainer's name of a setting's folder: ``learning-rate=0.001,ent-coef=0.01``."""
    return ",".join(
        f"{name.replace('_', '-')}={json.dumps(value) if isinstance(value, bool) else repr(value)}"
        for name, value in values.items()
    )


@pytest.fixture
def sweep_run(tmp_path: Path) -> Path:
    """The sweep of the module's docstring. Seed 2 of each setting says conv_impl "matmul", which changes
    speed, not results: it is still a seed of the same setting."""
    root = tmp_path / "RUN"
    root.mkdir()
    grid = {"learning_rate": [0.001, 0.0003], "ent_coef": [0.01, 0.02]}
    sweep_config = agent_config("Breakout-v5", 1, num_seeds=2, sweep=grid)
    (root / "seeds.json").write_text(json.dumps(sweep_config))
    for (learning_rate, ent_coef), finals in FINALS.items():
        folder = root / setting_dir_name(learning_rate=learning_rate, ent_coef=ent_coef)
        for seed, final in enumerate(finals, start=1):
            conv_impl = "matmul" if seed == 2 else "auto"
            config = agent_config(
                "Breakout-v5", seed, learning_rate=learning_rate, ent_coef=ent_coef, conv_impl=conv_impl
            )
            write_agent(folder / f"seed{seed}", config, final)
    return root


def test_seed_interval_of_two_seeds_is_their_range_and_of_one_is_none() -> None:
    # Two seeds a < b: the resampled means are a, (a+b)/2, b with chances 1/4, 1/2, 1/4, so the 2.5th and
    # 97.5th percentiles of 2000 resamples are a and b.
    assert stats.seed_interval([7.0, 3.0]) == (3.0, 7.0)
    assert stats.seed_interval([7.0, NAN, 3.0]) == (3.0, 7.0)  # a seed without a finished episode is left out
    for values in ([5.0], [5.0, NAN], []):
        assert all(math.isnan(bound) for bound in stats.seed_interval(values))
    low, high = stats.seed_interval([1.0, 2.0, 3.0, 10.0], num_resamples=500)
    assert 1.0 <= low < np.mean([1.0, 2.0, 3.0, 10.0]) < high <= 10.0


def test_runs_are_found_in_a_sweeps_setting_folders(sweep_run: Path) -> None:
    expected = sorted(
        sweep_run / setting_dir_name(learning_rate=lr, ent_coef=ent) / f"seed{seed}"
        for (lr, ent), finals in FINALS.items()
        for seed in range(1, len(finals) + 1)
    )
    assert runs.find_run_dirs(sweep_run) == expected
    found, skipped = runs.collect_runs([sweep_run])
    # The settings share their seeds: seed 1 of one setting is no duplicate of seed 1 of another.
    assert skipped == []
    assert sorted(run.run_dir for run in found) == expected
    assert (sweep_run / "learning-rate=0.001,ent-coef=0.01").is_dir()


def test_a_second_copy_of_one_settings_seed_is_a_duplicate(sweep_run: Path, tmp_path: Path) -> None:
    copy = write_agent(
        tmp_path / "copy" / "seed1", agent_config("Breakout-v5", 1, learning_rate=0.001, ent_coef=0.02), 1000.0
    )
    found, skipped = runs.collect_runs([sweep_run, copy])
    assert len(found) == sum(len(finals) for finals in FINALS.values())
    assert [item.path for item in skipped] == [copy]
    assert skipped[0].reason.startswith("duplicate of Breakout-v5 seed 1 in ")
    assert "learning-rate=0.001,ent-coef=0.02" in skipped[0].reason


def test_settings_are_the_swept_values_with_their_seeds(sweep_run: Path, anchors_dir: Path, tmp_path: Path) -> None:
    result = report.write_report([sweep_run], tmp_path / "out", anchors_dir, plots=False, num_resamples=200)
    (game,) = result.settings
    assert game.env_id == "Breakout-v5"
    assert game.fields == ("learning_rate", "ent_coef")  # PPOConfig's order; conv_impl and seed are no field
    # Ordered by learning rate, then entropy coefficient.
    expected_order = [(0.0003, 0.01), (0.0003, 0.02), (0.001, 0.01), (0.001, 0.02)]
    assert [(row.values["learning_rate"], row.values["ent_coef"]) for row in game.settings] == expected_order
    for row, key in zip(game.settings, expected_order, strict=True):
        finals = FINALS[key]
        assert row.seeds == tuple(range(1, len(finals) + 1))
        assert row.final_returns == tuple(finals)
        assert row.return_mean == pytest.approx(np.mean(finals))
        assert row.steps == (STEPS[-1],) * len(finals) and row.steps_mean == STEPS[-1]
        low, high = row.return_interval
        assert min(finals) <= low <= high <= max(finals)
        if len(finals) == 2:  # the interval of two seeds is their range (see above)
            assert (low, high) == (min(finals), max(finals))
    # The game's own row pools every setting.
    assert sorted(result.row("Breakout-v5").final_returns) == sorted(sum(FINALS.values(), []))


def test_a_setting_with_one_seed_or_no_episode_has_no_interval(tmp_path: Path, anchors_dir: Path) -> None:
    root = tmp_path / "RUN"
    write_agent(root / "a" / "seed1", agent_config("Pong-v5", 1, ent_coef=0.0), 5.0)
    write_agent(root / "b" / "seed1", agent_config("Pong-v5", 1, ent_coef=0.1), 7.0)
    silent = write_agent(root / "b" / "seed2", agent_config("Pong-v5", 2, ent_coef=0.1), 0.0)
    lines = [json.loads(line) for line in (silent / "metrics.jsonl").read_text().splitlines()]
    (silent / "metrics.jsonl").write_text("".join(json.dumps({**row, "episodic_return": None}) + "\n" for row in lines))
    result = report.write_report([root], tmp_path / "out", anchors_dir, plots=False, num_resamples=50)
    (game,) = result.settings
    assert game.fields == ("ent_coef",)
    one_seed, one_finished = game.settings
    assert (one_seed.values, one_seed.return_mean) == ({"ent_coef": 0.0}, 5.0)
    assert all(math.isnan(value) for value in one_seed.return_interval)
    assert one_finished.seeds == (1, 2) and one_finished.finished_seeds == 1
    assert one_finished.return_mean == 7.0 and all(math.isnan(value) for value in one_finished.return_interval)
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| 0.0 | 1 | 5.0 | 10,240 |" in markdown
    assert "| 0.1 | 2 | 7.0 (1 of 2 seeds finished an episode) | 10,240 |" in markdown


def test_older_configs_without_sweep_or_newer_fields_are_the_same_setting(tmp_path: Path, anchors_dir: Path) -> None:
    # The old one lacks sweep, num_seeds, conv_impl and env_backend, and wrote ent_coef as the integer 0.
    old = agent_config("Pong-v5", 1, ent_coef=0)
    del old["sweep"], old["num_seeds"], old["conv_impl"]
    new = agent_config("Pong-v5", 2, env_backend="envpool", ent_coef=0.0, minibatch_unroll=4)
    write_agent(tmp_path / "runs" / "old", old, 1.0)
    write_agent(tmp_path / "runs" / "new", new, 2.0)
    result = report.write_report([tmp_path / "runs"], tmp_path / "out", anchors_dir, plots=False)
    assert result.settings == ()
    assert len({run.setting for run in result.runs}) == 1
    assert result.row("Pong-v5").seeds == (1, 2)


def test_markdown_and_json_have_a_settings_section(sweep_run: Path, anchors_dir: Path, tmp_path: Path) -> None:
    result = report.write_report([sweep_run], tmp_path / "out", anchors_dir, plots=False, num_resamples=200)
    markdown = (tmp_path / "out" / "report.md").read_text()
    section = markdown.split("## Settings")[1].split("## Human-normalised scores")[0]
    assert "### Breakout-v5" in section
    assert "| learning_rate | ent_coef | Seeds | Final return (mean [95% CI]) | Steps (mean) |" in section
    # Two seeds: the interval is their range (see above); mean (70 + 110) / 2.
    assert "| 0.0003 | 0.02 | 2 | 90.0 [70.0, 110.0] | 10,240 |" in section
    three = result.settings[0].settings[3]
    low, high = three.return_interval
    assert f"| 0.001 | 0.02 | 3 | {np.mean([12.0, 20.0, 40.0]):.1f} [{low:.1f}, {high:.1f}] | 10,240 |" in section

    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    (game,) = saved["settings"]
    assert game["env_id"] == "Breakout-v5" and game["fields"] == ["learning_rate", "ent_coef"]
    first = game["settings"][0]
    assert first["values"] == {"learning_rate": 0.0003, "ent_coef": 0.01}
    assert first["seeds"] == [1, 2] and first["final_returns"] == FINALS[(0.0003, 0.01)]
    assert first["return_mean"] == pytest.approx(np.mean(FINALS[(0.0003, 0.01)]))
    assert first["return_interval"] == [8.0, 9.0]


def test_one_setting_per_game_gives_no_settings_section(tmp_path: Path, anchors_dir: Path) -> None:
    # A plain --num-seeds run (RUN/seeds.json, RUN/seedK/) and a single run of another game.
    root = tmp_path / "RUN"
    root.mkdir()
    (root / "seeds.json").write_text(json.dumps(agent_config("Pong-v5", 1, num_seeds=2)))
    for seed, final in ((1, 3.0), (2, 5.0)):
        write_agent(root / f"seed{seed}", agent_config("Pong-v5", seed), final)
    write_agent(tmp_path / "single", agent_config("Breakout-v5", 4, ent_coef=0.5), 9.0)
    out = tmp_path / "out"
    result = report.write_report([root, tmp_path / "single"], out, anchors_dir, num_resamples=50)
    assert result.settings == ()
    assert result.row("Pong-v5").final_returns == (3.0, 5.0)
    markdown = (out / "report.md").read_text()
    assert "## Settings" not in markdown and "sweep_" not in markdown
    assert not list(out.glob("sweep_*"))
    assert json.loads((out / "report.json").read_text())["settings"] == []


def test_a_plot_per_swept_field_is_written(sweep_run: Path, anchors_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report.write_report([sweep_run], out, anchors_dir, num_resamples=50)
    for name in ("sweep_learning_rate", "sweep_ent_coef"):
        png, svg = out / f"{name}.png", out / f"{name}.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert "<svg" in svg.read_text()[:1000], name
        assert f"![{name}]({name}.png)" in (out / "report.md").read_text()


def lines_by_label(axes: Any) -> dict[str, tuple[list[float], list[float]]]:
    """The (x, y) data of each labelled line drawn on ``axes``."""
    return {
        str(line.get_label()): (np.asarray(line.get_xdata()).tolist(), np.asarray(line.get_ydata()).tolist())
        for line in axes.get_lines()
    }


def test_sweep_plot_axes_log_for_wide_positive_ranges_and_categories_for_bools(
    tmp_path: Path, anchors_dir: Path
) -> None:
    root = tmp_path / "RUN"
    # Pong: learning rates spanning 100x, each with norm_adv true and false; Breakout: ent_coef 0 to 0.02.
    for number, (learning_rate, norm_adv) in enumerate([(1e-4, True), (1e-4, False), (1e-2, True), (1e-2, False)]):
        config = agent_config("Pong-v5", 1, learning_rate=learning_rate, norm_adv=norm_adv)
        write_agent(root / f"pong{number}" / "seed1", config, float(number))
    for number, ent_coef in enumerate([0.0, 0.01, 0.02]):
        write_agent(root / f"breakout{number}" / "seed1", agent_config("Breakout-v5", 1, ent_coef=ent_coef), 1.0)
    out = tmp_path / "out"
    result = report.write_report([root], out, anchors_dir, num_resamples=50)
    by_game = {game.env_id: game for game in result.settings}
    assert by_game["Pong-v5"].fields == ("learning_rate", "norm_adv")
    assert by_game["Breakout-v5"].fields == ("ent_coef",)

    for name in ("sweep_learning_rate", "sweep_norm_adv", "sweep_ent_coef"):
        assert (out / f"{name}.png").is_file() and (out / f"{name}.svg").is_file(), name

    (axes,) = plots._sweep_figure([by_game["Pong-v5"]], "learning_rate").axes
    assert axes.get_xscale() == "log"  # all > 0, 100x apart
    means = lines_by_label(axes)
    assert means["norm_adv=true"] == ([1e-4, 1e-2], [0.0, 2.0])
    assert means["norm_adv=false"] == ([1e-4, 1e-2], [1.0, 3.0])

    (axes,) = plots._sweep_figure([by_game["Pong-v5"]], "norm_adv").axes
    assert axes.get_xscale() == "linear"
    assert [label.get_text() for label in axes.get_xticklabels()] == ["false", "true"]
    means = lines_by_label(axes)
    assert means["learning_rate=0.0001"] == ([0.0, 1.0], [1.0, 0.0])
    assert means["learning_rate=0.01"] == ([0.0, 1.0], [3.0, 2.0])

    (axes,) = plots._sweep_figure([by_game["Breakout-v5"]], "ent_coef").axes
    assert axes.get_xscale() == "linear"  # 0 is not > 0
    assert axes.get_legend() is None  # no other swept field: one line


def test_sweep_axis_kinds() -> None:
    assert plots._sweep_axis([0.001, 0.0003]) == ([0.001, 0.0003], None, False)  # 3.3x apart: linear
    assert plots._sweep_axis([0.1, 1.0]) == ([0.1, 1.0], None, False)  # exactly 10x: linear
    assert plots._sweep_axis([1e-4, 2.5e-4, 1e-2]) == ([1e-4, 2.5e-4, 1e-2], None, True)
    assert plots._sweep_axis([-1.0, 100.0]) == ([-1.0, 100.0], None, False)
    assert plots._sweep_axis([True, False]) == ([1.0, 0.0], ["false", "true"], False)
    assert plots._sweep_axis(["envpool", "ale", "envpool"]) == ([1.0, 0.0, 1.0], ["ale", "envpool"], False)
