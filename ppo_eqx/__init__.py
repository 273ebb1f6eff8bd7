"""ppo_eqx: CleanRL's PPO for Atari on EnvPool's XLA interface, as typed pure functions in JAX and Equinox.

Train and keep the result::

    config = ppo_eqx.PPOConfig.for_task("CartPole-v1", total_timesteps=50_000)  # CleanRL's ppo.py preset
    with ppo_eqx.Trainer(config) as trainer:
        for record in ppo_eqx.run(trainer):  # one dict per iteration: global_step, episodic_return, loss, ...
            ...
        path = ppo_eqx.save_checkpoint(run_dir, trainer.checkpoint(), config, trainer.spec, keep=3)

Resume with ``Trainer(config, restore=load_checkpoint(read_checkpoint(path), config, spec))``, play with
``evaluate``. An env of your own with gymnax's interface goes through the same calls: ``PPOConfig.for_task(env)``,
``Trainer(config, env=env)``, ``evaluate(..., env=env)`` (``JaxEnv``); a loss of your own through
``Trainer(config, loss=...)`` (``Loss``). Continuous actions (a box action space) get a Gaussian policy
(``GaussianActorCritic``) and CleanRL's ppo_continuous_action.py preset, observations and rewards normalised in
the program (``normalize_pool``). The pure pieces compose without a Trainer: ``init_train_state`` and
``make_iteration`` (one jittable iteration; ``over_iterations``, many in one program), ``sync_collector``
(``jax_env_collector`` for envs written in JAX), ``rollout``, ``update``, ``ppo_loss``, ``compute_gae``,
``ActorCritic``. The layout:
``ppo_eqx.core`` the pure functions, ``ppo_eqx.host`` what runs them (trainer, loop, checkpoints), ``ppo_eqx.cli``
the ``ppo-eqx`` program; everything here is re-exported from there, imported when first used (so that
``import ppo_eqx`` and the command line start without jax).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the public names; ``_lazy`` reads this block and imports each when it is first used
    from .config import PPOConfig as PPOConfig
    from .core._types import Batch as Batch
    from .core._types import EnvOutput as EnvOutput
    from .core._types import EpisodeStats as EpisodeStats
    from .core._types import LossInfo as LossInfo
    from .core._types import SequenceBatch as SequenceBatch
    from .core._types import Transition as Transition
    from .core.collect import Collector as Collector
    from .core.collect import async_collector as async_collector
    from .core.collect import jax_env_collector as jax_env_collector
    from .core.collect import sync_collector as sync_collector
    from .core.envs import AsyncPool as AsyncPool
    from .core.envs import EnvBackend as EnvBackend
    from .core.envs import EnvSpec as EnvSpec
    from .core.envs import Pool as Pool
    from .core.envs import env_spec as env_spec
    from .core.envs import make_async_pool as make_async_pool
    from .core.envs import make_pool as make_pool
    from .core.envs.jax_env import JaxEnv as JaxEnv
    from .core.envs.normalize import normalize_pool as normalize_pool
    from .core.gaussian import GaussianActorCritic as GaussianActorCritic
    from .core.hyperparameters import AgentHyperparameters as AgentHyperparameters
    from .core.iteration import make_iteration as make_iteration
    from .core.iteration import make_prime as make_prime
    from .core.iteration import over_iterations as over_iterations
    from .core.networks import ActorCritic as ActorCritic
    from .core.networks import CategoricalPolicy as CategoricalPolicy
    from .core.networks import GaussianPolicy as GaussianPolicy
    from .core.networks import Policy as Policy
    from .core.recurrent import LSTMActorCritic as LSTMActorCritic
    from .core.recurrent import RecurrentPolicy as RecurrentPolicy
    from .core.rollout import RolloutCarry as RolloutCarry
    from .core.rollout import compute_gae as compute_gae
    from .core.rollout import init_episode_stats as init_episode_stats
    from .core.rollout import rollout as rollout
    from .core.state import Checkpoint as Checkpoint
    from .core.state import ModelFactory as ModelFactory
    from .core.state import TrainState as TrainState
    from .core.state import default_model as default_model
    from .core.state import init_agents as init_agents
    from .core.state import init_train_state as init_train_state
    from .core.update import Loss as Loss
    from .core.update import OptimizerFactory as OptimizerFactory
    from .core.update import make_optimizer as make_optimizer
    from .core.update import model_loss as model_loss
    from .core.update import ppo_loss as ppo_loss
    from .core.update import update as update
    from .errors import CheckpointError as CheckpointError
    from .errors import ConfigError as ConfigError
    from .errors import NonFiniteError as NonFiniteError
    from .host.checkpoint import load_checkpoint as load_checkpoint
    from .host.checkpoint import read_checkpoint as read_checkpoint
    from .host.checkpoint import save_checkpoint as save_checkpoint
    from .host.evaluate import evaluate as evaluate
    from .host.evaluate import normalization_of as normalization_of
    from .host.kernel_build import resolve_conv_impl as resolve_conv_impl
    from .host.loop import run as run
    from .host.loop import run_agents as run_agents
    from .host.loop import train as train
    from .host.placement import init_state as init_state
    from .host.trainer import Trainer as Trainer
    from .settings import Hyperparameters as Hyperparameters
    from .settings import Sizes as Sizes
else:
    from ._lazy import attach

    __getattr__, __dir__, __all__ = attach(__name__, __file__)

__version__ = "0.1.0"
