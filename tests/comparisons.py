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
ROUNDING_SHARE = 1e-2
"""How much of a run's largest possible parameter change float32 rounding may account for (``param_atol``)."""


def param_atol(config, iterations: int) -> float:
    """How far one agent's parameters may be from its single run's after ``iterations``, stated from the update's
    arithmetic, not from one machine's result: Adam moves a parameter by about the learning rate per minibatch step
    whatever the gradient's size (``m / sqrt(v)`` is near 1 in magnitude early on), so ``learning_rate x steps``
    bounds what the run can change, and rounding (sums in another order: relative differences of 1e-7 to 1e-5 in
    each gradient) changes a step's size by far less than 1% of it. A wrong agent's data or hyperparameters
    change it by the order of the steps themselves: far above this. The largest learning rate of a sweep counts."""
    rates = [config.learning_rate, *(v for name, values in config.sweep if name == "learning_rate" for v in values)]
    steps = iterations * config.num_minibatches * config.update_epochs
    return ROUNDING_SHARE * max(rates) * steps


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


def resumes_in_a_process_as_it_ran(finished: Path, target: Path, at: int) -> None:
    """Copy the finished run ``finished`` to ``target`` as a run stopped after its checkpoint of iteration ``at``
    (``run_files.interrupted_copy``), resume it with ``ppo-eqx train --resume`` in a process of its own, and assert
    that it goes on as the uninterrupted run did: the same metrics rows, the same bytes of the final checkpoint."""
    from .processes import ppo_eqx, run_child
    from .run_files import interrupted_copy

    resumed = interrupted_copy(finished, target, at=at)
    code, out, err = run_child(ppo_eqx("train", "--resume", str(resumed), "--no-progress"))
    assert code == 0, out + err
    assert metrics(resumed) == metrics(finished)
    assert final_checkpoint_bytes(resumed) == final_checkpoint_bytes(finished)
