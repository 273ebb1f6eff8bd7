"""ppo_eqx: CleanRL's PPO for Atari on EnvPool's XLA interface, as typed pure functions in JAX and Equinox."""

from .config import PPOConfig as PPOConfig
from .core._types import AsyncTransition as AsyncTransition
from .core._types import Batch as Batch
from .core._types import EnvOutput as EnvOutput
from .core._types import EpisodeStats as EpisodeStats
from .core._types import LossInfo as LossInfo
from .core._types import Transition as Transition
from .core.collect import Collector as Collector
from .core.collect import async_collector as async_collector
from .core.collect import sync_collector as sync_collector
from .core.envs import AsyncEnv as AsyncEnv
from .core.envs import AsyncPool as AsyncPool
from .core.envs import EnvBackend as EnvBackend
from .core.envs import EnvSpec as EnvSpec
from .core.envs import Pool as Pool
from .core.envs import make_async_pool as make_async_pool
from .core.envs import make_pool as make_pool
from .core.gae import compute_gae as compute_gae
from .core.gae import compute_gae_by_env as compute_gae_by_env
from .core.iteration import TrainState as TrainState
from .core.iteration import make_iteration as make_iteration
from .core.loss import model_loss as model_loss
from .core.loss import ppo_loss as ppo_loss
from .core.networks import ActorCritic as ActorCritic
from .core.rollout import AsyncRolloutCarry as AsyncRolloutCarry
from .core.rollout import RolloutCarry as RolloutCarry
from .core.rollout import async_rollout as async_rollout
from .core.rollout import init_episode_stats as init_episode_stats
from .core.rollout import rollout as rollout
from .core.update import make_optimizer as make_optimizer
from .core.update import update as update
from .errors import ConfigError as ConfigError
from .host.checkpoint import Checkpoint as Checkpoint
from .host.trainer import OneDevice as OneDevice
from .host.trainer import Trainer as Trainer
from .host.trainer import train as train

__version__ = "0.1.0"
