"""PPOConfig: every hyperparameter, with CleanRL's names and defaults, validated in one place."""

import dataclasses
from typing import Any, Literal, get_args


class ConfigError(ValueError):
    """An impossible or unknown setting; the message names the value and what is allowed."""


ConvImpl = Literal["auto", "kernel", "matmul", "xla"]
CONV_IMPLS: tuple[str, ...] = get_args(ConvImpl)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Hyperparameters of ``ppo_atari_envpool_xla_jax.py`` (CleanRL), same names and defaults.

    The fields after ``seed`` are ppo_eqx's own. ``checkpoint_every`` is part of the trajectory: every
    ``checkpoint_every`` iterations the envs are made afresh, seeded from (seed, iteration), so that a run
    resumed from a checkpoint sees the same envs as an uninterrupted one. The others change speed, not results.
    """

    env_id: str = "Breakout-v5"
    total_timesteps: int = 10_000_000
    learning_rate: float = 2.5e-4
    num_envs: int = 8
    num_steps: int = 128
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.1
    clip_vloss: bool = False
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    seed: int = 1
    # ppo_eqx's own settings.
    conv_impl: str = "auto"
    """How convolutions are computed (one of CONV_IMPLS): "matmul" (space-to-depth, then matmuls; fast
    on CPU), "kernel" (as matmul, the first layer by a hand-written CPU kernel; faster still), "xla"
    (lax.conv_general_dilated), or "auto": "kernel" on CPU where the kernel builds, else "matmul". Same
    numbers within float32 rounding."""
    minibatch_unroll: int = 1
    """``unroll`` of the ``lax.scan`` over minibatch steps; larger compiles slower."""
    checkpoint_every: int = 200
    """Iterations between checkpoints; the envs are re-seeded from (seed, iteration) at each one. 200
    iterations of CleanRL's Atari batch are about 205k steps (6 minutes on 2 CPU cores): each re-seeding
    compiles the iteration anew (in the background), and each cuts the episodes under way."""
    num_seeds: int = 1
    """Independent agents trained in one program, with seeds ``seed`` .. ``seed + num_seeds - 1``: agent s is
    the run with seed ``seed + s`` (its own ``num_envs`` envs, model, optimizer and key)."""
    async_batch_size: int = 0
    """0 (the default): CleanRL's synchronous pool, every env steps at once. R > 0: EnvPool's async mode, a
    deviation from CleanRL. The pool holds ``num_envs`` envs, each rollout step receives the R that finish
    first, acts on them and sends their actions, while the others keep stepping; R must divide ``num_envs``
    and be smaller. ``batch_size`` becomes ``num_steps * R`` (``num_envs=16, async_batch_size=8`` keeps the
    Atari batch of 1024). The first transition of each env in a rollout holds the action that the previous
    iteration's model chose (and its log-probability), which envs come back together depends on thread
    timing (runs are not bit-reproducible), and episodes are cut at segment boundaries. For one seed only."""

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

    def agent_configs(self) -> list["PPOConfig"]:
        """The single-seed config of each of the ``num_seeds`` agents: seeds ``seed``, ``seed + 1``, ..."""
        return [self.replace(seed=self.seed + s, num_seeds=1) for s in range(self.num_seeds)]

    def replace(self, **changes: Any) -> "PPOConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "PPOConfig":
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"unknown config field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
        return cls(**values).validate()

    def validate(self) -> "PPOConfig":
        """Return self, or raise ConfigError naming the first impossible setting."""
        for name in (
            "total_timesteps",
            "num_envs",
            "num_steps",
            "num_minibatches",
            "update_epochs",
            "minibatch_unroll",
            "checkpoint_every",
            "num_seeds",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        for name in ("learning_rate", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be > 0")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be in [0, 1]")
        for name in ("clip_coef", "ent_coef", "vf_coef"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        self._validate_async()
        if self.batch_size % self.num_minibatches:
            raise ConfigError(
                f"num_minibatches={self.num_minibatches} does not divide the batch of {self._batch_formula}="
                f"{self.batch_size}; allowed: a divisor of {self.batch_size}"
            )
        if self.total_timesteps < self.batch_size:
            raise ConfigError(
                f"total_timesteps={self.total_timesteps} is smaller than one batch ({self._batch_formula}="
                f"{self.batch_size})"
            )
        if self.conv_impl not in CONV_IMPLS:
            raise ConfigError(f"conv_impl={self.conv_impl!r} is not one of {', '.join(map(repr, CONV_IMPLS))}")
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ConfigError(f"env_id={self.env_id!r} must be a non-empty EnvPool task id")
        return self

    def _validate_async(self) -> None:
        size = self.async_batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigError(f"async_batch_size={size!r} must be 0 (off) or a positive integer")
        if size and (size >= self.num_envs or self.num_envs % size):
            raise ConfigError(
                f"async_batch_size={size} must be 0 (off) or a divisor of num_envs={self.num_envs} smaller than it"
            )
        if size and self.num_seeds > 1:
            raise ConfigError(f"async_batch_size={size} works with one seed only, not num_seeds={self.num_seeds}")


# CleanRL's ppo.py defaults for vector-observation tasks (CartPole-v1 and friends): only what differs.
# And ppo_eqx's own checkpoint interval: CartPole's iterations take milliseconds, and each segment of envs
# costs a compile, so its checkpoints come every 128k steps rather than Atari's 51k.
VECTOR_PRESET: dict[str, Any] = {
    "total_timesteps": 500_000,
    "num_envs": 4,
    "clip_coef": 0.2,
    "checkpoint_every": 250,
}


def preset_for(is_atari: bool) -> dict[str, Any]:
    """Defaults that replace PPOConfig's for a kind of task: none for Atari, CleanRL's ppo.py for vectors."""
    return {} if is_atari else dict(VECTOR_PRESET)
