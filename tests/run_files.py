"""Tiny CartPole runs through the CLI, and what their run directories hold, read as a user's tools read them:
metrics.jsonl as JSON lines, TensorBoard's event files as TensorBoard reads them. Nothing here imports ppo_eqx."""

import json
import shutil
import struct
from pathlib import Path
from typing import Any

from tensorboardX.crc32c import crc32c
from tensorboardX.proto.event_pb2 import Event, SessionLog  # pyright: ignore[reportAttributeAccessIssue]

BATCH = 512
"""Steps of one iteration of ``tiny``: CartPole's preset, 4 envs x 128 steps."""


def tiny(run_dir: Path, iterations: int = 4, *, checkpoint_every: int = 2, keep: int = 3) -> list[str]:
    """``train`` arguments of a CartPole run of ``iterations`` iterations, a few seconds, TensorBoard on.

    ``checkpoint_every`` 1 makes each iteration slower (each segment's envs get their own compile, in the
    background): a run that a test can act on while it trains."""
    return [
        "train", "--env-id", "CartPole-v1", "--num-envs", "4", "--num-steps", "128",
        "--total-timesteps", str(iterations * BATCH), "--checkpoint-every", str(checkpoint_every),
        "--keep-checkpoints", str(keep), "--no-progress", "--run-dir", str(run_dir),
    ]  # fmt: skip


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl``, every line parsed (a line that is not JSON is an AssertionError)."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def iterations(run_dir: Path) -> list[int]:
    """The ``iteration`` of every line of metrics.jsonl, in file order (a damaged line: -1)."""
    found = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            found.append(int(json.loads(line)["iteration"]))
        except (ValueError, KeyError, TypeError):
            found.append(-1)
    return found


BOOKKEEPING = (".ppo-eqx-manifest.jsonl", ".ppo-eqx.lock")
"""What ppo_eqx keeps in a run directory besides the run: what it wrote (every run and agent directory), who
trains there (a run directory)."""


def listing(directory: Path) -> list[str]:
    """The names in a run or agent directory, sorted, less ppo_eqx's bookkeeping (its manifest must be there)."""
    names = sorted(p.name for p in directory.iterdir())
    assert BOOKKEEPING[0] in names, names
    return [name for name in names if name not in BOOKKEEPING]


def checkpoint_names(run_dir: Path) -> list[str]:
    directory = run_dir / "checkpoints"
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (relative path -> bytes)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path: Path) -> list[bytes]:
    """The records of a TFRecord file (TensorBoard's events): each ``uint64 length, uint32 masked CRC-32C of the
    length, data, uint32 masked CRC-32C of the data``, little-endian. A record cut short or damaged ends it, as
    TensorBoard's reader stops there."""
    data, at, records = path.read_bytes(), 0, []
    while at + 12 <= len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8 : at + 12])
        end = at + 12 + length + 4
        if header_crc != _masked_crc(header) or end > len(data):
            break
        record = data[at + 12 : at + 12 + length]
        if struct.unpack("<I", data[end - 4 : end])[0] != _masked_crc(record):
            break
        records.append(record)
        at = end
    return records


def tensorboard_points(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """The (step, value) points of scalar ``tag`` that TensorBoard shows for ``run_dir``: its event files read in
    name order (their names begin with the time they were made), each ``SessionLog.START`` at step s dropping
    the points at s and after (TensorBoard's purge of orphaned data: a run resumed from an earlier step)."""
    points: list[tuple[int, float]] = []
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for record in read_records(path):
            event = Event.FromString(record)
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                points = [(step, value) for step, value in points if step < event.step]
            for value in event.summary.value:
                if value.tag == tag:
                    points.append((event.step, value.simple_value))
    return points


def interrupted_copy(finished: Path, target: Path, at: int) -> Path:
    """A copy of the finished run ``finished`` at ``target`` as a run killed after its checkpoint of iteration
    ``at`` would be: no later checkpoint, no summary.json, metrics.jsonl up to ``at``."""
    shutil.copytree(finished, target)
    for path in (target / "checkpoints").iterdir():
        if int(path.stem.removeprefix("iter_")) > at:
            path.unlink()
    (target / "summary.json").unlink()
    rows = (target / "metrics.jsonl").read_text().splitlines(keepends=True)
    (target / "metrics.jsonl").write_text("".join(rows[:at]))
    return target
