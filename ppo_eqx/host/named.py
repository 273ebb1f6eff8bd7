"""The one module that turns the names a config holds into objects, and the door where the user's code comes in:
``MODULE:CALLABLE`` env ids (the backend "jax"), ``MODULE:ATTRIBUTE`` backends, losses, network and optimizer
factories are imported here, once, at the edge (the Trainer, the command line's plan, loading a checkpoint, ``eval``),
so that the core receives objects only. A factory or loss of the user's is traced here too, its contract held against
the task, and whatever it raises, ``SystemExit`` and ``KeyboardInterrupt`` included, is one ``ConfigError`` naming the
object, the exception and the line of the user's file it came from.
"""

import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from ..config import NETWORKS, PPOConfig
from ..core._types import Batch, SequenceBatch
from ..core.envs import BACKEND_THREADS, AsyncPool, EnvBackend, EnvSpec, EnvThreads, Pool, backend
from ..core.envs.jax_env import JaxEnv
from ..core.networks import ConvRoute, NetworkInit, Policy
from ..core.recurrent import RecurrentPolicy, lstm_model
from ..core.state import ModelFactory, default_model
from ..core.update import RESERVED, Loss, OptimizerFactory, make_optimizer, model_loss, torch_model_loss
from ..errors import ConfigError, first_line, user_frame
from ..settings import is_import_path
from .host_cpu import on_the_host_cpu


def defined_at(obj: Any) -> str:
    """``file:line`` where ``obj`` (a function, a class, or an instance's class) is defined; empty where unknown."""
    target = obj if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj) else type(obj)
    target = inspect.unwrap(getattr(target, "func", target))  # a functools.partial's function
    try:
        return f"{inspect.getsourcefile(target)}:{inspect.getsourcelines(target)[1]}"
    except (OSError, TypeError):
        return ""


def user_error(what: str, error: BaseException, doing: str = "", source: Any = None) -> ConfigError:
    """``error``, raised by the user's ``what``, as one ``ConfigError``: the exception in one line and where (in the
    user's file; else where ``source``, the user's object, is defined)."""
    where = user_frame(error) or (defined_at(source) if source is not None else "")
    done = f"called sys.exit({error.code!r})" if isinstance(error, SystemExit) else f"raised {first_line(error)}"
    return ConfigError(f"{what} {done}{f' {doing}' if doing else ''}{f' ({where})' if where else ''}")


