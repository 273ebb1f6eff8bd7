"""The model and the optimizer a config names (``PPOConfig.network``, ``PPOConfig.optimizer``), turned into the
factories they name once, at the edge (the Trainer, the command line, loading a checkpoint), and a factory of the
user's checked at the door: traced once, its contract held against the task, every failure one line naming it."""

import functools
from typing import Any, cast

import equinox as eqx
import jax
import optax

from ..config import PPOConfig
from ..core.envs import EnvSpec
from ..core.networks import ConvRoute, NetworkInit
from ..core.policy import Policy
from ..core.recurrent import lstm_model
from ..core.state import ModelFactory
from ..core.update import OptimizerFactory, make_optimizer
from ..core.user_code import first_line, import_object
from ..errors import ConfigError


def network_named(name: str, *, conv_impl: ConvRoute = "xla", init: NetworkInit = "cleanrl") -> ModelFactory | None:
    """The model factory ``PPOConfig.network`` names: None for "feedforward" (ppo_eqx's own, ``default_model``, which
    the convolutions' route and ``network_init`` shape), the recurrent one for "lstm" (``core.recurrent``, with
    ``conv_impl`` and ``init``), or the user's ``MODULE:CALLABLE``, imported now."""
    if name == "feedforward":
        return None
    if name == "lstm":
        return _lstm(conv_impl, init)
    found = import_object(name, "network")
    if not callable(found):
        raise ConfigError(f"network={name!r} is a {type(found).__name__}, not callable; allowed: a factory (spec, key)")
    return cast(ModelFactory, found)


@functools.cache
def _lstm(conv_impl: ConvRoute, init: NetworkInit) -> ModelFactory:
    """``lstm_model`` with the route and the layers' start bound: one factory per pair (a trainer's fresh-agent
    program is kept per factory, ``host.fresh``)."""
    return functools.partial(lstm_model, conv_impl=conv_impl, init=init)


def optimizer_named(name: str) -> OptimizerFactory:
    """The optimizer factory ``PPOConfig.optimizer`` names: CleanRL's (``make_optimizer``) for "cleanrl", or the
    user's ``MODULE:CALLABLE``, imported now."""
    if name == "cleanrl":
        return make_optimizer
    found = import_object(name, "optimizer")
    if not callable(found):
        raise ConfigError(
            f"optimizer={name!r} is a {type(found).__name__}, not callable; allowed: a factory (hyperparameters, sizes)"
        )
    return cast(OptimizerFactory, found)


def _named(factory: Any, what: str) -> str:
    name = getattr(factory, "__qualname__", None) or type(factory).__name__
    return f"{what}={getattr(factory, '__module__', '?')}:{name}"


def check_model(factory: ModelFactory, spec: EnvSpec) -> Policy:
    """The shape of the model ``factory`` makes for ``spec`` (traced once, nothing computed): a ``Policy`` that
    takes ``spec``'s observations and gives its actions; ConfigError naming the factory and what it broke."""
    said = _named(factory, "network")
    try:
        shaped = eqx.filter_eval_shape(factory, spec, jax.random.key(0))
    except Exception as error:  # the user's code, traced
        raise ConfigError(f"{said} raised {first_line(error)} when called with (spec, key)") from None
    if not isinstance(shaped, Policy):
        raise ConfigError(
            f"{said} returned a {type(shaped).__name__}; allowed: a ppo_eqx.Policy (CategoricalPolicy, GaussianPolicy "
            "or RecurrentPolicy)"
        )
    if tuple(shaped.obs_shape) != tuple(spec.obs_shape) or shaped.num_actions != spec.num_actions:
        raise ConfigError(
            f"{said} made a model of observations {tuple(shaped.obs_shape)} and {shaped.num_actions} actions; "
            f"{spec.env_id} has {tuple(spec.obs_shape)} and {spec.num_actions}"
        )
    return shaped


def check_optimizer(factory: OptimizerFactory, config: PPOConfig, model: Policy) -> None:
    """ConfigError naming ``factory`` unless it makes, from ``config``'s first agent's hyperparameters and sizes, an
    ``optax.GradientTransformation`` whose state starts from ``model``'s arrays (traced once, nothing computed)."""
    said = _named(factory, "optimizer")
    from ..core.hyperparameters import AgentHyperparameters

    hyperparameters = AgentHyperparameters.of(config.agent_configs()[:1])
    try:
        made = factory(hyperparameters, config.sizes)
    except Exception as error:  # the user's code
        raise ConfigError(f"{said} raised {first_line(error)} when called with (hyperparameters, sizes)") from None
    if not isinstance(made, optax.GradientTransformation):
        raise ConfigError(f"{said} returned a {type(made).__name__}; allowed: an optax.GradientTransformation")
    try:
        eqx.filter_eval_shape(made.init, eqx.filter(model, eqx.is_array))
    except Exception as error:
        raise ConfigError(f"{said}: its init(params) raised {first_line(error)}") from None
