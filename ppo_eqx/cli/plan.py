"""What ``ppo-eqx train`` is asked to train: the checked ``Plan`` of a new run (``plan_new``) or of a resumed one
(``plan_resume``), from the parsed flags. Nothing is written here."""

import argparse
import time
from pathlib import Path
from typing import Any, NamedTuple

from ..config import PPOConfig, flag
from ..core.envs import EnvBackend, EnvSpec
from ..core.envs.normalize import check_normalizable
from ..core.networks import ConvRoute
from ..core.state import ModelFactory
from ..core.update import Loss, OptimizerFactory, make_optimizer, model_loss
from ..errors import ConfigError, UsageError
from ..host.checkpoint import CheckpointFile
from ..host.named import backend_and_spec, user_code
from ..host.placement import Placement, check_rollout_place
from ..host.resume import read_run
from ..host.run_dir import CONFIG, agent_dirs


class Plan(NamedTuple):
    """A checked request to train, resolved once at the edge and carried: the config, where it is written, what a
    resume starts from, the env backend and its spec, the environment it computes under, the loss, and (once the
    devices are known) the convolutions' route, the placement and the hardware record."""

    config: PPOConfig
    run_dir: Path
    backend: EnvBackend
    spec: EnvSpec
    environment: dict[str, str | None]
    """The environment variables that change what it computes (``environment.RESULT_VARIABLES``), as set here."""
    resume: CheckpointFile | None = None
    """The newest checkpoint, read and checked, when resuming."""
    route: ConvRoute | None = None
    """How the convolutions are computed here (``devices.conv_route``), once the devices are joined."""
    loss: Loss = model_loss
    """The loss the update descends (``config.loss``, imported at the edge: ``host.named.loss_named``)."""
    model: ModelFactory | None = None
    """A model factory of the user's (``config.network``'s ``MODULE:CALLABLE``, imported and checked at the edge:
    ``host.named``); None: the Trainer makes ppo_eqx's own by name once the convolutions' route is known."""
    optimizer: OptimizerFactory = make_optimizer
    """The optimizer factory (``config.optimizer``'s, imported and checked at the edge)."""
    placement: Placement | None = None
    """Where the iteration runs (one device, the host's rollout beside the device's learning, or a mesh), once the
    devices are joined."""
    hardware: dict[str, Any] | None = None
    """What ``hardware.json`` records of the machine, the environment and the placement, once they are known."""

    @property
    def start_iteration(self) -> int:
        return 0 if self.resume is None else int(self.resume.metadata["iteration"])

    @property
    def nothing_to_resume(self) -> str | None:
        """What ``ppo-eqx train`` says of a run to resume that has trained all its iterations; None otherwise."""
        if self.start_iteration < self.config.num_iterations:
            return None
        return f"ppo-eqx: {self.run_dir} finished at iteration {self.start_iteration}; nothing to resume"

    @property
    def agent_dirs(self) -> list[Path]:
        return agent_dirs(self.run_dir, self.config.agent_names())


def config_from_args(args: argparse.Namespace) -> tuple[PPOConfig, EnvBackend, EnvSpec]:
    """Explicit flags, else the task's preset, else PPOConfig's (CleanRL's) defaults; validated, with the env backend
    and the env's spec it was resolved with (``PPOConfig.task``)."""
    values = {name: value for name, value in vars(args).items() if name in _TASK_FIELDS and value is not None}
    for name, _ in values.get("sweep", ()):
        if getattr(args, name, None) is not None:
            raise UsageError(f"{flag(name)} and --sweep {flag(name)[2:]}=... both set {name}; drop one")
    env_id = PPOConfig.env_id if args.env_id is None else args.env_id
    config, env_backend, spec = PPOConfig.task(env_id, args.env_backend, **values)  # None: by the id (for_task)
    if config.async_batch_size and not env_backend.has_async:
        raise ConfigError(
            f"async_batch_size={config.async_batch_size} is not possible with --env-backend {env_backend.name}; "
            "allowed: 0"
        )
    return config, env_backend, spec


_CONFIG_FIELDS = frozenset(PPOConfig.__dataclass_fields__)
_TASK_FIELDS = _CONFIG_FIELDS - {"env_id", "env_backend"}


def plan_new(args: argparse.Namespace, environment: dict[str, str | None]) -> Plan:
    """The checked plan of a new run: its config and env (nothing is written; the run directory is checked by
    the process that writes it, ``host.run_dir.take.check_run_dirs``)."""
    config, chosen, spec = config_from_args(args)
    if args.track and config.num_agents > 1:
        raise UsageError(f"--track logs one run; drop it or --num-seeds {config.num_seeds} and --sweep")
    run_dir = args.run_dir or Path("runs") / f"{config.env_id}__{config.seed}__{int(time.time())}"
    check_normalizable(config.normalize_obs, config.normalize_reward, spec, config.async_batch_size)
    check_rollout_place(config, chosen, spec)
    return Plan(config, run_dir, chosen, spec, environment, **user_code(config, spec))


def plan_resume(args: argparse.Namespace, environment: dict[str, str | None]) -> Plan:
    """The checked plan of ``--resume RUN_DIR`` in this process's ``environment``: its config and newest
    checkpoint, read whole and checked (``host.resume.read_run``; its arrays are loaded once the devices are
    known)."""
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
    config, newest = read_run(run_dir, "--resume", environment)
    if args.track and config.num_agents > 1:
        raise UsageError(f"--track logs one run; {run_dir} trains {config.num_agents} agents")
    chosen, spec = backend_and_spec(config.env_backend, config.env_id, config.seed)
    return Plan(config, run_dir, chosen, spec, environment, newest, **user_code(config, spec))
