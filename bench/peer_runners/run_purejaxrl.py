"""PureJaxRL's ``purejaxrl/ppo.py`` on a task of ``bench/peers.py``, run by PureJaxRL's own Python.

    VENV/bin/python bench/peer_runners/run_purejaxrl.py --peer-path /path/to/purejaxrl --task cartpole --out r.json

Its ``make_train`` is used as it is, on gymnax 1.0 through ``FiveValueStep`` (its wrappers expect the pre-1.0
five-value step). Its ``wrappers.py`` imports brax and navix for other envs; they are stood in for by empty
modules. For ``breakout`` its 64-64 network is replaced by gymnax-blines' 2 x 256 ReLU MLP (PureJaxRL's own
initialisation). With ``--num-agents`` A > 1 the whole ``train`` is vmapped over A keys, as PureJaxRL's README does.
"""

import sys
import time
import types

PROCESS_START = time.perf_counter()

import gymnax  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from _common import FiveValueStep, episodic_returns, parse_args, report, task_settings, timed_run  # noqa: E402


def stand_in_modules() -> None:
    """Empty brax and navix modules: PureJaxRL's wrappers.py imports them at the top, for envs not used here."""
    for name in ("brax", "brax.envs", "brax.envs.wrappers", "brax.envs.wrappers.training", "navix"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["brax"].envs = sys.modules["brax.envs"]  # type: ignore[attr-defined]
    training = sys.modules["brax.envs.wrappers.training"]
    training.EpisodeWrapper = training.AutoResetWrapper = None  # type: ignore[attr-defined]


def blines_network(hidden: tuple[int, ...]):
    """gymnax-blines' MinAtar network (separate actor and critic MLPs, ReLU) in PureJaxRL's module style."""
    import distrax
    import flax.linen as nn
    import jax.numpy as jnp
    from flax.linen.initializers import constant, orthogonal

    class ActorCritic(nn.Module):
        action_dim: int
        activation: str = "relu"

        @nn.compact
        def __call__(self, x):
            def tower(x, out, scale):
                for size in hidden:
                    x = nn.relu(nn.Dense(size, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x))
                return nn.Dense(out, kernel_init=orthogonal(scale), bias_init=constant(0.0))(x)

            return distrax.Categorical(logits=tower(x, self.action_dim, 0.01)), jnp.squeeze(tower(x, 1, 1.0), -1)

    return ActorCritic


def main() -> None:
    args = parse_args(__doc__, "the PureJaxRL checkout (the folder that holds purejaxrl/ppo.py)")
    settings = task_settings(args)
    if args.peer_path is None or not (args.peer_path / "purejaxrl" / "ppo.py").is_file():
        sys.exit(f"--peer-path={args.peer_path}: allowed: a PureJaxRL checkout with purejaxrl/ppo.py")
    stand_in_modules()
    sys.path.insert(0, str(args.peer_path / "purejaxrl"))
    make = gymnax.make
    gymnax.make = lambda env_id, **kwargs: (lambda env, params: (FiveValueStep(env), params))(*make(env_id, **kwargs))
    import ppo  # PureJaxRL's ppo.py

    notes = ["PureJaxRL's ppo.py as it is: clipped value loss, one Adam over actor and critic, global-norm clip"]
    if settings["hidden"] != (64, 64):
        ppo.ActorCritic = blines_network(settings["hidden"])
        notes.append(f"network replaced by gymnax-blines' MLP {settings['hidden']} ReLU (PureJaxRL's init)")
    config = {
        "LR": settings["learning_rate"],
        "NUM_ENVS": settings["num_envs"],
        "NUM_STEPS": settings["num_steps"],
        "TOTAL_TIMESTEPS": settings["total_timesteps"],
        "UPDATE_EPOCHS": settings["update_epochs"],
        "NUM_MINIBATCHES": settings["num_minibatches"],
        "GAMMA": settings["gamma"],
        "GAE_LAMBDA": settings["gae_lambda"],
        "CLIP_EPS": settings["clip_coef"],
        "ENT_COEF": settings["ent_coef"],
        "VF_COEF": settings["vf_coef"],
        "MAX_GRAD_NORM": settings["max_grad_norm"],
        "ACTIVATION": settings["activation"],
        "ENV_NAME": settings["env_id"],
        "ANNEAL_LR": settings["anneal_lr"],
        "DEBUG": False,
    }
    train = ppo.make_train(config)

    def program(keys):
        out = jax.vmap(train)(keys) if args.num_agents > 1 else jax.tree.map(lambda x: x[None], train(keys[0]))
        info = out["metrics"]  # [A, I, T, N] each
        return info["returned_episode_returns"][:, :, -1, :], info["returned_episode"].any(axis=2)

    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.num_agents)
    (last, finished), compile_s, run_s = timed_run(program, keys)
    valid = np.logical_or.accumulate(np.asarray(finished), axis=1)
    returns = episodic_returns(np.asarray(last), valid)
    report("purejaxrl", args, settings, returns, compile_s, run_s, PROCESS_START, notes)


if __name__ == "__main__":
    main()
