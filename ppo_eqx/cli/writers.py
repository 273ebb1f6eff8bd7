"""What a run writes as it goes: config.json, hardware.json, metrics.jsonl, TensorBoard events, summary.json,
and an optional Weights & Biases run (file names and layout: ``host.run_dir.names``), each through the run
directory's one owner (``host.run_dir.RunDirectory``: listed in the manifest before it is made, written where the
lock holds)."""

import contextlib
import dataclasses
import functools
import json
import math
import os
import socket
import struct
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import PPOConfig
from ..errors import RunError
from ..host.run_dir import CONFIG, EVAL, HARDWARE, METRICS, SUMMARY, WANDB, RunDirectory

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
UNTAGGED = frozenset({"iteration", "global_step", "time_elapsed"})
"""A record's fields that are not a metric's points (the step, and what the clock says)."""


def tensorboard_tag(name: str) -> str:
    """A metric's TensorBoard tag: CleanRL's, or ``losses/NAME`` for a value that a loss of the user's reports."""
    return TENSORBOARD_TAGS.get(name, f"losses/{name}")


class EventsFile:
    """A TensorBoard events file written as the run goes, each event handed to the OS at once (one ``write`` of
    a whole TFRecord: length, its masked CRC-32C, the serialised ``Event``, its masked CRC-32C), so that a kill at
    any moment leaves every event written before it (tensorboardX's writer keeps them in a thread's queue and a
    buffer for up to two minutes). Errors (a full disk) are raised by the call that writes. tensorboardX's own
    writer would also name its file inside its constructor, from the clock, where the run must list the name in its
    manifest before the file exists (a kill between the two would leave a file named like a run's that no run
    lists, which ``--overwrite`` then refuses); so only its records' format and CRC are borrowed from it.

    ``purge_step``: TensorBoard hides the points of earlier files at this step and after (a resumed run's
    ``SessionLog.START``).
    """

    def __init__(self, directory: RunDirectory, *, purge_step: int | None = None):
        from tensorboardX.proto.event_pb2 import Event, SessionLog  # pyright: ignore[reportAttributeAccessIssue]

        self._event = Event
        stem = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        taken = set(directory.names())
        name = next(name for n in range(10**6) if (name := stem if n == 0 else f"{stem}.{n}") not in taken)
        self._fd = directory.append(name, new=True)
        self.path = directory.path / name
        self.write_event(Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:
            start = SessionLog(status=SessionLog.START)
            self.write_event(Event(wall_time=time.time(), step=purge_step, session_log=start))

    def write_records(self, records: Sequence[bytes]) -> None:
        """Serialised events, framed as TFRecords, handed to the OS in one ``write``."""
        from tensorboardX.record_writer import masked_crc32c

        framed = []
        for data in records:
            header = struct.pack("<Q", len(data))
            framed += [header, struct.pack("<I", masked_crc32c(header)), data, struct.pack("<I", masked_crc32c(data))]
        view = memoryview(b"".join(framed))
        while view:
            view = view[os.write(self._fd, view) :]

    def write_event(self, event: Any) -> None:
        self.write_records([event.SerializeToString()])

    def scalars(self, step: int, values: dict[str, float]) -> bytes:
        """One event holding every ``tag: value`` at ``step``, serialised (``write_records`` writes it):
        ``scalars_event``."""
        return scalars_event(time.time(), step, values)

    def text(self, tag: str, text: str) -> None:
        from tensorboardX.summary import text as text_summary

        self.write_event(self._event(wall_time=time.time(), summary=text_summary(tag, text)))

    def close(self) -> None:
        os.close(self._fd)


def _varint(n: int) -> bytes:
    """Protocol Buffers' base-128 varint of ``n`` (a negative int64 as its two's complement, ten bytes)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@functools.lru_cache(maxsize=4096)
def _value_head(tag: str) -> bytes:
    """A ``Summary.value`` entry up to its float: the entry's key and length, the ``tag`` field, the float's key."""
    name = tag.encode()
    value = b"\x0a" + _varint(len(name)) + name + b"\x15"  # Value.tag (1, bytes), Value.simple_value (2, fixed32)
    return b"\x0a" + _varint(len(value) + 4) + value  # Summary.value (1, bytes)


def scalars_event(wall_time: float, step: int, values: dict[str, float]) -> bytes:
    """A TensorBoard ``Event`` (wall_time, step, a ``Summary`` of one ``simple_value`` per tag), serialised by hand:
    the bytes parse as the message protobuf builds from the same fields (each value rounded to float32 as there,
    a finite one beyond float32's range as an infinity) at a fifth of its cost, which a run writes for every agent
    and iteration (250,000 rows for 256 CartPole agents)."""
    try:
        floats = struct.pack(f"<{len(values)}f", *values.values())
    except OverflowError:  # a finite double beyond float32's range: protobuf's infinity
        with np.errstate(over="ignore"):
            floats = np.asarray(list(values.values()), np.float32).tobytes()
    summary = b"".join(_value_head(tag) + floats[4 * i : 4 * i + 4] for i, tag in enumerate(values))
    # Event.wall_time (1, fixed64), Event.step (2, varint), Event.summary (5, bytes).
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step) + b"\x2a" + _varint(len(summary)) + summary


def open_appending(fd: int) -> Any:
    """The text file that appends to ``fd`` (``metrics.jsonl``'s, from the run directory)."""
    return os.fdopen(fd, "a")


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


class RunWriter:
    """Appends each iteration to TensorBoard's events, then as one JSON line to ``metrics.jsonl`` (NaN written as
    null), and to a Weights & Biases run when one is given (anything with ``log(dict, step=)`` and ``finish()``):
    every row of ``metrics.jsonl`` has its points in TensorBoard, at any kill. The rows ``write`` is given are held
    until ``flush`` (the run's loop flushes after each program's rows, before a checkpoint and at the end): a
    program of many iterations costs two writes a file, not two a row (a TPU machine's sandboxed file calls made
    250,000 rows cost about 40 s).

    ``resume_step``: the global step of the checkpoint a resumed run starts from. TensorBoard then hides the
    earlier event files' points after it (``purge_step``), as ``metrics.jsonl`` has been truncated there.
    """

    def __init__(
        self,
        directory: RunDirectory,
        config: PPOConfig,
        hardware: dict[str, Any],
        *,
        tensorboard: bool = True,
        resume_step: int | None = None,
        wandb_run: Any = None,
    ):
        self.directory = directory
        # eval.json is this run's too (``ppo-eqx eval`` writes it here): listed now, as eval never takes the run.
        for name in (CONFIG, HARDWARE, METRICS, SUMMARY, EVAL):
            directory.list_entry("file", name)
        directory.write_json(CONFIG, config.to_dict())
        if resume_step is None or directory.read(HARDWARE) is None:
            directory.write_json(HARDWARE, hardware)
        self._metrics = open_appending(directory.append(METRICS))
        self._events: list[bytes] = []
        self._rows: list[str] = []
        self._closed = False
        self._tensorboard: EventsFile | None = None
        self._wandb = wandb_run
        if tensorboard:
            purge_step = None if resume_step is None else resume_step + config.batch_size
            self._tensorboard = EventsFile(directory, purge_step=purge_step)
            if resume_step is None:
                table = "\n".join(f"|{key}|{value}|" for key, value in config.to_dict().items())
                self._tensorboard.text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    def write(self, record: dict[str, Any]) -> None:
        scalars = {
            tensorboard_tag(name): float(value)
            for name, value in record.items()
            if name not in UNTAGGED and isinstance(value, float | int) and math.isfinite(value)
        }
        if self._tensorboard is not None:
            self._events.append(self._tensorboard.scalars(record["global_step"], scalars))
        self._rows.append(json.dumps({k: _finite_or_none(v) for k, v in record.items()}, allow_nan=False) + "\n")
        if self._wandb is not None:
            self._wandb.log({**scalars, "global_step": record["global_step"]}, step=record["global_step"])

    def flush(self) -> None:
        """The rows held, written: their TensorBoard events first (a row is never without its points), then the
        rows, each file in one write. OSError (a full disk) raised here; what failed stays held."""
        if self._tensorboard is not None and self._events:
            self._tensorboard.write_records(self._events)
        self._events = []
        if self._rows:
            self._metrics.write("".join(self._rows))
            self._metrics.flush()
        self._rows = []

    def finish(self, summary: dict[str, Any]) -> None:
        self.directory.write_json(SUMMARY, {k: _finite_or_none(v) for k, v in summary.items()})

    def close(self) -> None:
        """The rows held written, then every file closed (once: a second close does nothing); OSError raised."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            try:
                self._metrics.close()
            finally:
                if self._tensorboard is not None:
                    self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()


@dataclasses.dataclass(frozen=True)
class WandbRun:
    """Where a tracked run (CleanRL's ``--track``) logs: a Weights & Biases project, and its entity."""

    project: str
    entity: str | None


class Writers:
    """The run's writers, one ``RunWriter`` per agent, fed together: each iteration's records (one per agent, in
    the agents' order), the end (TensorBoard's last events, then summary.json) and a close after a fault. None
    for a process that writes nothing (``Writers()``)."""

    def __init__(self, writers: Sequence[RunWriter] = ()) -> None:
        self._writers = list(writers)

    @classmethod
    def open(
        cls,
        agents: Sequence[RunDirectory],
        configs: Sequence[PPOConfig],
        hardware: dict[str, Any],
        *,
        tensorboard: bool,
        resume_step: int | None,
        wandb: WandbRun | None = None,
    ) -> "Writers":
        """A writer in each agent's directory (``configs[i]`` in ``agents[i]``); ``resume_step``: the global step
        of the checkpoint a resumed run starts from. RunError (one line) where W&B refuses the run."""
        writers = []
        for directory, config in zip(agents, configs, strict=True):
            wandb_run = None
            if wandb is not None:
                try:
                    wandb_run = start_wandb(directory, config, project=wandb.project, entity=wandb.entity)
                except Exception as error:  # W&B's own errors (network, login) are of many types
                    refused = str(error).splitlines()[0]
                    raise RunError(f"--track: Weights & Biases refused the run: {refused}") from None
            writers.append(
                RunWriter(
                    directory, config, hardware, tensorboard=tensorboard, resume_step=resume_step, wandb_run=wandb_run
                )
            )
        return cls(writers)

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        """One iteration's records, ``records[i]`` agent i's (none where this process writes nothing); held until
        ``flush``."""
        for writer, record in zip(self._writers, records, strict=bool(self._writers)):
            writer.write(record)

    def flush(self) -> None:
        """Every writer's rows held, written (``RunWriter.flush``)."""
        for writer in self._writers:
            writer.flush()

    def close(self) -> None:
        """Each writer's last events written and its files closed; OSError (a full disk) raised here."""
        for writer in self._writers:
            writer.close()

    def finish(self, records: Sequence[dict[str, Any]]) -> None:
        """summary.json of each agent: its last record's step, time and return."""
        for writer, record in zip(self._writers, records, strict=bool(self._writers)):
            writer.finish({key: record.get(key) for key in ("global_step", "time_elapsed", "episodic_return")})

    def close_quietly(self) -> None:
        """``close`` after a fault: what each writer holds is written where it can be, errors dropped."""
        for writer in self._writers:
            with contextlib.suppress(OSError):
                writer.close()


def start_wandb(directory: RunDirectory, config: PPOConfig, *, project: str, entity: str | None) -> Any:
    """A Weights & Biases run for ``directory`` (CleanRL's ``--track``), resumed when the run directory is.

    wandb is imported here, only when asked for; the run's id is kept in ``wandb.json``, its files in ``wandb/``
    (a tree that W&B fills: listed, and written by W&B itself, where the directory is now).
    """
    import wandb  # pyright: ignore[reportMissingImports]

    directory.list_entry("tree", "wandb")
    saved = directory.read(WANDB)
    try:
        run_id = str(json.loads(saved)["id"]) if saved is not None else uuid.uuid4().hex[:12]
    except (ValueError, KeyError, TypeError, RecursionError):
        run_id = uuid.uuid4().hex[:12]
    directory.write_json(WANDB, {"id": run_id, "project": project, "entity": entity})
    return wandb.init(
        project=project,
        entity=entity,
        name=directory.path.name,
        id=run_id,
        resume="allow",
        dir=directory.where(),
        config=config.to_dict(),
    )
