"""The holder that a refused process names (``host.run_dir.take``): the process that holds the lock now, not the
earlier holder whose record is still in the lock file in the moment between the new holder's lock and its write.
The lock is on the run directory itself; the lock file only names the holder."""

import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ppo_eqx.errors import RunDirError
from ppo_eqx.host.run_dir.lock import RunLock
from ppo_eqx.host.run_dir.names import LOCK

pytestmark = pytest.mark.unit


def record(pid: int) -> str:
    return json.dumps({"pid": pid, "host": socket.gethostname(), "since": "2026-12-04 13:00:00", "command": "x"})


def test_a_dead_holders_record_is_waited_past_until_the_new_holder_writes_its_own(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (tmp_path / LOCK).write_text(record(dead_pid) + "\n")  # what a finished run left
    # The new holder has locked but not yet written: it writes 0.3 s later.
    holder_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(holder_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def write_own_record() -> None:
        time.sleep(0.3)
        (tmp_path / LOCK).write_text(record(os.getpid()) + "\n")

    writer = threading.Thread(target=write_own_record)
    writer.start()
    try:
        with pytest.raises(RunDirError) as refused:
            RunLock.take(tmp_path, "ppo-eqx train --resume")
    finally:
        writer.join()
        os.close(holder_fd)
    assert f"pid {os.getpid()} on host" in str(refused.value)
    assert str(dead_pid) not in str(refused.value).replace(f"pid {os.getpid()}", "")


def test_a_live_holders_record_is_named_at_once(tmp_path: Path) -> None:
    (tmp_path / LOCK).write_text(record(os.getpid()) + "\n")
    holder_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(holder_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with pytest.raises(RunDirError, match=f"in use by pid {os.getpid()} on host"):
            RunLock.take(tmp_path, "ppo-eqx train")
    finally:
        os.close(holder_fd)
