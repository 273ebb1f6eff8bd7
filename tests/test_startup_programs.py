"""What a run compiles on its way: on an accelerator every program is compiled there (seconds each on a TPU v5e,
docs/performance.md), so the checks, the hyperparameters, the envs' seeds and the checkpoints' finiteness compute
nothing on the device, and no program is compiled twice."""

import collections
import logging
from pathlib import Path

import jax
import pytest

from ppo_eqx.cli import main

pytestmark = pytest.mark.compile


class _Compiles(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.names: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Compiling "):
            self.names[message.split()[1].removeprefix("jit(").removesuffix(")")] += 1


def test_a_gymnax_run_compiles_no_check_and_nothing_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh gymnax run with a checkpoint: the env's shapes are traced, not run (no key or action made on the
    device: ``stage``, ``_threefry_seed``), the hyperparameters are put there, not converted there, the checkpoint's
    finiteness is read on the host (no ``all_finite``), and the priming program, called once, is not compiled
    again ahead of time."""
    handler = _Compiles()
    loggers = [logging.getLogger(name) for name in ("jax._src.interpreters.pxla", "jax._src.dispatch")]
    logged = jax.config.jax_log_compiles  # pyright: ignore[reportAttributeAccessIssue]
    jax.config.update("jax_log_compiles", True)
    for logger in loggers:
        logger.addHandler(handler)
        monkeypatch.setattr(logger, "level", logging.DEBUG)
    try:
        argv = ["train", "--env-backend", "gymnax", "--env-id", "Acrobot-v1", "--total-timesteps", "2048"]
        assert main([*argv, "--no-progress", "--checkpoint-every", "2", "--run-dir", str(tmp_path / "run")]) == 0
    finally:
        jax.config.update("jax_log_compiles", logged)
        for logger in loggers:
            logger.removeHandler(handler)
    assert handler.names["prime"] <= 1, handler.names
    assert not {"stage", "_threefry_seed", "all_finite"} & set(handler.names), handler.names
    assert handler.names["chunk"] + handler.names["iteration"] >= 1, handler.names  # the log was read
