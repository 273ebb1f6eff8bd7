"""The benchmark's figures: the report's, as PNG and SVG (learning curves, runtime bars, aggregate human-normalised
scores and, for a sweep, the final return against each swept field), and ``bench/learning_curve.py``'s one.

Imports matplotlib (the ``[bench]`` extra) at its top: ``report.write_report`` imports this module only when
asked for plots, so that the numbers need no plotting library.
"""

import math
import os
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .render import AGGREGATE_NAMES, setting_label, setting_value_text
from .runs import value_key
from .stats import AGGREGATES, FINAL_FRACTION, NAN, moving_average, steps_text
from .tables import GameRow, GameSettings, Report, SettingRow

CAPTION_WIDTH = 120
"""Characters per line of the caption under a learning curve (small font, 8 inches wide)."""
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
LOG_SPAN = 10.0
"""A swept field's axis is logarithmic when all its values are > 0 and the largest is more than this times the
smallest (learning rates)."""


def _save(figure: Figure, out_dir: Path, name: str) -> list[Path]:
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    figure.savefig(paths[0], dpi=80)
    figure.savefig(paths[1], metadata={"Date": None})  # no timestamp: same runs, same file
    return paths


def _learning_curves(report: Report, rows: list[GameRow], x_axis: str) -> Figure:
    """One panel per game, one curve per seed; x_axis "steps" or "time". Only finite returns are drawn."""
    columns = min(6, len(rows))
    grid_rows = math.ceil(len(rows) / columns)
    figure = Figure(figsize=(4.0 * columns, 3.0 * grid_rows), layout="constrained")
    axes = figure.subplots(grid_rows, columns, squeeze=False).ravel()
    runs_by_dir = {run.run_dir: run for run in report.runs}
    settings_by_dir = {
        run_dir: setting_label(setting.values)
        for game in report.settings
        for setting in game.settings
        for run_dir in setting.run_dirs
    }
    for ax, row in zip(axes, rows, strict=False):
        for seed, run_dir in zip(row.seeds, row.run_dirs, strict=True):
            run = runs_by_dir[run_dir]
            finite = np.isfinite(run.episodic_return)
            x = run.global_step / 1e6 if x_axis == "steps" else run.time_elapsed / 60.0
            marker = "." if finite.sum() < 3 else None
            label = f"{settings_by_dir[run_dir]}, seed {seed}" if run_dir in settings_by_dir else f"seed {seed}"
            ax.plot(x[finite], run.episodic_return[finite], marker=marker, label=label)
        if row.anchor and math.isfinite(row.anchor.cleanrl_return_mean):
            ax.axhline(row.anchor.cleanrl_return_mean, color="gray", linestyle="--", label="CleanRL, 10M")
        ax.set_title(row.env_id)
        ax.set_xlabel("environment steps (millions)" if x_axis == "steps" else "wall-clock minutes")
        ax.set_ylabel("episodic return")
        ax.legend(fontsize="x-small")
    for ax in axes[len(rows) :]:
        ax.set_visible(False)
    return figure


def _runtime_bars(report: Report, rows: list[GameRow]) -> Figure:
    """Minutes at the target per game; beside CleanRL's and PPO2's when the report has them."""
    figure = Figure(figsize=(8.0, 1.0 + 0.45 * len(rows)), layout="constrained")
    ax = figure.subplots()
    series = [("ppo_eqx (hatched: projected)", [row.minutes_at_target for row in rows], "tab:blue")]
    if report.has_anchors:
        series += [
            ("CleanRL xla_jax", [row.anchor.cleanrl_minutes if row.anchor else NAN for row in rows], "tab:orange"),
            ("baselines PPO2", [row.anchor.baselines_ppo2_minutes if row.anchor else NAN for row in rows], "tab:green"),
        ]
    bar_height = 0.8 / len(series)
    for offset, (label, values, color) in enumerate(series):
        labelled = False
        for position, (row, value) in enumerate(zip(rows, values, strict=True)):
            if not math.isfinite(value):
                continue  # unknown stays blank, never a zero-length bar
            ax.barh(
                position + (offset - (len(series) - 1) / 2) * bar_height,
                value,
                height=bar_height,
                color=color,
                hatch="//" if offset == 0 and row.projected else None,
                label=None if labelled else label,
            )
            labelled = True
    ax.set_yticks(range(len(rows)), [row.env_id for row in rows])
    ax.invert_yaxis()
    ax.set_xlabel(f"minutes for {report.target_steps / 1e6:g}M steps")
    ax.set_title("Runtime per game")
    if ax.get_legend_handles_labels()[0]:  # an empty legend warns
        figure.legend(loc="outside upper center", ncols=len(series), fontsize="small")
    return figure


