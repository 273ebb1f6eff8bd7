"""The report as Markdown (report.md) and as strict JSON (report.json).

Columns and sections of the reference (CleanRL, PPO2, human-normalised scores) appear only when some game
of the report has one: a report of CartPole runs holds ppo_eqx's own numbers alone. The Settings section
appears only when some game was run with more than one setting (a sweep).
"""

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .runs import NOT_SETTING_FIELDS, Run
from .stats import AGGREGATES, FINAL_FRACTION
from .tables import GameRow, GameSettings, Report, SettingRow

AGGREGATE_NAMES = {"median": "Median", "iqm": "IQM", "mean": "Mean"}
MISSING = "missing"
NOT_AVAILABLE = "n/a"


def _number(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if math.isfinite(value) else NOT_AVAILABLE


def _speedup(value: float) -> str:
    return f"{value:.2f}×" if math.isfinite(value) else NOT_AVAILABLE


def _plus_minus(mean: float, std: float, digits: int = 1) -> str:
    return f"{_number(mean, digits)} ± {_number(std, digits)}" if math.isfinite(mean) else NOT_AVAILABLE


def _steps(value: float) -> str:
    return f"{value:,.0f}" if math.isfinite(value) else NOT_AVAILABLE


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


def _runtime_cells(row: GameRow, with_anchors: bool) -> list[str]:
    anchor = row.anchor
    cleanrl = _number(anchor.cleanrl_minutes) if anchor else NOT_AVAILABLE
    baselines = _number(anchor.baselines_ppo2_minutes) if anchor else NOT_AVAILABLE
    if row.missing:
        ours = [MISSING] * 5
        versus = [cleanrl, MISSING, baselines, MISSING]
    else:
        at_target = _number(row.minutes_at_target)
        if row.projected and math.isfinite(row.minutes_at_target):
            at_target += " (projected)"
        ours = [str(len(row.seeds)), _steps(row.steps_mean), _number(row.measured_minutes), at_target]
        ours.append("; ".join(row.machines) or MISSING)
        versus = [cleanrl, _speedup(row.speedup_cleanrl), baselines, _speedup(row.speedup_baselines)]
    return [row.env_id, *ours, *(versus if with_anchors else [])]


def _runtime_section(report: Report) -> list[str]:
    target = f"{report.target_steps / 1e6:g}M"
    text = (
        f"Wall-clock minutes per run, mean over seeds. *At {target}* is the measured time when a run reached "
        f"{target} steps (within one batch); a value marked **(projected)** comes from a shorter (or longer) "
        f"run: the first iteration's time (compilation included) plus the rate measured after the first "
        f"iteration (so excluding compilation) times the remaining steps, linear in steps."
    )
    text += (
        " *Machine* names where each game's seeds ran and how many runs shared it (`bench/atari57.py --jobs`): a "
        "minute of a shared machine is not one of a dedicated one."
    )
    header = ["Game", "Seeds", "Steps (mean)", "ppo_eqx min (measured)", f"ppo_eqx min at {target}", "Machine"]
    if report.has_anchors:
        text += (
            f" Beside them CleanRL's `ppo_atari_envpool_xla_jax.py` and openai/baselines PPO2 for {target} steps. "
            f"Speed-up = reference minutes / ppo_eqx minutes at {target} (> 1: ppo_eqx is faster). The "
            f"reference minutes were measured on CleanRL's hardware (one GPU and 10 CPU cores per run), so a "
            f"speed-up mixes software and hardware: see Hardware below for ours."
        )
        header += ["CleanRL min", "Speed-up vs CleanRL", "PPO2 min", "Speed-up vs PPO2"]
    cells = [_runtime_cells(row, report.has_anchors) for row in report.rows]
    return ["## Runtime", "", text, ""] + _table(header, cells) + [""]


def _returns_cells(row: GameRow, with_anchors: bool) -> list[str]:
    if row.missing:
        ours = MISSING
    else:
        mean, std, count = row.return_stats
        ours = _plus_minus(mean, std) if count else "no finished episode"
        if 0 < count < len(row.seeds):
            ours += f" ({count} of {len(row.seeds)} seeds finished an episode)"
    seeds = ", ".join(map(str, row.seeds)) if row.seeds else MISSING
    if not with_anchors:
        return [row.env_id, seeds, ours]
    anchor = row.anchor
    cleanrl = _plus_minus(anchor.cleanrl_return_mean, anchor.cleanrl_return_std) if anchor else NOT_AVAILABLE
    baselines = _plus_minus(anchor.baselines_return_mean, anchor.baselines_return_std) if anchor else NOT_AVAILABLE
    return [row.env_id, seeds, ours, cleanrl, baselines]


def _returns_section(report: Report) -> list[str]:
    text = (
        f"ppo_eqx: mean ± std (population, ddof=0) over seeds of each run's final return = the mean "
        f"`episodic_return` over the last {FINAL_FRACTION:.0%} of iterations (rounded up, at least one), "
        f"ignoring iterations in which no episode finished; the last finite value when none in that window did."
    )
    header = ["Game", "Seeds", "ppo_eqx"]
    if report.has_anchors:
        text += (
            " Reference: CleanRL's published mean ± std over 3 seeds at 10M steps (their own definition of the "
            "final return). Compare returns only between runs of the same length."
        )
        header += ["CleanRL", "PPO2"]
    cells = [_returns_cells(row, report.has_anchors) for row in report.rows]
    return ["## Final episodic returns", "", text, ""] + _table(header, cells) + [""]


def setting_value_text(value: Any) -> str:
    """A setting's value as the flags write it: strings as they are, anything else as JSON (true, 0.001)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def setting_label(values: Mapping[str, Any]) -> str:
    """``name=value, ...`` of a setting's values; empty for none."""
    return ", ".join(f"{name}={setting_value_text(value)}" for name, value in values.items())


def _setting_cells(game: GameSettings, setting: SettingRow) -> list[str]:
    low, high = setting.return_interval
    finished = setting.finished_seeds
    ours = _number(setting.return_mean) if finished else "no finished episode"
    if math.isfinite(low):
        ours += f" [{low:,.1f}, {high:,.1f}]"
    if 0 < finished < len(setting.seeds):
        ours += f" ({finished} of {len(setting.seeds)} seeds finished an episode)"
    values = [setting_value_text(setting.values[name]) for name in game.fields]
    return [*values, str(len(setting.seeds)), ours, _steps(setting.steps_mean)]


def _settings_section(report: Report) -> list[str]:
    if not report.settings:
        return []
    ignored = ", ".join(f"`{name}`" for name in NOT_SETTING_FIELDS)
    text = (
        f"Games run with more than one setting (a sweep): runs whose configs are equal but for {ignored} are the "
        "seeds of one setting; a field that an older config lacks takes its default. One row per setting, with "
        "the fields whose values differ between the game's settings. Final return: the mean over the seeds that "
        f"finished an episode of each run's final return (as above), with the {report.confidence:.0%} percentile "
        f"interval of a bootstrap resampling those seeds ({report.num_resamples} resamples, RNG seed "
        f"{report.bootstrap_seed}; none with fewer than two). The tables above pool all settings of a game."
    )
    lines = ["## Settings", "", text, ""]
    for game in report.settings:
        header = [*game.fields, "Seeds", f"Final return (mean [{report.confidence:.0%} CI])", "Steps (mean)"]
        lines += [f"### {game.env_id}", ""]
        lines += _table(header, [_setting_cells(game, setting) for setting in game.settings]) + [""]
    return lines


def _hns_aggregate_table(report: Report) -> list[str]:
    aggregates = report.aggregates
    same, all_count = aggregates.anchor_game_counts.get("same", 0), aggregates.anchor_game_counts.get("all", 0)
    header = ["Aggregate HNS", f"ppo_eqx ({len(aggregates.games)} games, {report.confidence:.0%} CI)"]
    columns = [("cleanrl", "same"), ("baselines", "same"), ("cleanrl", "all"), ("baselines", "all")]
    if report.has_anchors:
        header += [f"CleanRL ({same} same games)", f"PPO2 ({same} same games)"]
        header += [f"CleanRL (all {all_count})", f"PPO2 (all {all_count})"]
    cells = []
    for name in AGGREGATES:
        low, high = aggregates.interval[name]
        ours = _number(aggregates.point[name], 3)
        if math.isfinite(low):
            ours += f" [{low:.3f}, {high:.3f}]"
        anchors = [_number(aggregates.anchors[key][name], 3) for key in columns] if report.has_anchors else []
        cells.append([AGGREGATE_NAMES[name], ours, *anchors])
    return _table(header, cells)


def _hns_cells(row: GameRow, with_anchors: bool) -> list[str]:
    scores = row.human_random
    if row.missing:
        ours = MISSING
    elif scores is None:
        ours = NOT_AVAILABLE + " (no human/random score)"
    elif row.finite_hns.size == 0:
        ours = "no finished episode"
    else:
        ours = _plus_minus(float(row.finite_hns.mean()), float(row.finite_hns.std()), 3)
    random_score = _number(scores.random_score) if scores else NOT_AVAILABLE
    human_score = _number(scores.human_score) if scores else NOT_AVAILABLE
    anchors = [_number(row.anchor_hns("cleanrl"), 3), _number(row.anchor_hns("baselines"), 3)]
    return [row.env_id, random_score, human_score, ours, *(anchors if with_anchors else [])]


def _hns_section(report: Report) -> list[str]:
    if not report.has_hns:
        return []
    text = (
        "HNS = (score - random) / (human - random), with random and human scores from DQN Zoo. Median and mean: "
        "over games, of each game's mean HNS over seeds; IQM: the mean of the middle half of all (seed, game) "
        "scores pooled (rliable's definition; floor(n/4) dropped at each end). "
        f"Interval: {report.confidence:.0%} percentile interval of a stratified bootstrap resampling seeds within "
        f"each game ({report.num_resamples} resamples, RNG seed {report.bootstrap_seed}); a game with one seed "
        "adds no spread."
    )
    if report.has_anchors:
        text += (
            " Reference: point values from their mean returns (their IQM is over per-game means), over the same "
            "games as ppo_eqx and over all the games listed here that have them."
        )
    count = len(report.aggregates.games)
    coverage = (
        f"ppo_eqx aggregates over {count} game(s) with a finished episode, of {len(report.rows)} in the tables "
        "(the others are missing or have no score)."
    )
    lines = ["## Human-normalised scores", "", text, "", coverage, "", *_hns_aggregate_table(report), ""]
    lines += ["Per game (ppo_eqx: mean ± std over seeds):", ""]
    header = ["Game", "Random", "Human", "ppo_eqx HNS"] + (["CleanRL HNS", "PPO2 HNS"] if report.has_anchors else [])
    return lines + _table(header, [_hns_cells(row, report.has_anchors) for row in report.rows]) + [""]


def _hardware_section(runs: Sequence[Run]) -> list[str]:
    lines = ["## Hardware", "", "Distinct `hardware.json` contents of the runs in this report.", ""]
    groups: dict[str, list[Run]] = {}
    for run in runs:
        key = json.dumps(run.hardware, sort_keys=True) if run.hardware is not None else ""
        groups.setdefault(key, []).append(run)
    if not groups:
        return lines + ["No runs.", ""]
    for number, (key, group) in enumerate(sorted(groups.items()), start=1):
        games = sorted({run.env_id for run in group})
        shown = ", ".join(games[:8]) + (f", … ({len(games)} games)" if len(games) > 8 else "")
        lines += [f"### Hardware {number}: {len(group)} run(s) ({shown})", ""]
        if not key:
            lines += ["No `hardware.json` in these runs.", ""]
            continue
        lines += _table(["Field", "Value"], [[name, str(value)] for name, value in json.loads(key).items()]) + [""]
    return lines


def render_markdown(report: Report, plots: Sequence[Path] = ()) -> str:
    """The whole report as Markdown; ``plots`` are paths relative to the report's directory."""
    run_games = sorted({run.env_id for run in report.runs})
    missing = [row.env_id for row in report.rows if row.missing]
    lines = [
        "# ppo_eqx benchmark report",
        "",
        f"{len(report.runs)} run(s) over {len(run_games)} game(s); "
        f"{len(missing)} of {len(report.rows)} game(s) missing; {len(report.skipped)} run director(y/ies) skipped. "
        f'Everything below is computed from the run directories; a game without runs reads "{MISSING}", '
        f'a value that cannot be computed "{NOT_AVAILABLE}".',
        "",
    ]
    lines += _runtime_section(report) + _returns_section(report) + _settings_section(report) + _hns_section(report)
    lines += ["## Plots", ""]
    if plots:
        lines += [f"![{plot.stem}]({plot.as_posix()})" for plot in plots if plot.suffix == ".png"]
        lines += ["", "Each figure is also written as SVG beside its PNG.", ""]
    else:
        lines += ["No plots (no runs, or plots were not requested).", ""]
    lines += _hardware_section(report.runs)
    lines += ["## Skipped run directories", ""]
    if report.skipped:
        lines += _table(["Directory", "Reason"], [[f"`{item.path}`", item.reason] for item in report.skipped])
    else:
        lines.append("None.")
    lines += ["", "## Missing games", "", ", ".join(missing) if missing else "None.", ""]
    return "\n".join(lines)


def _json_safe(value: Any) -> Any:
    """NaN/inf as null, tuples as lists, paths as strings, so that the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _game_json(row: GameRow) -> dict[str, Any]:
    mean, std, _ = row.return_stats
    return {
        "env_id": row.env_id,
        "missing": row.missing,
        "seeds": row.seeds,
        "run_dirs": row.run_dirs,
        "timings": [dataclasses.asdict(timing) for timing in row.timings],
        "steps_mean": row.steps_mean,
        "measured_minutes": row.measured_minutes,
        "minutes_at_target": row.minutes_at_target,
        "projected": row.projected,
        "speedup_cleanrl": row.speedup_cleanrl,
        "speedup_baselines": row.speedup_baselines,
        "final_returns": row.final_returns,
        "return_mean": mean,
        "return_std": std,
        "hns": row.hns,
        "cleanrl_hns": row.anchor_hns("cleanrl"),
        "baselines_hns": row.anchor_hns("baselines"),
        "anchor": dataclasses.asdict(row.anchor) if row.anchor else None,
    }


def _settings_json(game: GameSettings) -> dict[str, Any]:
    settings = [
        {
            "values": dict(setting.values),
            "seeds": setting.seeds,
            "run_dirs": setting.run_dirs,
            "steps": setting.steps,
            "steps_mean": setting.steps_mean,
            "final_returns": setting.final_returns,
            "return_mean": setting.return_mean,
            "return_interval": setting.return_interval,
        }
        for setting in game.settings
    ]
    return {"env_id": game.env_id, "fields": game.fields, "settings": settings}


def report_to_json(report: Report) -> dict[str, Any]:
    """The numbers of the report (NaN as null); per-game values per seed and as shown in the tables; under
    "settings", the games run with more than one setting (empty when none was)."""
    aggregates = report.aggregates
    return _json_safe(
        {
            "target_steps": report.target_steps,
            "games": [_game_json(row) for row in report.rows],
            "aggregates": {
                "games": aggregates.games,
                "point": aggregates.point,
                "interval": aggregates.interval,
                "anchors": {f"{which}_{scope}": values for (which, scope), values in aggregates.anchors.items()},
                "anchor_game_counts": aggregates.anchor_game_counts,
                "num_resamples": report.num_resamples,
                "bootstrap_seed": report.bootstrap_seed,
                "confidence": report.confidence,
            },
            "settings": [_settings_json(game) for game in report.settings],
            "skipped": [{"path": item.path, "reason": item.reason} for item in report.skipped],
        }
    )