def call_user(what: str, fn: Callable[..., Any], *args: Any, doing: str = "", source: Any = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, the user's code (``source``: the user's object it calls, for where it is defined):
    whatever it raises is ``user_error`` (a ConfigError of ppo_eqx's own passes as it is)."""
    try:
        return fn(*args, **kwargs)
    except ConfigError:
        raise
    except BaseException as error:  # the user's: SystemExit and KeyboardInterrupt too, never the program's status
        raise user_error(what, error, doing, source) from None


def import_object(path: str, what: str) -> Any:
    """The object ``MODULE:ATTRIBUTE`` names, imported (from ``sys.path``, then the working directory); ConfigError
    naming ``what`` (a flag or field) for anything that goes wrong, the module's own code raising included."""
    if not isinstance(path, str) or not is_import_path(path):
        raise ConfigError(f"{what}={path!r} is not MODULE:ATTRIBUTE; allowed: e.g. mypkg.envs:make_env")
    module_name, _, attribute = path.partition(":")
    try:
        module = _import(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            raise ConfigError(
                f"{what}={path!r}: no module named {error.name!r}; allowed: an importable module"
            ) from None
        raise user_error(f"{what}={path!r}: importing {module_name}", error) from None
    except BaseException as error:  # the user's module, run on import
        raise user_error(f"{what}={path!r}: importing {module_name}", error) from None
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"{what}={path!r}: {module_name} has no {attribute!r}; allowed: a name it defines")
        found = getattr(found, part)
    return found


def _import(module_name: str) -> Any:
    """``module_name``, from ``sys.path`` or else from the working directory (as ``python -m`` would find it)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        here = os.getcwd()
        if error.name is None or not module_name.startswith(error.name) or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(module_name)


# --- backends and envs ------------------------------------------------------------------------------------------


@functools.cache
def env_from_path(env_id: str) -> JaxEnv:
    """The env that ``env_id`` (``MODULE:CALLABLE``) makes, once per process: the callable called with no
    arguments returns an env object or gymnax's ``(env, params)``."""
    maker = import_object(env_id, "env_id")
    if not callable(maker):
        raise ConfigError(f"env_id={env_id!r} is a {type(maker).__name__}, not callable; allowed: a function or class")
    env = call_user(f"env_id={env_id!r}", maker, doing="when called", source=maker)
    return JaxEnv(env, env_id=env_id)


class EnvIdBackend:
    """``EnvBackend`` "jax": env ids ``MODULE:CALLABLE`` (``env_from_path``), each env a ``JaxEnv``. A config
    that names one is trained, resumed and evaluated from its config alone."""

    name = "jax"
    rebinds = True
    has_async = False
    state_is_data = True

    def spec(self, env_id: str) -> EnvSpec:
        return self._env(env_id).spec()

    def make(
        self, env_id: str, seeds: Sequence[int], *, render: bool = False, threads: EnvThreads = BACKEND_THREADS
    ) -> Pool:
        return self._env(env_id).make(env_id, seeds, render=render, threads=threads)

    def make_async(
        self, env_id: str, seeds: Sequence[int], batch_size: int, *, threads: EnvThreads = BACKEND_THREADS
    ) -> AsyncPool:
        return self._env(env_id).make_async(env_id, seeds, batch_size, threads=threads)

    @staticmethod
    def _env(env_id: str) -> JaxEnv:
        if not is_import_path(env_id):
            raise ConfigError(
                f"env_id={env_id!r} names an env object, which the run cannot make again; allowed: MODULE:CALLABLE "
                "(a callable that returns the env), or pass the object: Trainer(config, env=env), evaluate(..., "
                "env=env)"
            )
        return env_from_path(env_id)


ENV_ID_BACKEND = EnvIdBackend()


PLOTTING = ("seaborn", "matplotlib.pyplot")
"""What gymnax imports at its own import, for rendering two envs its backend never trains (Pong, Catch): a second
of a short run's start (seaborn brings scipy.stats and pandas). Imported on first use instead."""


class _OnFirstUse(types.ModuleType):
    """A module not imported yet: its first attribute asked for imports it (and puts it in ``sys.modules``), for
    whoever asks, gymnax's renderers or anyone after; those holding this stand-in are forwarded."""

    def __getattr__(self, attribute: str) -> Any:
        real = self.__dict__.get("_real")
        if real is None:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = self.__dict__["_real"] = importlib.import_module(self.__name__)
        return getattr(real, attribute)


@contextlib.contextmanager
def _plotting_on_first_use() -> Iterator[None]:
    """While gymnax's backend is imported, ``PLOTTING``'s modules not imported yet are stand-ins."""
    for name in PLOTTING:
        if name not in sys.modules and importlib.util.find_spec(name.split(".")[0]) is not None:
            sys.modules[name] = _OnFirstUse(name)
    yield


def backend_named(name: str) -> EnvBackend:
    """The backend ``PPOConfig.env_backend`` names: a library's (``core.envs.backend``), "jax" (env ids
    ``MODULE:CALLABLE``), or the user's object ``MODULE:ATTRIBUTE``, imported now and checked for ``EnvBackend``'s
    attributes (docs/design.md, "A backend of your own")."""
    return _users_backend(name) if isinstance(name, str) and ":" in name else _library_backend(name)


def _library_backend(name: str) -> EnvBackend:
    """A library's backend (``core.envs.backend``; gymnax's plotting modules imported on first use), or "jax"."""
    if name == "jax":
        return ENV_ID_BACKEND
    with _plotting_on_first_use() if name == "gymnax" else contextlib.nullcontext():
        return backend(name)


def _users_backend(name: str) -> EnvBackend:
    """The user's backend object ``MODULE:ATTRIBUTE``, imported now and checked for ``EnvBackend``'s attributes."""
    found = import_object(name, "env_backend")
    if not isinstance(found, EnvBackend):
        missing = [name for name in ("name", "rebinds", "has_async", "state_is_data", "spec", "make", "make_async")
                   if not hasattr(found, name)]  # fmt: skip
        raise ConfigError(
            f"env_backend={name!r} is a {type(found).__name__} without {', '.join(missing)}; allowed: an object "
            "with EnvBackend's attributes (ppo_eqx.EnvBackend)"
        )
    return cast(EnvBackend, found)


def backend_and_spec(name: str, env_id: str, seed: int = 1) -> tuple[EnvBackend, EnvSpec]:
    """The backend ``name`` names (``backend_named``) and ``env_id``'s spec from it (``check_backend``): a user's
    backend imported and its code called once here, a library's asked for the spec."""
    if is_import_path(name):  # the user's: its code is called here, where a fault is said as the user's
        users = _users_backend(name)
        return users, check_backend(users, name, env_id, seed)

    # A library's, its spec asked of it directly. gymnax's import and spaces make arrays, each a program a TPU
    # compiles for a second or more: on an accelerator, on the host's CPU. EnvPool's make none, and jax's backends
    # stay unmade for the checks that come before them (a distributed run's join).
    def read() -> tuple[EnvBackend, EnvSpec]:
        chosen = _library_backend(name)
        return chosen, chosen.spec(env_id)

    return on_the_host_cpu(read) if name == "gymnax" else read()


def check_backend(env_backend: EnvBackend, name: str, env_id: str, seed: int = 1) -> EnvSpec:
    """The spec of ``env_id`` from ``env_backend`` (which the config names ``name``); for a backend of the user's
    (``MODULE:ATTRIBUTE``) its ``spec`` and ``make`` called once here (a pool of one env, closed again), each the
    user's code: what they raise, or return that is no ``EnvSpec`` or pool, is one ConfigError naming the backend."""
    if is_import_path(name):
        said = f"env_backend={name!r}"
        spec = call_user(said, env_backend.spec, env_id, doing=f"in spec({env_id!r})", source=env_backend)
        if not isinstance(spec, EnvSpec):
            raise ConfigError(f"{said}: spec({env_id!r}) returned a {type(spec).__name__}; allowed: an EnvSpec")
        pool = call_user(said, env_backend.make, env_id, [seed], doing="in make(env_id, seeds)", source=env_backend)
        if not isinstance(pool, Pool):
            raise ConfigError(f"{said}: make(...) returned a {type(pool).__name__}; allowed: a ppo_eqx Pool")
        call_user(said, pool.close, doing="in its pool's close()")
        return spec
    return env_backend.spec(env_id)


# --- losses, networks, optimizers -------------------------------------------------------------------------------


def loss_named(name: str) -> Loss:
    """The loss ``PPOConfig.loss`` names: "cleanrl", ``model_loss``; "cleanrl-torch", ``torch_model_loss``; or
    ``MODULE:ATTRIBUTE``, the user's, imported now."""
    if name == "cleanrl":
        return model_loss
    if name == "cleanrl-torch":
        return torch_model_loss
    found = import_object(name, "loss")
    if not callable(found):
        raise ConfigError(
            f"loss={name!r} is a {type(found).__name__}, not callable; allowed: a function (ppo_eqx.Loss)"
        )
    return cast(Loss, found)


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
    shaped = call_user(said, eqx.filter_eval_shape, factory, spec, _key_like(), doing="when called with (spec, key)")
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
    call_user(
        said, eqx.filter_eval_shape, shaped, _obs_like(spec, 2), doing="when its model was called on observations"
    )
    return shaped


def check_optimizer(factory: OptimizerFactory, config: PPOConfig, model: Policy) -> None:
    """ConfigError naming ``factory`` unless it makes, from ``config``'s first agent's hyperparameters and sizes, an
    ``optax.GradientTransformation`` whose state starts from ``model``'s arrays (traced once, nothing computed)."""
    said = _named(factory, "optimizer")

    def made_and_started(hyperparameters: Any, params: Any) -> Any:
        doing = "when called with (hyperparameters, sizes)"
        made = call_user(said, factory, hyperparameters, config.sizes, doing=doing, source=factory)
        if not isinstance(made, optax.GradientTransformation):
            raise ConfigError(f"{said} returned a {type(made).__name__}; allowed: an optax.GradientTransformation")
        return call_user(said, made.init, params, doing="in its init(params)")

    eqx.filter_eval_shape(made_and_started, _hyperparameters_like(config), eqx.filter(model, eqx.is_array))


def check_loss(loss: Loss, model: Policy, spec: EnvSpec, config: PPOConfig) -> None:
    """ConfigError naming ``loss`` unless, traced once on a minibatch like the update's (a few rows of ``spec``'s
    task, ``model``'s shapes), it returns ``(scalar, reported)``: a float scalar, and scalars by names that are no
    other metric's (``core.update.reported``)."""
    if loss in (model_loss, torch_model_loss):
        return
    said = _named(loss, "loss")
    hyperparameters = _hyperparameters_like(config)
    batch = _minibatch_like(model, spec)
    result = call_user(
        said, eqx.filter_eval_shape, functools.partial(loss, prepared=True), model, batch, hyperparameters,
        doing="when called with (model, minibatch, hyperparameters, *, prepared)", source=loss,
    )  # fmt: skip
    if not isinstance(result, tuple) or len(result) != 2:
        shown = f"a tuple of {len(result)}" if isinstance(result, tuple) else f"a {_shown(result)}"
        raise ConfigError(f"{said} returned {shown}; allowed: (loss, reported), a scalar and a mapping of scalars")
    value, info = result
    scalar = isinstance(value, jax.ShapeDtypeStruct) and value.shape == () and jnp.issubdtype(value.dtype, jnp.floating)
    if not scalar:
        raise ConfigError(f"{said} returned a loss of {_shown(value)}; allowed: a float scalar")
    items = info._asdict() if hasattr(info, "_asdict") else dict(info) if isinstance(info, Mapping) else None
    if items is None:
        raise ConfigError(f"{said} reports a {type(info).__name__}; allowed: a NamedTuple or a mapping of scalars")
    for name, reported_value in items.items():
        if not isinstance(name, str) or not name.isidentifier() or name in RESERVED:
            raise ConfigError(f"{said} reports {name!r}; allowed: names that are identifiers, not {sorted(RESERVED)}")
        number = isinstance(reported_value, jax.ShapeDtypeStruct) and (
            jnp.issubdtype(reported_value.dtype, jnp.number) or reported_value.dtype == jnp.bool_
        )
        if not (number and reported_value.shape == ()) and not isinstance(reported_value, int | float):
            raise ConfigError(f"{said} reports {name} as {_shown(reported_value)}; allowed: a number (a scalar)")

    def differentiated(model: Policy, batch: Any, hyperparameters: Any) -> Any:
        return loss(model, batch, hyperparameters, prepared=True)[0]

    call_user(
        said, eqx.filter_eval_shape, eqx.filter_grad(differentiated), model, batch, hyperparameters,
        doing="when differentiated with respect to the model", source=loss,
    )  # fmt: skip


def _shown(value: Any) -> str:
    """What a traced value is, in words: an array's dtype and shape, else its type."""
    if isinstance(value, jax.ShapeDtypeStruct):
        return f"array of {value.dtype}{list(value.shape)}"
    return type(value).__name__


def user_code(config: PPOConfig, spec: EnvSpec) -> dict[str, Any]:
    """The loss, model and optimizer factories ``config`` names, a user's imported and traced against the task now
    (``check_user_code``: ConfigError naming it), before anything is written: a plan's ``loss``, ``model`` (None for
    a network of ppo_eqx's, named again once the convolutions' route is known) and ``optimizer``."""
    model = network_named(config.network, init=cast(NetworkInit, config.network_init))
    optimizer, loss = optimizer_named(config.optimizer), loss_named(config.loss)
    check_user_code(config, spec, model=model, optimizer=optimizer, loss=loss)
    return {"loss": loss, "model": None if config.network in NETWORKS else model, "optimizer": optimizer}


def check_user_code(
    config: PPOConfig,
    spec: EnvSpec,
    *,
    model: ModelFactory | None,
    optimizer: OptimizerFactory,
    loss: Loss,
    restored: Policy | None = None,
) -> None:
    """The model factory, optimizer and loss a run trains with, those of the user's traced once against the task
    (``check_model``, ``check_optimizer``, ``check_loss``): ConfigError naming what broke its contract. ``restored``:
    the model of a checkpoint the run goes on from (the factory's model then is not made)."""
    shaped = restored
    if shaped is None:
        if model is not None:
            shaped = check_model(model, spec)
        else:
            init = cast(NetworkInit, config.network_init)
            shaped = eqx.filter_eval_shape(default_model, spec, _key_like(), conv_impl="xla", init=init)
    if optimizer is not make_optimizer:
        check_optimizer(optimizer, config, shaped)
    check_loss(loss, shaped, spec, config)


def _key_like() -> jax.ShapeDtypeStruct:
    """A PRNG key's shape, made without a backend: a distributed run joins its peers after these checks, and jax
    can join only before its backend starts."""
    return jax.eval_shape(lambda: jax.random.key(0))


def _hyperparameters_like(config: PPOConfig) -> Any:
    """The shapes of one agent's hyperparameters of ``config`` (an ``AgentHyperparameters`` of
    ``jax.ShapeDtypeStruct``: every agent's are the same, scalars), made without a backend (``_key_like``)."""
    from ..core.hyperparameters import AgentHyperparameters

    return jax.eval_shape(lambda: AgentHyperparameters.of([config]))


def _obs_like(spec: EnvSpec, rows: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((rows, *spec.obs_shape), spec.obs_dtype)


def _minibatch_like(model: Policy, spec: EnvSpec) -> Any:
    """The shapes of a small minibatch of ``spec``'s task (a ``Batch`` or ``SequenceBatch`` of
    ``jax.ShapeDtypeStruct``), as the update gives ``model``'s loss: flat, or whole sequences with their memory for a
    recurrent policy."""
    rows: tuple[int, ...] = (3, 2) if isinstance(model, RecurrentPolicy) else (4,)
    prepared = eqx.filter_eval_shape(model.prepare, jax.ShapeDtypeStruct((4, *spec.obs_shape), spec.obs_dtype))
    obs = jax.ShapeDtypeStruct((*rows, *prepared.shape[1:]), prepared.dtype)
    continuous = spec.continuous
    actions = jax.ShapeDtypeStruct(
        (*rows, spec.num_actions) if continuous else rows, jnp.float32 if continuous else jnp.int32
    )
    floats: list[Any] = [jax.ShapeDtypeStruct(rows, jnp.float32)] * 4
    if not isinstance(model, RecurrentPolicy):
        return Batch._make([obs, actions, *floats])
    memory = eqx.filter_eval_shape(model.initial_memory, rows[-1])
    return SequenceBatch._make([obs, actions, *floats, jax.ShapeDtypeStruct(rows, jnp.bool_), memory])
