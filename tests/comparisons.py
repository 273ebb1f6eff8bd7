"""How tests compare runs: trees of arrays bit for bit, a many-seed run against its single-seed runs, and a run
resumed from a checkpoint against the uninterrupted one."""

import json
import shutil
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

# vmapped matmuls are batched differently by XLA, so sums are accumulated in another order: agent s differs
# from the single-seed run by float32 rounding, which training then carries on (see README, "Many seeds").
RTOL, ATOL = 1e-4, 1e-5
PARAM_ATOL = 1e-6
VOLATILE = frozenset({"sps", "time_elapsed"})
"""The metrics that time the run, which no two runs share."""


def metrics(run_dir: Path) -> list[dict]:
    """The rows of ``run_dir``'s metrics.jsonl, less the ``VOLATILE`` ones."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in rows]


def leaves_equal(a, b) -> bool:
    a, b = jax.tree.leaves(eqx.filter(a, eqx.is_array)), jax.tree.leaves(eqx.filter(b, eqx.is_array))
    return len(a) == len(b) and all(
        x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True)
    )


def resume_a_copy(whole: Path, resumed: Path, capsys) -> None:
    """Copy the finished run ``whole`` to ``resumed`` less its last checkpoint (a run stopped after the one
    before) and continue it with ``ppo-eqx train --resume``."""
    from ppo_eqx.cli import main
    from ppo_eqx.host.checkpoint import list_checkpoints

    shutil.copytree(whole, resumed)
    last = list_checkpoints(resumed)[-1]
    last.unlink()
    last.with_suffix(".eqx").unlink()
    capsys.readouterr()
    assert main(["train", "--resume", str(resumed), "--no-progress", "--no-tensorboard"]) == 0
    assert "resuming" in capsys.readouterr().out


def final_checkpoint_bytes(run_dir: Path) -> bytes:
    """The arrays of the newest checkpoint in ``run_dir``."""
    from ppo_eqx.host.checkpoint import list_checkpoints

    return list_checkpoints(run_dir)[-1].with_suffix(".eqx").read_bytes()
