"""What ``ppo-eqx train`` is asked to train: the checked ``Plan`` of a new run (``plan_new``) or of a resumed one
(``plan_resume``), from the parsed flags. Nothing is written here."""

import argparse
import json
import os
import time
from pathlib import Path
from typing import NamedTuple

from ..config import PPOConfig, flag
from ..core.envs import backend
from ..errors import ConfigError, RunDirError, UsageError
from ..host.checkpoint import CheckpointFile, check_same_run, read_checkpoint
from ..host.ownership import has_run, never_trained, owned_agents, read_manifest, refuse_look_alikes
from ..host.rundir import CONFIG, METRICS, SEEDS_CONFIG, agent_dirs, check_new_run_dir, checked_metrics, holds_run


class Plan(NamedTuple):
    """A checked request to train: the config, where it is written, and what a resume starts from."""

    config: PPOConfig
    run_dir: Path
    resume: CheckpointFile | None = None
    """The newest checkpoint, read and checked, when resuming."""
    environment: dict[str, str | None] | None = None
    """The environment variables that change what it computes (``environment.RESULT_VARIABLES``), as set here."""

    @property
    def start_iteration(self) -> int:
        return 0 if self.resume is None else int(self.resume.metadata["iteration"])

    @property
    def agent_dirs(self) -> list[Path]:
        return agent_dirs(self.run_dir, self.config.agent_names())


def config_from_args(args: argparse.Namespace) -> PPOConfig:
    """Explicit flags, else the task's preset, else PPOConfig's (CleanRL's) defaults; validated."""
    values = {name: value for name, value in vars(args).items() if name in _TASK_FIELDS and value is not None}
    for name, _ in values.get("sweep", ()):
        if getattr(args, name, None) is not None:
            raise UsageError(f"{flag(name)} and --sweep {flag(name)[2:]}=... both set {name}; drop one")
    env_backend = backend(PPOConfig.env_backend if args.env_backend is None else args.env_backend)
    config = PPOConfig.for_task(PPOConfig.env_id if args.env_id is None else args.env_id, env_backend.name, **values)
    if config.rollout_on == "host" and env_backend.state_is_data:
        raise ConfigError(
            f"rollout_on='host' steps host envs (EnvPool, ALE) on the host's CPU, and {env_backend.name}'s envs run "
            "inside the program; allowed: rollout_on='device' or 'auto'"
        )
    if config.async_batch_size and not env_backend.has_async:
        raise ConfigError(
            f"async_batch_size={config.async_batch_size} is not possible with --env-backend {env_backend.name}; "
            "allowed: 0"
        )
    return config


_CONFIG_FIELDS = frozenset(PPOConfig.__dataclass_fields__)
_TASK_FIELDS = _CONFIG_FIELDS - {"env_id", "env_backend"}


def plan_new(args: argparse.Namespace) -> Plan:
    """The checked plan of a new run: its config and env (nothing is written; the run directory is checked by
    the process that writes it, ``check_run_dirs``)."""
    config = config_from_args(args)
    if args.track and config.num_agents > 1:
        raise UsageError(f"--track logs one run; drop it or --num-seeds {config.num_seeds} and --sweep")
    run_dir = args.run_dir or Path("runs") / f"{config.env_id}__{config.seed}__{int(time.time())}"
    return Plan(config, run_dir)


def check_run_dirs(plan: Plan, overwrite: bool) -> None:
    """Every directory a new run writes may be written (nothing is written or created here): not an agent's
    directory of another run; nothing in it named as a run's files that a run of ppo-eqx there did not write
    (``look_alikes``); a run there only with ``overwrite`` (or one that never trained: a plain retry); and with
    ``overwrite`` no agent's directory holding a run that the old run did not write (``--overwrite`` deletes only
    the old run's)."""
    run_dir = plan.run_dir
    check_new_run_dir(run_dir, overwrite)
    for parent in run_dir.absolute().parents:
        if holds_run(parent) and any(run_dir.absolute().is_relative_to(a) for a in owned_agents(parent)):
            raise RunDirError(f"--run-dir {run_dir} is an agent's directory of the run in {parent}; allowed: a path "
                              "of its own")  # fmt: skip
    refuse_look_alikes(run_dir, run_dir)
    if has_run(run_dir) and not overwrite and not never_trained(run_dir):
        raise RunDirError(
            f"--run-dir {run_dir} already holds a run; pass --overwrite to replace it "
            f"or --resume {run_dir} to continue it"
        )
    owned = owned_agents(run_dir) if overwrite else set()
    for agent_dir in plan.agent_dirs if plan.config.num_agents > 1 else []:
        if overwrite and agent_dir not in owned and holds_run(agent_dir):
            raise RunDirError(
                f"{agent_dir} holds a run that the run in {run_dir} did not write, and --overwrite keeps it; move "
                "it, or pick another --run-dir"
            )
        check_new_run_dir(agent_dir, overwrite)
        refuse_look_alikes(run_dir, agent_dir)


def plan_resume(args: argparse.Namespace) -> Plan:
    """The checked plan of ``--resume RUN_DIR``: its config and newest checkpoint, read whole and checked (its
    arrays are loaded once the devices are known)."""
    run_dir: Path = args.resume
    given = [flag(name) for name in sorted(_CONFIG_FIELDS) if getattr(args, name) is not None]
    if given:
        raise UsageError(
            f"--resume continues the run with its own config ({run_dir / CONFIG}); drop {', '.join(given)}"
        )
    if args.overwrite:
        raise UsageError("--resume and --overwrite contradict each other; pick one")
    if args.run_dir is not None and args.run_dir != run_dir:
        raise UsageError("--resume RUN_DIR is the run directory; drop --run-dir")
    if not run_dir.is_dir():
        raise UsageError(f"--resume {run_dir}: no such run directory")
    read_manifest(run_dir)  # a damaged manifest is refused before the run is taken, as --overwrite refuses it
    config = _saved_config(run_dir)
    backend(config.env_backend).spec(config.env_id)
    if args.track and config.num_agents > 1:
        raise UsageError(f"--track logs one run; {run_dir} trains {config.num_agents} agents")
    newest = read_checkpoint(run_dir)
    check_same_run(newest, config)
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RunDirError(f"--resume {run_dir} is not writable")
    plan = Plan(config, run_dir, newest)
    for agent_dir in plan.agent_dirs:  # a damaged history is refused before anything is written
        checked_metrics(agent_dir / METRICS, plan.start_iteration)
    return plan


def _saved_config(run_dir: Path) -> PPOConfig:
    config_path = run_dir / CONFIG
    if not config_path.exists() and (run_dir / SEEDS_CONFIG).exists():
        config_path = run_dir / SEEDS_CONFIG
    try:
        saved = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--resume {run_dir}: no run there ({config_path} is missing)") from None
    except (OSError, ValueError) as error:
        raise UsageError(f"--resume {run_dir}: cannot read {config_path}: {error}") from None
    if not isinstance(saved, dict):
        raise UsageError(f"--resume {run_dir}: {config_path} is not a config")
    try:
        return PPOConfig.from_dict(saved)
    except ValueError as error:
        raise UsageError(f"--resume {run_dir}: {config_path}: {error}") from None
