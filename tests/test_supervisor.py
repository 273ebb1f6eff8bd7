"""What a fault during a run says of the way on (``cli.supervisor``): an XLA fault that comes back on the same
program and machine (a program that cannot compile, an operation the device lacks) is not met with advice to run
the same command again; a passing one is."""

from pathlib import Path
from types import SimpleNamespace

import jax
import pytest

from ppo_eqx.cli.supervisor import Supervisor, _StopRequest
from ppo_eqx.errors import RunError

pytestmark = pytest.mark.unit


class _Faulty(Supervisor):
    """A supervisor whose run opens with ``error``, nothing else of it made (no writes, no checkpoint)."""

    def __init__(self, error: Exception, run_dir: Path):  # not super().__init__(): no plan, no trainer
        self.error, self.plan, self.writes, self.last_checkpoint = error, SimpleNamespace(run_dir=run_dir), False, None
        self.stop, self.thread_errors, self._trainer, self.agents = _StopRequest(), [], None, []
        self.writers = SimpleNamespace(close_quietly=lambda: None)

    def _open(self) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("status", "again"),
    [
        ("INVALID_ARGUMENT: Custom emitter for AtariGymnasiumEnvPool_0_send not found", False),  # EnvPool on a TPU
        ("UNIMPLEMENTED: no kernel for this op on this device", False),
        ("RESOURCE_EXHAUSTED: out of memory while allocating 4.2G", True),
        ("INTERNAL: the device was lost", True),
    ],
)
def test_an_xla_fault_says_whether_running_again_helps(tmp_path: Path, status: str, again: bool) -> None:
    supervisor = _Faulty(jax.errors.JaxRuntimeError(status + "\nmore of XLA's lines"), tmp_path / "run")
    with pytest.raises(RunError) as fault:
        supervisor.run()
    line = str(fault.value)
    assert "\n" not in line and line.startswith(status), line
    assert ("run the same command again" in line) == again, line
    assert ("fails the same way" in line) == (not again), line
