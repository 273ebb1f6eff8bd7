"""PPOConfig: every setting of a run, with CleanRL's names and defaults, validated in one place.

Its first fields are the hyperparameters that the agents of one program may differ in (``Hyperparameters``, in
``settings.py``; their array face is in ``hyperparameters.py``); the rest set sizes, envs and the run. No jax here:
the command line derives its flags from these fields before it imports jax.
Each field's metadata holds its one line of help (from which the command line derives its flag) and what it
allows besides its type (a range or choices).
"""

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast, get_args, no_type_check

from .errors import ConfigError, show_value
from .presets import PRESET_HELP, PRESETS, auto_rollout_help, preset_for
from .settings import ENV_BACKENDS, FieldRange, Hyperparameters, Sizes, config_field, is_import_path
from .sweeps import normal_sweep, setting_label
from .validation import check_field, check_sweep

if TYPE_CHECKING:  # the array face imports jax: config.py stays jax-free for the command line's parser
    from .core.envs import EnvBackend, EnvSpec
    from .core.hyperparameters import AgentHyperparameters

ConvImpl = Literal["auto", "kernel", "matmul", "xla"]
"""How convolutions are computed: a route (``core.networks.ConvRoute``) or "auto", resolved at the edge
(``host.kernel_build.resolve_conv_impl``)."""
CONV_IMPLS: tuple[str, ...] = get_args(ConvImpl)
ROLLOUT_PLACES = ("auto", "device", "host", "host-envs")
"""Where the rollout is compiled (``rollout_on``): resolved at the edge (``host.placement.rollout_place``)."""
NETWORK_INITS = ("cleanrl", "gymnax-blines")
"""How a model's layers may start (``core.networks.NetworkInit``, the same names, says what each means)."""
LOSSES = ("cleanrl", "cleanrl-torch")
"""The losses a config names (``host.named.loss_named``); ``MODULE:ATTRIBUTE`` names a ``Loss`` of the user's."""
NETWORKS = ("feedforward", "lstm")
"""The models a config names (``host.named.network_named``); ``MODULE:CALLABLE`` names a factory of the user's."""
OPTIMIZERS = ("cleanrl",)
"""The optimizers a config names (``host.named.optimizer_named``); ``MODULE:CALLABLE`` names a factory of the
user's."""

INT32_MAX = 2**31 - 1
"""The largest count or seed: EnvPool takes int32 seeds, and JAX counts in int32."""
POSITIVE = FieldRange(1, INT32_MAX, "a positive integer")
MAX_AGENTS = 4096
"""The most agents (settings x seeds) one program trains. Each has its own directory and its own model and Adam
state in memory (about 0.1 MB for CartPole's MLP, 20 MB for the Nature CNN: 4096 Atari agents need 80 GB), and
its own slice of one compiled program; a larger sweep is several runs (bench/atari57.py runs many)."""
AGENT_PREFIX = "seed"
"""An agent's name in a run of several ends in ``seedK`` (``agent_names``), as its directory does."""