def _aggregate_hns(report: Report) -> Figure:
    """Point and interval of each aggregate, beside the reference's point values over the same games."""
    aggregates = report.aggregates
    figure = Figure(figsize=(10.0, 2.6), layout="constrained")
    axes = figure.subplots(1, len(AGGREGATES), sharey=True)
    labels = ["ppo_eqx", "CleanRL (same games)", "PPO2 (same games)"] if report.has_anchors else ["ppo_eqx"]
    for ax, name in zip(axes, AGGREGATES, strict=True):
        low, high = aggregates.interval[name]
        # A percentile interval need not contain the point estimate, so no errorbar (it refuses that).
        if math.isfinite(low):
            ax.plot([low, high], [0, 0], color="tab:blue", linewidth=2, solid_capstyle="butt")
        ax.plot([aggregates.point[name]], [0], "o", color="tab:blue")
        for position, which, color in ((1, "cleanrl", "tab:orange"), (2, "baselines", "tab:green")):
            value = aggregates.anchors[(which, "same")][name]
            if report.has_anchors and math.isfinite(value):
                ax.plot([value], [position], "D", color=color)
        ax.set_title(AGGREGATE_NAMES[name])
        ax.set_xlabel("human-normalised score")
    axes[0].set_yticks(range(len(labels)), labels)
    axes[0].invert_yaxis()
    figure.suptitle(f"Aggregate HNS over {len(aggregates.games)} game(s), {report.confidence:.0%} intervals")
    return figure


def _sweep_axis(values: Sequence[Any]) -> tuple[list[float], list[str] | None, bool]:
    """x positions of a swept field's values, the category labels of positions 0, 1, ... (None for a number
    axis), and whether the axis is logarithmic. Bools are the categories false, true; numbers are themselves;
    anything else is a category, in sorted order."""
    if all(isinstance(value, bool) for value in values):
        return [float(value) for value in values], ["false", "true"], False
    if all(isinstance(value, int | float) and not isinstance(value, bool) for value in values):
        positions = [float(value) for value in values]
        log = min(positions) > 0 and max(positions) > LOG_SPAN * min(positions)
        return positions, None, log
    texts = sorted({setting_value_text(value) for value in values})
    return [float(texts.index(setting_value_text(value))) for value in values], texts, False


def _sweep_panel(ax: Axes, game: GameSettings, field: str) -> None:
    """One line per combination of the other fields' values: the mean final return over seeds, its interval
    over seeds as a vertical bar, and each seed's final return as a dot."""
    others = [name for name in game.fields if name != field]
    positions, categories, log = _sweep_axis([setting.values[field] for setting in game.settings])
    lines: dict[str, list[tuple[float, SettingRow]]] = {}
    for x, setting in zip(positions, game.settings, strict=True):
        lines.setdefault(value_key([setting.values[name] for name in others]), []).append((x, setting))
    for number, points in enumerate(lines.values()):
        points.sort(key=lambda point: point[0])
        color = f"C{number % 10}"
        label = setting_label({name: points[0][1].values[name] for name in others}) or None
        means = [(x, setting.return_mean) for x, setting in points if math.isfinite(setting.return_mean)]
        if means:
            ax.plot(*zip(*means, strict=True), marker="o", color=color, label=label)
        for x, setting in points:
            low, high = setting.return_interval
            # A percentile interval need not contain the mean, so no errorbar (it refuses that).
            if math.isfinite(low):
                ax.plot([x, x], [low, high], color=color, linewidth=2, alpha=0.6)
            seeds = [value for value in setting.final_returns if math.isfinite(value)]
            ax.plot([x] * len(seeds), seeds, ".", color=color, alpha=0.5)
    if log:
        ax.set_xscale("log")
    if categories is not None:
        ax.set_xticks(range(len(categories)), categories)
        ax.set_xlim(-0.5, len(categories) - 0.5)
    else:  # a tick at each swept value, labelled as the flags write it
        values = sorted(
            {
                (x, setting_value_text(setting.values[field]))
                for x, setting in zip(positions, game.settings, strict=True)
            }
        )
        ax.set_xticks([x for x, _ in values], [text for _, text in values], rotation=30 if len(values) > 4 else 0)
        ax.minorticks_off()
    ax.set_title(game.env_id)
    ax.set_xlabel(field)
    ax.set_ylabel("final return")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="x-small")


