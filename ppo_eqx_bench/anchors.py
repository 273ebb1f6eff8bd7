"""The reference tables the report compares against, shipped in ``ppo_eqx_bench/data/`` (sources and
licences in its README.md): CleanRL's published 10M-step minutes and returns per Atari game, and the random
and human scores of human-normalised scores.
"""

import csv
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
ANCHORS_CSV = "cleanrl_ppo_atari_envpool_xla_jax.csv"
HUMAN_RANDOM_CSV = "atari_human_random_scores.csv"
NAN = float("nan")
PUBLISHED_10M = {
    "Breakout-MinAtar": 28.0,
    "SpaceInvaders-MinAtar": 131.0,
    "Asterix-MinAtar": 15.0,
    "Freeway-MinAtar": 58.0,
}
"""gymnax-blines' PPO on gymnax's MinAtar games after 10M steps (64 envs, 2 x 256 ReLU MLPs on the flattened grid:
ppo-eqx's ``grid`` preset), as gymnax's README gives its checkpoints' returns (the figures of issue 25)."""


@dataclasses.dataclass(frozen=True)
class Anchor:
    """CleanRL's published 10M-step results for one game (minutes and final return, 3 seeds).

    The field names are the CSV's column names.
    """

    cleanrl_minutes: float
    baselines_ppo2_minutes: float
    cleanrl_return_mean: float
    cleanrl_return_std: float
    baselines_return_mean: float
    baselines_return_std: float


@dataclasses.dataclass(frozen=True)
class HumanRandom:
    random_score: float
    human_score: float


class AnchorError(ValueError):
    """A reference CSV that is missing or malformed."""


def _read_csv(path: Path, columns: Sequence[str]) -> dict[str, list[float]]:
    """{env_id: [float per column]} of a CSV with an env_id column; an empty cell reads as NaN."""
    try:
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            missing = [name for name in ("env_id", *columns) if name not in (reader.fieldnames or [])]
            if missing:
                raise AnchorError(f"{path}: missing column(s) {', '.join(missing)}")
            table = {}
            for line, row in enumerate(reader, start=2):
                try:
                    table[row["env_id"]] = [float(row[name]) if (row[name] or "").strip() else NAN for name in columns]
                except ValueError as error:
                    raise AnchorError(f"{path} line {line}: {error}") from error
    except OSError as error:
        raise AnchorError(f"cannot read {path}: {error}") from error
    return table


def load_anchors(
    anchors_dir: str | os.PathLike[str] = DATA_DIR,
) -> tuple[dict[str, Anchor], dict[str, HumanRandom]]:
    """The CleanRL table and the human/random scores, by env_id, from ``anchors_dir`` (default: the shipped
    ones); AnchorError if either file is unreadable."""
    anchors_dir = Path(anchors_dir)
    columns = [field.name for field in dataclasses.fields(Anchor)]
    anchors = {env_id: Anchor(*values) for env_id, values in _read_csv(anchors_dir / ANCHORS_CSV, columns).items()}
    scores = _read_csv(anchors_dir / HUMAN_RANDOM_CSV, ["random_score", "human_score"])
    return anchors, {env_id: HumanRandom(*values) for env_id, values in scores.items()}
