"""Benchmark report: ppo_eqx's runs beside CleanRL's published minutes and returns.

    python bench/report.py runs/atari57 --out reports/atari57

Reads every run directory (one holding config.json) at or under the given paths, and writes
OUT/report.md, OUT/report.json and PNG/SVG plots. The reference tables ship with the project
(ppo_eqx_bench/data/, sources and licences in its README.md); games without a reference (CartPole-v1, a
vector task) are reported without those columns. A game run with several settings (``ppo-eqx train --sweep``:
RUN/SETTING/seedK/) also gets a table of its settings and a plot of the final return against each swept
field. The computations live in the ppo_eqx_bench package.
"""

import argparse
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO_ROOT))

from ppo_eqx_bench import anchors, stats  # noqa: E402
from ppo_eqx_bench.arguments import Parser, existing_path, int_at_least, out_dir_problem  # noqa: E402
from ppo_eqx_bench.report import write_report  # noqa: E402

ANCHORS_ENV = "PPO_EQX_ANCHORS"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(
        description=__doc__,
        epilog="The conventions (final return, projection to 10M steps, HNS aggregates, intervals) are stated "
        "in report.md itself and in the docstring of ppo_eqx_bench/stats.py.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths", nargs="+", type=existing_path, help="run directories or sweep directories holding them"
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for report.md, report.json and plots")
    parser.add_argument(
        "--anchors",
        type=Path,
        default=None,
        help=f"directory with {anchors.ANCHORS_CSV} and {anchors.HUMAN_RANDOM_CSV} "
        f"(default: ${ANCHORS_ENV}, else the shipped ones in {anchors.DATA_DIR})",
    )
    parser.add_argument(
        "--include-unfinished",
        action="store_true",
        help="also report runs without summary.json (interrupted or still running), from what they logged",
    )
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument(
        "--target-steps",
        type=int_at_least(1),
        default=stats.TARGET_STEPS,
        help="steps the minutes are compared at (default: %(default)s, the anchors')",
    )
    parser.add_argument(
        "--resamples",
        type=int_at_least(1),
        default=stats.NUM_RESAMPLES,
        help="bootstrap resamples (default: %(default)s)",
    )
    parser.add_argument(
        "--bootstrap-seed",
        type=int_at_least(0),
        default=stats.BOOTSTRAP_SEED,
        help="RNG seed of the bootstrap (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    problem = out_dir_problem("--out", args.out)  # before any run is read: the report must have a place to go
    if problem is not None:
        parser.error(problem)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    anchors_dir = args.anchors or Path(os.environ.get(ANCHORS_ENV) or anchors.DATA_DIR)
    try:
        result = write_report(
            args.paths,
            args.out,
            anchors_dir,
            include_unfinished=args.include_unfinished,
            plots=not args.no_plots,
            target_steps=args.target_steps,
            num_resamples=args.resamples,
            bootstrap_seed=args.bootstrap_seed,
        )
    except anchors.AnchorError as error:  # a reference that was asked for and cannot be read
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        if error.name != "matplotlib":
            raise
        print("error: the plots need matplotlib: install the [bench] extra, or pass --no-plots", file=sys.stderr)
        return 2
    games = len({run.env_id for run in result.runs})
    print(
        f"{len(result.runs)} run(s) over {games} game(s), {len(result.skipped)} skipped: wrote {args.out / 'report.md'}"
    )
    for item in result.skipped:
        print(f"  skipped {item.path}: {item.reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
