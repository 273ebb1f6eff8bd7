"""What a training run shows as it goes: tqdm's bar (``--progress``) or one line an iteration (``--no-progress``),
each iteration shown once its rows are written (``hold``, then ``show`` after the writers' flush)."""

import math
import time
from typing import Any

from tqdm import tqdm

from ..config import PPOConfig
from .interrupts import say


def mean_return(records: list[dict[str, Any]]) -> float:
    """The mean over agents of an iteration's ``episodic_return`` (NaN where none has finished an episode)."""
    returns = [r["episodic_return"] for r in records if math.isfinite(r.get("episodic_return", math.nan))]
    return sum(returns) / len(returns) if returns else math.nan


def _format_eta(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(seconds)) if math.isfinite(seconds) else "?"


class Progress:
    """The bar where ``bar``, the step lines where ``lines`` (a process that writes nothing shows neither), from
    ``start_iteration`` of ``config``'s run."""

    def __init__(self, config: PPOConfig, start_iteration: int, *, bar: bool, lines: bool) -> None:
        self.config, self._lines = config, lines
        self._held: list[list[dict[str, Any]]] = []  # records whose rows the writers hold, not yet shown
        self._bar = tqdm(
            total=config.num_iterations * config.batch_size,
            initial=start_iteration * config.batch_size,
            unit="step",
            unit_scale=True,
            disable=not bar,
            dynamic_ncols=True,
            mininterval=1.0,
        )

    def hold(self, records: list[dict[str, Any]]) -> None:
        """An iteration's records, shown by the next ``show``."""
        self._held.append(records)

    def show(self) -> None:
        """Every iteration held, in order: progress counts every agent's steps, the return shown is the mean over
        agents."""
        held, self._held = self._held, []
        config = self.config
        for records in held:
            record = records[0]
            sps = record["sps"] * config.num_agents
            self._bar.update(config.batch_size)
            self._bar.set_postfix(sps=f"{sps:.0f}", ret=f"{mean_return(records):.1f}")
            if self._lines:
                left = (config.num_iterations - record["iteration"]) * config.batch_size / record["sps"]
                say(
                    f"step {record['global_step']} sps {sps:.0f} episodic_return {mean_return(records):.2f} "
                    f"time left {_format_eta(left)}"
                )

    def close(self) -> None:
        self._bar.close()
