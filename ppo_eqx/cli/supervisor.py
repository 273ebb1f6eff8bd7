"""A training run once its input is checked (``train_command``), supervised: the run directory's writers, the
Trainer, Ctrl-C and SIGTERM, checkpoints at segment boundaries, and how it ends."""

import argparse
import contextlib
import dataclasses
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import jax
from jax.sharding import Mesh

from ..config import PPOConfig
from ..core.networks import ConvRoute
from ..core.state import Checkpoint
from ..errors import ConfigError, NonFiniteError, RunDirError, RunError, UsageError, callback_fault, raised, user_frame
from ..host.checkpoint import save_checkpoint
from ..host.kernel_build import auto_note
from ..host.loop import FAULT_ITERATIONS, run_agents
from ..host.mesh import any_process
from ..host.placement import Placement
from ..host.resume import checked_metrics
from ..host.run_dir import METRICS, SUMMARY, RunDirectory, never_trained
from ..host.trainer import Trainer
from .hardware import where_it_ran
from .interrupts import EARLY, SIGNALS, exit_status, say
from .plan import Plan
from .progress import Progress, mean_return
from .schedule import checkpoint_reason, is_boundary, stops_after
from .stopwatch import STARTUP
from .writers import WandbRun, Writers

MOVED = "moved"
DETERMINISTIC = ("INVALID_ARGUMENT", "UNIMPLEMENTED", "FAILED_PRECONDITION", "OUT_OF_RANGE", "NOT_FOUND")
"""XLA's statuses of a fault that comes back on the same program and machine (a program that cannot compile, an
operation the device lacks): no advice to run it again."""
"""The stop request of a run whose directory's path no longer leads to it (``RunDirectory.in_place``)."""


class _StopRequest:
    """Ctrl-C (or SIGTERM, SIGHUP, SIGUSR1) asks the loop to stop after the iteration under way; a second one stops
    at once."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How ``ppo-eqx train`` runs, beside what it trains (the plan): the checkpoints kept, the writers, the
    progress shown."""

    keep_checkpoints: int = 3
    tensorboard: bool = True
    progress: bool = True
    track: bool = False
    wandb_project_name: str = "cleanRL"
    wandb_entity: str | None = None

    @classmethod
    def of(cls, args: argparse.Namespace, resumed: dict[str, Any] | None = None) -> "RunOptions":
        """The options that ``train``'s flags give (``command_line``'s run flags); a resumed run (``resumed``: its
        newest checkpoint's metadata) keeps the ``--keep-checkpoints`` it was started with unless the flag is given."""
        keep = args.keep_checkpoints
        if keep is None and resumed is not None:
            saved = resumed.get("keep_checkpoints")
            keep = saved if isinstance(saved, int) and not isinstance(saved, bool) and 1 <= saved <= 2**31 - 1 else None
        return cls(
            keep_checkpoints=keep or cls.keep_checkpoints,
            tensorboard=not args.no_tensorboard,
            progress=not args.no_progress,
            track=args.track,
            wandb_project_name=args.wandb_project_name,
            wandb_entity=args.wandb_entity,
        )