def _sweep_figure(games: Sequence[GameSettings], field: str) -> Figure:
    """One panel per game that swept ``field``."""
    columns = min(4, len(games))
    grid_rows = math.ceil(len(games) / columns)
    figure = Figure(figsize=(max(6.0, 4.5 * columns), 1.0 + 3.2 * grid_rows), layout="constrained")
    axes = figure.subplots(grid_rows, columns, squeeze=False).ravel()
    for ax, game in zip(axes, games, strict=False):
        _sweep_panel(ax, game, field)
    for ax in axes[len(games) :]:
        ax.set_visible(False)
    figure.suptitle(f"Final return against {field}\nline: mean over seeds; bar: interval over seeds; dots: seeds")
    return figure


def sweep_plot_name(field: str) -> str:
    """The file name (without suffix) of the plot of a swept field: ``sweep_<field>``."""
    return "sweep_" + re.sub(r"[^A-Za-z0-9_.-]", "_", field)


def write_plots(report: Report, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Learning curves (vs steps and vs minutes), runtime bars, when any game has an HNS the aggregate HNS,
    and one plot per swept field (``sweep_plot_name``), each as PNG and SVG. Returns the written paths; none
    when there is no run."""
    out_dir = Path(out_dir)
    rows = [row for row in report.rows if not row.missing]
    if not rows:
        return []
    written: list[Path] = []
    for x_axis in ("steps", "time"):
        written += _save(_learning_curves(report, rows, x_axis), out_dir, f"learning_curves_{x_axis}")
    written += _save(_runtime_bars(report, rows), out_dir, "runtime")
    if report.aggregates.games:
        written += _save(_aggregate_hns(report), out_dir, "aggregate_hns")
    fields = dict.fromkeys(field for game in report.settings for field in game.fields)
    for field in fields:
        games = [game for game in report.settings if field in game.fields]
        written += _save(_sweep_figure(games, field), out_dir, sweep_plot_name(field))
    return written


def _duration_text(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def _caption(data: dict[str, Any]) -> str:
    finals = ", ".join(
        f"seed {seed['seed']} {seed['final_return']:.1f}"
        if seed["final_return"] is not None
        else f"seed {seed['seed']} -"
        for seed in data["seeds"]
    )
    lines = [
        f"Final return (mean of the last {FINAL_FRACTION:.0%} of iterations): {finals}. "
        f"Wall time{'' if data['finished'] else ' so far'}: {_duration_text(data['wall_seconds'])} (seeds together)."
    ]
    if data.get("eval_mean_return") is not None:
        played = ", ".join(f"seed {seed['seed']} {seed['eval']['mean_return']:.1f}" for seed in data["seeds"])
        episodes = data["seeds"][0]["eval"]["episodes"]
        lines.append(
            f"Final policy played afresh ({episodes} episodes a seed, sampled actions, ppo-eqx eval): {played}; "
            f"mean {data['eval_mean_return']:.1f}."
        )
    cleanrl = data["cleanrl_10m_return"]
    if cleanrl is not None:
        spread = f" ± {cleanrl['std']:.0f}" if cleanrl["std"] is not None else ""
        lines.append(
            f"CleanRL at 10M steps (GPU): {cleanrl['mean']:.0f}{spread} ({cleanrl['seeds']} seeds), not drawn:"
        )
        lines.append(
            f"CleanRL's published returns are at {steps_text(cleanrl['steps'])} steps and need a GPU to compare."
        )
    published = data.get("published_return")
    if published is not None:
        lines.append(f"Dotted: {published['label']}, {published['mean']:g} ({published['source']}).")
    if data["random_score"] is None:
        lines.append(f"No random-play score for {data['env_id']} in the shipped table.")
    return "\n".join(textwrap.fill(line, CAPTION_WIDTH) for line in lines)


def learning_curve_figure(data: dict[str, Any]) -> Figure:
    """The figure of ``bench/learning_curve.py``'s data (its ``curve_data``): each seed's per-iteration returns
    faint, their moving average solid, random play's score dashed."""
    many = len(data["seeds"]) > len(COLORS)
    figure = Figure(figsize=(9.0 if many else 8.0, 5.2), layout="constrained")
    ax = figure.subplots()
    window = data["moving_average_iterations"]
    # More seeds than COLORS: a colour of its own for each from a sequential map, and the legend beside the axes.
    colors = [colormaps["viridis"](x) for x in np.linspace(0.0, 0.9, len(data["seeds"]))] if many else COLORS
    for index, seed in enumerate(data["seeds"]):
        color = colors[index]
        steps = np.asarray(seed["global_step"], dtype=np.float64) / 1e6
        returns = np.array([np.nan if v is None else v for v in seed["episodic_return"]], dtype=np.float64)
        finite = np.isfinite(returns)
        ax.plot(steps[finite], returns[finite], ".", color=color, markersize=2.5, alpha=0.3, label=None)
        average = moving_average(returns, window)
        ax.plot(steps, average, color=color, linewidth=1.8, label=f"seed {seed['seed']}")
    if data["random_score"] is not None:
        ax.axhline(
            data["random_score"],
            color="gray",
            linestyle="--",
            linewidth=1.2,
            label=f"random play ({data['random_score']:g})",
        )
    published = data.get("published_return")
    if published is not None:
        ax.axhline(
            published["mean"],
            color="black",
            linestyle=":",
            linewidth=1.4,
            label=f"{published['label']} ({published['mean']:g})",
        )
    # One legend entry for what the dots and lines are, drawn in neutral gray.
    dots = "dots: each iteration's episodic_return (mean over envs of their last game)"
    ax.plot([], [], ".", color="gray", alpha=0.5, label=dots)
    ax.plot([], [], color="gray", linewidth=1.8, label=f"lines: moving average over {window} iterations")
    total = data["total_timesteps"]
    steps_done = data["steps_done"]
    if not total:
        steps = f"{steps_text(steps_done)} env steps per agent"
    elif data["finished"]:  # the run's total_timesteps, as CleanRL states its own (whole iterations: a bit under)
        steps = f"{steps_text(total)} env steps per agent"
    else:
        steps = f"{steps_text(steps_done)} of {steps_text(total)} env steps per agent (under way)"
    seeds = len(data["seeds"])
    hyperparameters = data.get("hyperparameters_text", "CleanRL's hyperparameters")
    ax.set_title(
        f"{data['env_id']}: {steps}, {seeds} seed{'s' if seeds != 1 else ''} in one program\n"
        f"ppo-eqx, {hyperparameters}, {data['hardware_text']}",
        fontsize="medium",
    )
    ax.set_xlabel("environment steps per agent (millions)")
    ax.set_ylabel("episodic return")
    ax.grid(alpha=0.3)
    if many:  # the seeds beside the axes, the rest inside where the curves are low
        handles, labels = ax.get_legend_handles_labels()
        is_seed = [label.startswith("seed ") for label in labels]
        figure.legend(
            [h for h, seed in zip(handles, is_seed, strict=True) if seed],
            [label for label, seed in zip(labels, is_seed, strict=True) if seed],
            loc="outside right upper",
            fontsize="x-small",
        )
        ax.legend(
            [h for h, seed in zip(handles, is_seed, strict=True) if not seed],
            [label for label, seed in zip(labels, is_seed, strict=True) if not seed],
            fontsize="x-small",
            loc="lower right",
        )
    else:
        ax.legend(fontsize="small", loc="best")  # where the curves are not
    figure.supxlabel(_caption(data), fontsize="small")
    return figure
