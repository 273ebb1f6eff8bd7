"""What a run writes as it goes: config.json, hardware.json, metrics.jsonl, TensorBoard events, summary.json,
and an optional Weights & Biases run (file names and layout: ``rundir``)."""

import json
import math
import uuid
from pathlib import Path
from typing import Any

from ..config import PPOConfig
from ..host.rundir import CONFIG, HARDWARE, METRICS, SUMMARY, WANDB, write_json

# CleanRL's TensorBoard tags for the metrics it logs.
TENSORBOARD_TAGS = {
    "episodic_return": "charts/episodic_return",
    "episodic_length": "charts/episodic_length",
    "learning_rate": "charts/learning_rate",
    "sps": "charts/SPS",
    "loss": "losses/loss",
    "policy_loss": "losses/policy_loss",
    "value_loss": "losses/value_loss",
    "entropy": "losses/entropy",
    "approx_kl": "losses/approx_kl",
    "clip_fraction": "losses/clipfrac",
}
TENSORBOARD_QUEUE = 1000
"""Events that TensorBoard's writer thread may have pending before add_scalar blocks."""


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


class RunWriter:
    """Appends one JSON line per iteration to ``metrics.jsonl`` (NaN written as null), to TensorBoard, and to
    a Weights & Biases run when one is given (anything with ``log(dict, step=)`` and ``finish()``).

    ``resume_step``: the global step of the checkpoint a resumed run starts from. TensorBoard then hides the
    earlier event files' points after it (``purge_step``), as ``metrics.jsonl`` has been truncated there.
    """

    def __init__(
        self,
        run_dir: Path,
        config: PPOConfig,
        hardware: dict[str, Any],
        *,
        tensorboard: bool = True,
        resume_step: int | None = None,
        wandb_run: Any = None,
    ):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / CONFIG, config.to_dict())
        if resume_step is None or not (run_dir / HARDWARE).exists():
            write_json(run_dir / HARDWARE, hardware)
        self._metrics = open(run_dir / METRICS, "a")
        self._tensorboard = None
        self._wandb = wandb_run
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge_step = None if resume_step is None else resume_step + config.batch_size
            # tensorboardX writes from a thread, which a full disk ends; its queue (10 events by default) then
            # fills, and add_scalar blocks the loop forever before the loop sees the thread's error. A queue of
            # TENSORBOARD_QUEUE events takes about 90 iterations after the thread has died.
            self._tensorboard = SummaryWriter(str(run_dir), purge_step=purge_step, max_queue=TENSORBOARD_QUEUE)
            if resume_step is None:
                table = "\n".join(f"|{key}|{value}|" for key, value in config.to_dict().items())
                self._tensorboard.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    def write(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps({k: _finite_or_none(v) for k, v in record.items()}, allow_nan=False) + "\n")
        self._metrics.flush()
        scalars = {
            tag: record[name]
            for name, tag in TENSORBOARD_TAGS.items()
            if isinstance(record.get(name), float | int) and math.isfinite(record[name])
        }
        if self._tensorboard is not None:
            for tag, value in scalars.items():
                self._tensorboard.add_scalar(tag, value, record["global_step"])
        if self._wandb is not None:
            self._wandb.log({**scalars, "global_step": record["global_step"]}, step=record["global_step"])

    def finish(self, summary: dict[str, Any]) -> None:
        write_json(self.run_dir / SUMMARY, {k: _finite_or_none(v) for k, v in summary.items()})

    def close(self) -> None:
        self._metrics.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()


def start_wandb(run_dir: Path, config: PPOConfig, *, project: str, entity: str | None) -> Any:
    """A Weights & Biases run for ``run_dir`` (CleanRL's ``--track``), resumed when the run directory is.

    wandb is imported here, only when asked for; the run's id is kept in ``run_dir/wandb.json``.
    """
    import wandb  # pyright: ignore[reportMissingImports]

    id_file = run_dir / WANDB
    run_id = json.loads(id_file.read_text())["id"] if id_file.exists() else uuid.uuid4().hex[:12]
    write_json(id_file, {"id": run_id, "project": project, "entity": entity})
    return wandb.init(
        project=project,
        entity=entity,
        name=run_dir.name,
        id=run_id,
        resume="allow",
        dir=str(run_dir),
        config=config.to_dict(),
    )
