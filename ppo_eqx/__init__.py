"""ppo_eqx: CleanRL's PPO for Atari on EnvPool's XLA interface, as typed pure functions in JAX and Equinox."""

from ._types import AsyncTransition as AsyncTransition
from ._types import Batch as Batch
from ._types import EnvOutput as EnvOutput
from ._types import EpisodeStats as EpisodeStats
from ._types import LossInfo as LossInfo
from ._types import Transition as Transition
from .checkpoint import Checkpoint as Checkpoint
from .collect import Collector as Collector
from .collect import async_collector as async_collector
from .collect import sync_collector as sync_collector
from .config import ConfigError as ConfigError
from .config import PPOConfig as PPOConfig
from .envs import AsyncEnv as AsyncEnv
from .envs import AsyncPool as AsyncPool
from .envs import EnvBackend as EnvBackend
from .envs import EnvSpec as EnvSpec
from .envs import Pool as Pool
from .envs import make_async_pool as make_async_pool
from .envs import make_pool as make_pool
from .gae import compute_gae as compute_gae
from .gae import compute_gae_by_env as compute_gae_by_env
from .iteration import TrainState as TrainState
from .iteration import make_iteration as make_iteration
from .loss import model_loss as model_loss
from .loss import ppo_loss as ppo_loss
from .networks import ActorCritic as ActorCritic
from .rollout import AsyncRolloutCarry as AsyncRolloutCarry
from .rollout import RolloutCarry as RolloutCarry
from .rollout import async_rollout as async_rollout
from .rollout import init_episode_stats as init_episode_stats
from .rollout import rollout as rollout
from .train import OneDevice as OneDevice
from .train import Trainer as Trainer
from .train import train as train
from .update import make_optimizer as make_optimizer
from .update import update as update

__version__ = "0.1.0"
