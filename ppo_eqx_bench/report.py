"""The benchmark report: run directories in; report.md, report.json and plots beside the reference out.

    runs.collect_runs -> tables.build_report (with anchors.load_anchors) -> render, plots

The conventions (final return, minutes at 10M steps, HNS aggregates and intervals) are stated in
``stats``'s docstring and repeated in the rendered report.
"""

import json
import os
from collections.abc import Iterable
from pathlib import Path

from .anchors import DATA_DIR, load_anchors
from .render import render_markdown, report_to_json
from .runs import collect_runs
from .stats import BOOTSTRAP_SEED, NUM_RESAMPLES, TARGET_STEPS
from .tables import Report, build_report


def write_report(
    paths: Iterable[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    anchors_dir: str | os.PathLike[str] = DATA_DIR,
    *,
    include_unfinished: bool = False,
    plots: bool = True,
    target_steps: int = TARGET_STEPS,
    num_resamples: int = NUM_RESAMPLES,
    bootstrap_seed: int = BOOTSTRAP_SEED,
) -> Report:
    """Read the runs under ``paths``; write report.md, report.json and the plots into ``out_dir``.

    ``anchors_dir``: where the reference CSVs are (default: the tables shipped in ``ppo_eqx_bench/data``);
    AnchorError when they cannot be read. Plots need matplotlib (the ``[bench]`` extra).
    """
    anchors, human_random = load_anchors(anchors_dir)
    runs, skipped = collect_runs(paths, include_unfinished=include_unfinished)
    report = build_report(
        runs,
        skipped,
        anchors,
        human_random,
        target_steps=target_steps,
        num_resamples=num_resamples,
        bootstrap_seed=bootstrap_seed,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if plots:
        from .plots import write_plots  # matplotlib only when plotting

        written = write_plots(report, out_dir)
    (out_dir / "report.md").write_text(render_markdown(report, [path.relative_to(out_dir) for path in written]))
    (out_dir / "report.json").write_text(json.dumps(report_to_json(report), indent=2, allow_nan=False) + "\n")
    return report