class Supervisor:
    """One ``ppo-eqx train`` once its input is checked: the writers, the trainer, signals, checkpoints, the end.

    ``run()`` returns the exit status; a fault after the start (a full disk, a writer's thread failing, a second
    Ctrl-C) is a ``RunError`` (one line), with everything written before it intact.
    """

    def __init__(
        self,
        options: RunOptions,
        plan: Plan,
        mesh: Mesh | None,
        restore: Checkpoint | None,
        directory: RunDirectory | None,
    ):
        if plan.route is None or plan.placement is None or plan.hardware is None:
            raise ValueError("the plan's route, placement and hardware are resolved before a run is supervised")
        self.options, self.plan, self.mesh, self.restore = options, plan, mesh, restore
        self.directory = directory
        """The run directory, through which every write goes (process 0's; None in the others, which write nothing)."""
        self.writes = directory is not None
        self.agents: list[RunDirectory] = []
        self.config = plan.config
        self.conv_impl: ConvRoute = plan.route
        self.placement: Placement = plan.placement
        self.hardware: dict[str, Any] = plan.hardware
        self.writers = Writers()
        self._trainer: Trainer | None = None
        self.stop = _StopRequest()
        self.last_checkpoint: Path | None = None if plan.resume is None else plan.resume.path
        self.thread_errors: list[BaseException] = []
        self.time_offset = 0.0 if plan.resume is None else float(plan.resume.metadata.get("time_elapsed", 0.0))
        self.records: list[dict[str, Any]] = []
        self._progress: Progress | None = None  # while the loop runs

    @property
    def trainer(self) -> Trainer:
        """The run's trainer, once ``_open`` has made it."""
        if self._trainer is None:
            raise RuntimeError("the run's trainer is made when the run opens")
        return self._trainer

    def say(self, line: str) -> None:
        if self.writes:
            say(line)

    def run(self) -> int:
        stopped = EARLY.pending()  # while the run directory was taken
        if stopped is not None:
            print(f"ppo-eqx: stopped by {stopped} before training started; {self.plan.run_dir} holds no checkpoint "
                  "of this run", file=sys.stderr)  # fmt: skip
            return exit_status(getattr(signal, stopped))
        with self._signals(), self._thread_errors():
            try:
                self._open()
                self._loop()
                return self._end()
            except Exception as error:  # XLA's own (many lines), or the user's code (a host callback) failing
                own = isinstance(error, OWN_ERRORS)
                called_back = None if own else callback_fault(error)
                xla = isinstance(error, jax.errors.JaxRuntimeError)  # XLA's own, or a callback's it carries
                user = called_back or (raised(error) if not (own or xla) and user_frame(error) else None)
                if user is not None:  # the user's code: it fails so again from there
                    where = " in a host callback" if called_back else ""
                    during = self._in_flight(getattr(error, FAULT_ITERATIONS, None))
                    raise RunError(f"code of yours {user}{where} during {during}; {self._kept(again=False)}") from None
                if not isinstance(error, jax.errors.JaxRuntimeError):
                    raise
                line = (str(error).splitlines() or [type(error).__name__])[0]
                again = not line.startswith(DETERMINISTIC)
                raise RunError(f"{line}; {self._kept(again)}") from None
            except KeyboardInterrupt:
                raise RunError(
                    f"interrupted twice, stopped at once; continue from {self.last_checkpoint} with: "
                    f"ppo-eqx train --resume {self.plan.run_dir}"
                    if self.last_checkpoint
                    else "interrupted twice, stopped at once before the first checkpoint"
                ) from None
            finally:
                self._close()

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.stop) for sig in SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def _thread_errors(self) -> Iterator[None]:
        """A writer's background thread that fails (TensorBoard on a full disk) is recorded, not printed: the
        loop stops with one line (``_check_threads``)."""
        previous = threading.excepthook
        threading.excepthook = lambda hook: self.thread_errors.append(hook.exc_value or RuntimeError("thread"))
        try:
            yield
        finally:
            threading.excepthook = previous

    def _open(self) -> None:
        plan, config = self.plan, self.config
        if self.directory is not None:
            names = config.agent_names()
            self.agents = [self.directory] if len(names) == 1 else [self.directory.child(name) for name in names]
        if plan.resume is not None:
            kept = 0
            for agent, agent_dir in zip(self.agents, plan.agent_dirs, strict=False):
                rows = checked_metrics(agent_dir / METRICS, plan.start_iteration)
                agent.write(METRICS, "".join(rows).encode())
                agent.delete(SUMMARY)
                kept = len(rows)
            self.say(f"ppo-eqx: resuming {plan.run_dir} from {plan.resume.path.name} ({kept} rows of metrics kept)")
        devices = "" if self.mesh is None else f" ({self.mesh.size} devices, {jax.process_count()} processes)"
        hardware = self.hardware
        self.say(
            f"ppo-eqx: {config.env_id}, {config.num_iterations} iterations of {config.batch_size} steps"
            f"{_agents(config)}, "
            f"run directory {plan.run_dir}, jax {jax.__version__} on {jax.default_backend()}{devices}, "
            f"{where_it_ran(hardware)}"
        )
        note = auto_note(config.conv_impl, self.conv_impl, plan.spec)  # type: ignore[arg-type]
        if note is not None:
            self.say(f"ppo-eqx: note: {note}")
        if self.writes:
            options = self.options
            self.writers = Writers.open(
                self.agents,
                config.agent_configs(),
                hardware,
                tensorboard=options.tensorboard,
                resume_step=None if plan.resume is None else plan.start_iteration * config.batch_size,
                wandb=WandbRun(options.wandb_project_name, options.wandb_entity) if options.track else None,
            )
        STARTUP.lap("writers")
        self._trainer = Trainer(
            config,
            restore=self.restore,
            placement=self.placement,
            env_backend=plan.backend,
            conv_impl=self.conv_impl,
            spec=plan.spec,
            loss=plan.loss,
            model=plan.model,
            optimizer=plan.optimizer,
        )
        STARTUP.lap("trainer")
        per_dispatch = config.iterations_per_dispatch
        program = "one iteration" if per_dispatch == 1 else f"a program of up to {per_dispatch} iterations"
        compile_s = self.trainer.compile()
        STARTUP.lap("compile")
        self.say(f"ppo-eqx: compiled {program} in {compile_s:.1f} s")
        self.say(f"ppo-eqx: {STARTUP.line()}")

    def _loop(self) -> None:
        progress, writes = self.options.progress, self.writes
        self._progress = Progress(
            self.config, self.plan.start_iteration, bar=progress and writes, lines=not progress and writes
        )
        try:
            loop = run_agents(
                self.trainer,
                pause=self._pause,
                hold=self._boundary,
                time_offset=self.time_offset,
                after_program=self._flush,
            )
            for records in loop:
                self._write(records)
                iteration = int(records[0]["iteration"])
                self._save_if_due(iteration)
                if self._stops_after(iteration):
                    break
            self._flush()
        except NonFiniteError as error:
            self._write(error.records, show=False)
            self._flush()
            # Resuming would compute the same NaN again: the way on is another setting, so no "--resume" here.
            kept = f"the last good checkpoint is {self.last_checkpoint}" if self.last_checkpoint else self._kept()
            raise FloatingPointError(f"{error}; {kept}") from None
        finally:
            self._progress.close()

    def _write(self, records: list[dict[str, Any]], *, show: bool = True) -> None:
        """An iteration's records, held by the writers until ``_flush``, and shown then."""
        self.records = records
        if self.directory is not None and not self.directory.in_place():  # moved, or its link repointed
            self.stop.signal = self.stop.signal or MOVED
        self.writers.write(records)
        if show and self._progress is not None:
            self._progress.hold(records)
        self._check_threads()

    def _flush(self) -> None:
        """The rows the writers hold, written, then their lines shown (a line shown is a row written): after each
        program's records, before a checkpoint, at the end."""
        try:
            self.writers.flush()
        except OSError as error:
            iteration = self.records[0]["iteration"] if self.records else self.plan.start_iteration
            raise RunError(
                f"could not write the metrics of iteration {iteration}: {error.strerror or error}; {self._kept()}"
            ) from None
        if self._progress is not None:
            self._progress.show()

    def _check_threads(self) -> None:
        if self.thread_errors:
            error = self.thread_errors[0]
            reason = getattr(error, "strerror", None) or (str(error).splitlines() or [type(error).__name__])[0]
            raise RunError(f"a writer of {self.plan.run_dir} failed: {reason}; {self._kept()}")

    def _in_flight(self, program: tuple[int, int] | None = None) -> str:
        """The iterations a fault met in a program may be of: ``program``'s where the loop named the program it came
        from (``run_agents``, reading its metrics), else after the last whose metrics were read up to the last
        dispatched (a program runs several)."""
        if program is not None:
            first, last = program
        else:
            first = int(self.records[0]["iteration"]) + 1 if self.records else self.plan.start_iteration + 1
            last = max(first, self._trainer.iteration if self._trainer is not None else first)
        return f"iteration {first}" if last == first else f"iterations {first} .. {last}"

    def _kept(self, again: bool = True) -> str:
        """What a fault leaves, and how to go on from it: ``--resume`` from the last checkpoint, or, where none was
        written, the same command again (nothing was trained; where ``again``: a fault that may not come back) or
        ``--overwrite`` (metrics without a checkpoint)."""
        run_dir = self.plan.run_dir
        if self.last_checkpoint:
            resume = f"ppo-eqx train --resume {run_dir}"
            how = f"continue with: {resume}" if again else f"{resume} meets this fault again on this machine"
            return f"the last checkpoint {self.last_checkpoint} is intact; {how}"
        if not self.writes or never_trained(run_dir):
            if not again:
                return "no checkpoint was written and nothing was kept; the same command fails the same way here"
            return "no checkpoint was written and nothing was kept: run the same command again"
        return f"no checkpoint was written: start the run afresh with --overwrite (its metrics in {run_dir} go with it)"

    def _boundary(self, iteration: int) -> bool:
        config = self.config
        return is_boundary(iteration, checkpoint_every=config.checkpoint_every, num_iterations=config.num_iterations)

    def _pause(self, iteration: int) -> bool:
        """Whether the loop must leave the state of ``iteration`` in place (not dispatch the next one): a stop was
        requested, and its checkpoint follows. A segment's end needs only a copy (``run_agents``'s ``hold``: the
        boundary's checkpoint is then written while the next program runs). With several processes the stop request
        is agreed on here, by all of them."""
        if self.mesh is not None and any_process(self.stop.signal is not None):  # all processes stop together
            self.stop.signal = self.stop.signal or "stop"
        return self.stop.signal is not None

    def _state_is_of(self, iteration: int) -> bool:
        """Whether the trainer's checkpoint is that of ``iteration`` (its state, or the copy it holds; not a program's
        dispatched after it): a stop requested while the next iteration was under way waits for that one's records."""
        return self.trainer.state_iteration == iteration

    def _save_if_due(self, iteration: int) -> None:
        """A checkpoint at segment boundaries, at the end, and on a stop request (``schedule``)."""
        config, current = self.config, self._state_is_of(iteration)
        reason = checkpoint_reason(
            iteration,
            checkpoint_every=config.checkpoint_every,
            num_iterations=config.num_iterations,
            stop=self.stop.signal,
            current=current,
        )
        if reason is not None:
            self._save(iteration, reason)

    def _stops_after(self, iteration: int) -> bool:
        return stops_after(stop=self.stop.signal, current=self._state_is_of(iteration))

    def _save(self, iteration: int, reason: str) -> None:
        self._flush()  # the rows up to the checkpoint first: a resumed run starts after them
        checkpoint = self.trainer.checkpoint()  # collective: every process takes part
        if self.directory is None:
            return
        elapsed = self.records[0]["time_elapsed"]
        try:
            self.last_checkpoint = save_checkpoint(
                self.directory,
                checkpoint,
                self.config,
                self.trainer.spec,
                keep=self.options.keep_checkpoints,
                extra={"reason": reason, "time_elapsed": elapsed, "keep_checkpoints": self.options.keep_checkpoints},
            )
        except (OSError, RunDirError) as error:
            why = getattr(error, "strerror", None) or str(error)
            raise RunError(
                f"could not write the checkpoint of iteration {iteration} in {self.plan.run_dir}: {why}; "
                f"{self._kept().replace('last', 'previous')}"
            ) from None
        if self.stop.signal == MOVED:  # where the directory is now: the checkpoint is there
            self.last_checkpoint = Path(self.directory.where()) / self.last_checkpoint.relative_to(self.plan.run_dir)

    def _end(self) -> int:
        records, config = self.records, self.config
        if self.stop.signal == MOVED and self.directory is not None:
            iteration = records[0]["iteration"] if records else self.plan.start_iteration
            raise RunError(
                f"{self.plan.run_dir} no longer leads to this run's directory (moved, or its link repointed, while it "
                f"trained); stopped after iteration {iteration} with checkpoint {self.last_checkpoint}; continue "
                f"with: ppo-eqx train --resume {self.directory.where()}"
            )
        if self.stop.signal:
            if self.writes:
                iteration = records[0]["iteration"] if records else self.plan.start_iteration
                say(
                    f"ppo-eqx: stopped by {self.stop.signal} after iteration {iteration}; checkpoint "
                    f"{self.last_checkpoint}; continue with: ppo-eqx train --resume {self.plan.run_dir}",
                    stream=sys.stderr,
                )
            return exit_status(getattr(signal, self.stop.signal, signal.SIGTERM))
        try:
            self.writers.close()  # the last events written: their errors are raised now
        except OSError as error:
            raise RunError(
                f"could not write the last events in {self.plan.run_dir}: {error.strerror or error}; {self._kept()}"
            ) from None
        self._check_threads()
        self.writers.finish(records)
        record = records[0]
        self.say(
            f"ppo-eqx: done, {record['global_step']} steps{_agents(config)} in {record['time_elapsed']:.0f} s, "
            f"episodic_return {mean_return(records):.2f}"
        )
        return 0

    def _close(self) -> None:
        if self._trainer is not None:
            self._trainer.close()
        self.writers.close_quietly()
        for agent in self.agents:
            if agent is not self.directory:
                agent.close()


OWN_ERRORS = (ConfigError, RunDirError, RunError, UsageError, NonFiniteError)
"""ppo_eqx's own errors, each one line already: never the user's code's, wherever they pass."""


def _agents(config: PPOConfig) -> str:
    """`` x 2 seeds``, `` x 4 settings x 2 seeds``, or nothing for one agent."""
    settings = f" x {len(config.settings)} settings" if config.sweep else ""
    seeds = f" x {config.num_seeds} seeds" if config.num_seeds > 1 else ""
    return settings + seeds
