"""The run directory: config.json, hardware.json, metrics.jsonl, TensorBoard events, summary.json."""

import json
import math
import os
from pathlib import Path
from typing import Any

from .config import PPOConfig

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


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically: a crash leaves the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunWriter:
    """Appends one JSON line per iteration to ``metrics.jsonl`` (NaN written as null) and TensorBoard."""

    def __init__(self, run_dir: Path, config: PPOConfig, hardware: dict[str, Any], *, tensorboard: bool = True):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "config.json", config.to_dict())
        write_json(run_dir / "hardware.json", hardware)
        self._metrics = open(run_dir / "metrics.jsonl", "a")
        self._tensorboard = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tensorboard = SummaryWriter(str(run_dir))
            table = "\n".join(f"|{key}|{value}|" for key, value in config.to_dict().items())
            self._tensorboard.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    def write(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps({k: _finite_or_none(v) for k, v in record.items()}, allow_nan=False) + "\n")
        self._metrics.flush()
        if self._tensorboard is not None:
            for name, tag in TENSORBOARD_TAGS.items():
                value = record.get(name)
                if value is not None and math.isfinite(value):
                    self._tensorboard.add_scalar(tag, value, record["global_step"])

    def finish(self, summary: dict[str, Any]) -> None:
        write_json(self.run_dir / "summary.json", {k: _finite_or_none(v) for k, v in summary.items()})

    def close(self) -> None:
        self._metrics.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