# PPOConfig takes values from users and files and checks them itself, in validate(); the test run's type checker
# (jaxtyping's import hook) must not check __init__ first and raise a TypeError that users never see. Static
# checkers still read the annotations; typing.get_type_hints(PPOConfig) is {}, dataclasses.fields(...).type is not.
@no_type_check
@dataclasses.dataclass(frozen=True)
class PPOConfig(Hyperparameters):
    """The settings of ``ppo_atari_envpool_xla_jax.py`` (CleanRL), same names and defaults, and ppo_eqx's own.

    The fields before ``env_id`` are ``Hyperparameters``; each field's help says whose it is, CleanRL's or
    ppo_eqx's own.
    ``checkpoint_every`` is part of the trajectory: every ``checkpoint_every`` iterations the envs are made
    afresh, seeded from (seed, iteration), so that a run resumed from a checkpoint sees the same envs as an
    uninterrupted one. ``num_seeds`` and ``sweep`` make several agents (``agent_configs``), trained in one
    program. The others change speed, not results (``async_batch_size`` changes both: docs/design.md).
    """

    env_id: str = config_field(
        "Breakout-v5",
        "the task, as its env backend names it: EnvPool's or ALE's Atari games (Breakout-v5, ...) and EnvPool's "
        "CartPole-v1 and others; gymnax's CartPole-v1, Acrobot-v1 and MinAtar games (Breakout-MinAtar, ...); or "
        "MODULE:CALLABLE, a function of yours that returns an env with gymnax's interface (CleanRL's)",
    )
    total_timesteps: int = config_field(
        10_000_000, "environment steps of each agent over the whole run (CleanRL's)", within=POSITIVE
    )
    num_envs: int = config_field(8, "environments stepped in parallel (CleanRL's)", within=POSITIVE)
    num_steps: int = config_field(128, "steps of each env per rollout (CleanRL's)", within=POSITIVE)
    num_minibatches: int = config_field(
        4, "minibatches that each epoch splits the batch into (CleanRL's)", within=POSITIVE
    )
    update_epochs: int = config_field(4, "epochs of updates per batch (CleanRL's)", within=POSITIVE)
    # EnvPool takes seeds in int32 (it asserts so); negative ones it takes too, but CleanRL's script does not
    # (np.random.seed refuses them), so a seed is one that both can run.
    seed: int = config_field(
        1,
        "seed of the model, the actions and the envs (env i: seed + i) (CleanRL's)",
        within=FieldRange(0, INT32_MAX, "a 32-bit seed >= 0 (the env backend takes int32 seeds)"),
    )
    conv_impl: str = config_field(
        "auto",
        "how convolutions are computed, each giving the same numbers within float32 rounding: xla (XLA's own, "
        "as CleanRL), matmul (space-to-depth and matrix products, fast on CPU), kernel (ppo_eqx's C++ CPU kernels "
        "for all three layers, AVX2 with FMA or AVX-512; built by `ppo-eqx build-kernel`, or here if need be), or "
        "auto (xla off the CPU; on it kernel where it is built, else matmul) (ppo_eqx's own)",
        choices=CONV_IMPLS,
    )
    minibatch_unroll: int = config_field(
        1, "unroll of the scan over minibatch steps; larger compiles slower (ppo_eqx's own)", within=POSITIVE
    )
    checkpoint_every: int = config_field(
        200,
        "iterations between checkpoints, where a host backend's envs (EnvPool, ALE) are made afresh, seeded from "
        "(seed, iteration); envs written in JAX go on (ppo_eqx's own)",
        within=POSITIVE,
    )
    num_seeds: int = config_field(
        1, "independent agents trained at once, seeds seed .. seed+num_seeds-1 (ppo_eqx's own)", within=POSITIVE
    )
    async_batch_size: int = config_field(
        0,
        "0: every env steps at once; R > 0: EnvPool's async mode, R envs a step (ppo_eqx's own)",
        within=FieldRange(0, INT32_MAX, "0 (off) or a positive integer"),
    )
    env_backend: str = config_field(
        "envpool",
        "the library that runs the envs: envpool, ale (pip install 'ppo_eqx[ale]'), gymnax, whose envs run inside "
        "the compiled program (pip install 'ppo_eqx[gymnax]'), jax (an env of yours with gymnax's interface: the "
        "default for an --env-id MODULE:CALLABLE), or MODULE:ATTRIBUTE, a backend object of yours (ppo_eqx's own)",
        choices=ENV_BACKENDS,
    )
    bootstrap_truncated: bool = config_field(
        False,
        "bootstrap an episode that a time limit ended from the value of its final observation; off: treat it as "
        "terminal, as CleanRL does (ppo_eqx's own)",
    )
    network_init: str = config_field(
        "cleanrl",
        "how the network's layers start: cleanrl (orthogonal, CleanRL's gains, zero biases) or gymnax-blines "
        "(flax's LeCun normal kernels, biases uniform in [0, 0.05), as gymnax-blines' agents) (ppo_eqx's own)",
        choices=NETWORK_INITS,
    )
    rollout_on: str = config_field(
        "auto",
        "where the rollout (the env step and the policy's forward pass) is compiled: device (the whole iteration "
        "one program on the default device, as CleanRL), host (the rollout on the host's CPU, the update on the "
        "default device: the batch moves once an iteration, the parameters back once), host-envs (EnvPool's envs "
        "stepped through its host API by a loop on the host, in two halves, one stepping while the policy acts for "
        "the other on the default device, as LeanRL and Sample Factory), or auto ("
        + auto_rollout_help()
        + ") (ppo_eqx's own)",
        choices=ROLLOUT_PLACES,
    )
    actor_threads: int = config_field(
        0,
        "host-envs' actor threads, each stepping its own share of the envs and acting on the device in turn; 0: "
        "chosen for the device (host.placement.default_actor_threads) (ppo_eqx's own)",
        within=FieldRange(0, 256, "0 (chosen for the device) or a count of threads"),
    )
    num_threads: int = config_field(
        0,
        "EnvPool's (and ALE's) threads stepping the envs; 0: one per env, at most the cores this process may use, "
        "which host-envs' actors share (ppo_eqx's own)",
        within=FieldRange(0, 4096, "0 (one per env, at most the cores) or a count of threads"),
    )
    thread_affinity_offset: int = config_field(
        -1,
        "pin EnvPool's (and ALE's) env threads to the cores from this one on; -1: not pinned (ppo_eqx's own)",
        within=FieldRange(-1, 65535, "-1 (not pinned) or the first core's number"),
    )
    iterations_per_dispatch: int = config_field(
        1,
        "iterations run as one program before the host reads their metrics, at most: checkpoints, Ctrl-C and the "
        "NaN check act between programs; gymnax's presets run many (ppo_eqx's own)",
        within=POSITIVE,
    )
    loss: str = config_field(
        "cleanrl",
        "the loss each minibatch step descends: cleanrl (CleanRL's JAX scripts'), cleanrl-torch (its torch scripts': "
        "the advantages' sample standard deviation; the continuous preset's) or MODULE:ATTRIBUTE, a loss of yours with "
        "ppo_eqx.Loss's signature, whose reported values are logged beside CleanRL's (ppo_eqx's own)",
        choices=LOSSES,
    )
    network: str = config_field(
        "feedforward",
        "the model: feedforward (CleanRL's, by the observations: the Nature CNN, 64-64 tanh MLPs, gymnax-blines' "
        "256-256 ReLU on grids, a Gaussian policy of continuous actions), lstm (a recurrent policy, CleanRL's "
        "ppo_atari_lstm.py on frames) or MODULE:CALLABLE, a factory of yours (spec, key) -> ppo_eqx.Policy "
        "(ppo_eqx's own)",
        choices=NETWORKS,
    )
    optimizer: str = config_field(
        "cleanrl",
        "the optimizer: cleanrl (gradients clipped to max_grad_norm, then Adam, eps 1e-5, its learning rate annealed "
        "as anneal_lr says, CleanRL's) or MODULE:CALLABLE, a factory of yours (hyperparameters, sizes) -> "
        "optax.GradientTransformation (ppo_eqx's own)",
        choices=OPTIMIZERS,
    )
    preset: str = config_field("cleanrl", PRESET_HELP, choices=PRESETS)
    normalize_obs: bool = config_field(
        False,
        "normalise observations by their running mean and variance, clipped to +-10, inside the program, as "
        "CleanRL's continuous-control wrappers (on by default for continuous tasks) (ppo_eqx's own)",
    )
    normalize_reward: bool = config_field(
        False,
        "divide rewards by the running standard deviation of the discounted return, clipped to +-10, as CleanRL's "
        "continuous-control wrappers; episodic returns stay raw (on by default for continuous tasks) (ppo_eqx's own)",
    )
    sweep: tuple[tuple[str, tuple[Any, ...]], ...] | Mapping[str, Sequence[Any]] = config_field(
        (), "hyperparameters that take several values, one agent per setting (ppo_eqx's own)"
    )

    def __post_init__(self) -> None:
        # ``sweep`` is kept as ((name, (value, ...)), ...); a mapping of name to values is taken too.
        object.__setattr__(self, "sweep", normal_sweep(self.sweep))

    @property
    def batch_size(self) -> int:
        """Transitions per iteration: ``num_envs * num_steps``, or ``async_batch_size * num_steps`` when async."""
        return (self.async_batch_size or self.num_envs) * self.num_steps

    @property
    def _batch_formula(self) -> str:
        return "async_batch_size*num_steps" if self.async_batch_size else "num_envs*num_steps"

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_iterations(self) -> int:
        return self.total_timesteps // self.batch_size

    @property
    def settings(self) -> list[dict[str, Any]]:
        """The grid of the swept values, the last name's varying fastest; ``[{}]`` without a sweep."""
        names = [name for name, _ in self.sweep]
        return [dict(zip(names, values, strict=True)) for values in itertools.product(*(v for _, v in self.sweep))]

    @property
    def num_agents(self) -> int:
        """Agents trained at once: one per setting and seed (``agents_of``)."""
        return agents_of(cast(SweepPairs, self.sweep), self.num_seeds)  # __post_init__ made it the pairs

    def agent_configs(self) -> list["PPOConfig"]:
        """The single-agent config of each of the ``num_agents`` agents, setting by setting, and within each the
        seeds ``seed``, ``seed + 1``, ..."""
        return [
            self.replace(**setting, seed=self.seed + s, num_seeds=1, sweep=())
            for setting in self.settings
            for s in range(self.num_seeds)
        ]

    def agent_names(self) -> list[str]:
        """A name for each agent, unique in the run: ``seedK``, under a sweep ``SETTING/seedK`` with the setting
        written as its flags, ``learning-rate=0.001,norm-adv=false``."""
        return [
            "/".join([*([setting_label(setting)] if self.sweep else []), f"{AGENT_PREFIX}{self.seed + s}"])
            for setting in self.settings
            for s in range(self.num_seeds)
        ]

    @property
    def sizes(self) -> Sizes:
        """What sets the iteration's shapes and loop lengths, static under jit."""
        return Sizes(
            self.num_agents,
            self.num_steps,
            self.num_minibatches,
            self.update_epochs,
            self.num_iterations,
            self.minibatch_unroll,
            self.iterations_per_dispatch,
        )

    def agent_hyperparameters(self) -> "AgentHyperparameters":
        """The agents' ``Hyperparameters`` as arrays: shared ones scalars, swept ones ``[num_agents]``."""
        from .core.hyperparameters import AgentHyperparameters

        return AgentHyperparameters.of(self.agent_configs())

    def replace(self, **changes: Any) -> "PPOConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values; ``sweep`` as a mapping of name to the list of its values."""
        values = dataclasses.asdict(self)
        values["sweep"] = {name: list(sweep_values) for name, sweep_values in self.sweep}
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "PPOConfig":
        """The validated config of ``values`` (as ``to_dict`` gives), fields left out taking their defaults."""
        if not isinstance(values, Mapping):
            raise ConfigError(
                f"config={show_value(values)} is not a mapping of fields; allowed: a dict of field: value"
            )
        names = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(show_value(name) for name in values if name not in names)
        if unknown:
            raise ConfigError(f"unknown config field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
        try:
            config = cls(**values)
        except TypeError as error:  # unreachable for a Mapping of known names, kept so that none escapes
            shown = show_value(values)
            raise ConfigError(f"config={shown} is not a set of fields ({error}); allowed: a dict") from error
        return config.validate()

    @classmethod
    def for_task(cls, env: Any, env_backend: str | None = None, **values: Any) -> "PPOConfig":
        """The validated config that ``ppo-eqx train --env-backend ENV_BACKEND --env-id ENV_ID`` trains with
        ``values`` as its flags: ``values`` over the task's preset (``preset_for``) over the defaults.

        ``env`` is an env id (``env_backend`` defaults to "jax" for ``MODULE:CALLABLE``, else "envpool"), or an env
        object with gymnax's interface (``core.envs.jax_env``; its ``JaxEnv``): then ``env_backend`` is "jax" and
        ``env_id`` the env's name, and the object is passed again to ``Trainer(config, env=env)`` and ``evaluate``.
        Imports jax and the backend (the backend says the task's kind of observation).
        """
        return cls.task(env, env_backend, **values)[0]

    @classmethod
    def task(cls, env: Any, env_backend: str | None = None, **values: Any) -> "tuple[PPOConfig, EnvBackend, EnvSpec]":
        """``for_task``'s config, with the env backend and the env's spec that it was resolved with (each looked up
        once: the command line's plan carries them)."""
        from .core.envs.jax_env import as_jax_env
        from .host.named import backend_and_spec  # jax: the command line's parsing starts without it

        if isinstance(env, str):
            env_id = env
            if env_backend is None:
                env_backend = "jax" if is_import_path(env) else "envpool"
            task = {"env_id": env_id, "env_backend": env_backend}
            cls.from_dict(task)  # names checked before the backend reads them
            chosen, spec = backend_and_spec(env_backend, env_id, values.get("seed", cls.seed))
        else:
            if env_backend not in (None, "jax"):
                raise ConfigError(f"env_backend={env_backend!r} with an env object; allowed: None or 'jax'")
            chosen = as_jax_env(env)
            task = {"env_id": chosen.env_id, "env_backend": "jax"}
            spec = chosen.spec(chosen.env_id)
        preset = preset_for(
            spec.kind,
            state_is_data=chosen.state_is_data,
            continuous=spec.continuous,
            network=values.get("network", "feedforward"),
            preset=values.get("preset", "cleanrl"),
        )
        return cls.from_dict({**preset, **values, **task}), chosen, spec

    def validate(self) -> "PPOConfig":
        """Return self, or raise ConfigError naming the first impossible setting, its value and what is allowed.

        Every field is checked by its declared type and its range in ``FIELD_RANGES`` (bools are bools, ints
        are ints within int32, floats are finite float32 numbers, strings are not empty) before the settings
        are checked against each other, so that no value of any type raises anything but ConfigError.
        """
        fields = {field.name: field for field in dataclasses.fields(self)}
        for name, field in fields.items():
            if name != "sweep":
                check_field(field, getattr(self, name))
        check_sweep(self.sweep, fields)
        if self.num_agents > MAX_AGENTS:  # before anything is computed per agent
            settings = f"{math.prod(len(values) for _, values in self.sweep)} settings x " if self.sweep else ""
            raise ConfigError(
                f"num_agents={self.num_agents} ({settings}{self.num_seeds} seeds) is more than one program trains; "
                f"allowed: at most {MAX_AGENTS} (MAX_AGENTS); run a larger sweep as several runs"
            )
        self._validate_sizes()
        self._validate_async()
        normalized = [name for name in ("normalize_obs", "normalize_reward") if getattr(self, name)]
        if normalized and (self.env_backend == "ale" or self.async_batch_size):
            raise ConfigError(
                f"{normalized[0]}=True needs a pool stepped at once by envpool, gymnax or jax, not env_backend="
                f"{self.env_backend!r} with async_batch_size={self.async_batch_size}; allowed: {normalized[0]}=False"
            )
        if self.network == "lstm" and (self.num_envs % self.num_minibatches or self.bootstrap_truncated):
            raise ConfigError(
                f"network='lstm' learns from whole env sequences: num_minibatches={self.num_minibatches} must divide "
                f"num_envs={self.num_envs}, and bootstrap_truncated={self.bootstrap_truncated} be False; allowed: a "
                f"divisor of {self.num_envs}, bootstrap_truncated=False"
            )
        if self.bootstrap_truncated and self.async_batch_size:
            raise ConfigError(
                f"bootstrap_truncated=True works with synchronous envs only, not async_batch_size="
                f"{self.async_batch_size}; allowed: bootstrap_truncated=False or async_batch_size=0"
            )
        if self.batch_size % self.num_minibatches:
            raise ConfigError(
                f"num_minibatches={self.num_minibatches} does not divide the batch of {self._batch_formula}="
                f"{self.batch_size}; allowed: a divisor of {self.batch_size}"
            )
        if self.total_timesteps < self.batch_size:
            raise ConfigError(
                f"total_timesteps={self.total_timesteps} is smaller than one batch ({self._batch_formula}="
                f"{self.batch_size}); allowed: {self.batch_size} .. {INT32_MAX}"
            )
        return self

    def _validate_sizes(self) -> None:
        """The transitions of one iteration and the seeds of the first segment's envs must fit int32."""
        agents = "num_seeds" if not self.sweep else "settings*num_seeds"
        transitions = self.num_agents * self.num_envs * self.num_steps
        if transitions > INT32_MAX:
            raise ConfigError(
                f"{agents}*num_envs*num_steps={transitions} transitions per iteration do not fit int32; "
                f"allowed: at most {INT32_MAX}"
            )
        # Agent s's env i starts with the seed seed + s + i (EnvPool's own seeding, or ours made explicit).
        last_env_seed = self.seed + self.num_seeds - 1 + self.num_envs - 1
        if last_env_seed > INT32_MAX:
            raise ConfigError(
                f"seed={self.seed} gives env seeds up to seed+num_seeds-1+num_envs-1={last_env_seed}, but the env "
                f"backend takes 32-bit seeds; allowed: 0 .. {INT32_MAX - self.num_seeds - self.num_envs + 2} "
                f"with num_seeds={self.num_seeds}, num_envs={self.num_envs}"
            )

    def _validate_async(self) -> None:
        size = self.async_batch_size
        if size and (size >= self.num_envs or self.num_envs % size):
            raise ConfigError(
                f"async_batch_size={size} must be 0 (off) or a divisor of num_envs={self.num_envs} smaller than it"
                f"; allowed: 0, or a divisor of {self.num_envs} below {self.num_envs}"
            )
        if size and self.num_seeds > 1:
            raise ConfigError(
                f"async_batch_size={size} works with one seed only, not num_seeds={self.num_seeds}; allowed: "
                "async_batch_size=0 or num_seeds=1"
            )
        if size and self.sweep:
            raise ConfigError(
                f"async_batch_size={size} works with one agent only, not a sweep of {len(self.settings)} settings; "
                "allowed: async_batch_size=0 or no sweep"
            )


FIELD_RANGES: dict[str, FieldRange] = {
    field.name: field.metadata["within"] for field in dataclasses.fields(PPOConfig) if field.metadata["within"]
}
"""The allowed values of each int and float field of PPOConfig; its declared type says which it is."""
FIELD_CHOICES: dict[str, tuple[str, ...]] = {
    field.name: field.metadata["choices"] for field in dataclasses.fields(PPOConfig) if field.metadata["choices"]
}
"""The allowed values of the str fields that take one of a few."""
FIELD_TYPES: dict[str, Any] = {field.name: field.type for field in dataclasses.fields(PPOConfig)}
"""Each field's declared type: ``bool``, ``int``, ``float``, ``str`` (and ``sweep``'s own)."""


SweepPairs = Sequence[tuple[str, Sequence[Any]]]


def agents_of(sweep: SweepPairs, num_seeds: int) -> int:
    """The agents of a run of ``num_seeds`` seeds of each setting of ``sweep`` (name, values): one per pair."""
    return math.prod(len(values) for _, values in sweep) * num_seeds


def flag(name: str) -> str:
    """The command-line flag of a PPOConfig field: ``num_envs`` -> ``--num-envs``."""
    return "--" + name.replace("_", "-")
