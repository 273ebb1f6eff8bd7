"""rejax's PPO on a task of ``bench/peers.py``, run by a Python that has rejax installed (``pip install rejax``).

    VENV/bin/python bench/peer_runners/run_rejax.py --task cartpole --out r.json

rejax (0.1.3) steps gymnax envs with the pre-1.0 five-value step, so the env is gymnax's own ``LogWrapper`` (which
keeps each env's last finished episode in the env state) under ``FiveValueStep``. rejax's evaluation callback is
replaced by one that reads that state after every iteration (``eval_freq`` = one iteration), so the curve is
CleanRL's training ``episodic_return``, not rejax's greedy evaluation episodes. With ``--num-agents`` A > 1,
``algo.train`` is vmapped over A keys, as rejax's README does.
"""

import time

PROCESS_START = time.perf_counter()

import gymnax  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from _common import FiveValueStep, episodic_returns, parse_args, report, task_settings, timed_run  # noqa: E402
from gymnax.wrappers import LogWrapper  # noqa: E402


def main() -> None:
    args = parse_args(__doc__, "unused: rejax is imported from this Python's site-packages")
    settings = task_settings(args)
    from rejax import PPO

    env, env_params = gymnax.make(settings["env_id"])
    algo = PPO.create(
        env=FiveValueStep(LogWrapper(env)),
        env_params=env_params,
        total_timesteps=settings["total_timesteps"],
        eval_freq=settings["num_envs"] * settings["num_steps"],
        skip_initial_evaluation=True,
        num_envs=settings["num_envs"],
        num_steps=settings["num_steps"],
        num_minibatches=settings["num_minibatches"],
        num_epochs=settings["update_epochs"],
        learning_rate=settings["learning_rate"],
        gamma=settings["gamma"],
        gae_lambda=settings["gae_lambda"],
        clip_eps=settings["clip_coef"],
        ent_coef=settings["ent_coef"],
        vf_coef=settings["vf_coef"],
        max_grad_norm=settings["max_grad_norm"],
        agent_kwargs={"activation": settings["activation"], "hidden_layer_sizes": settings["hidden"]},
    )

    def episodes(algo, ts, rng):
        return ts.env_state.returned_episode_returns, ts.env_state.returned_episode_valid

    algo = algo.replace(eval_callback=episodes)

    def program(keys):
        _, (last, valid) = jax.vmap(algo.train)(keys)
        return last, valid  # [A, I, N]

    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.num_agents)
    (last, valid), compile_s, run_s = timed_run(program, keys)
    returns = episodic_returns(np.asarray(last), np.asarray(valid))
    notes = [
        "rejax 0.1.3 PPO: constant learning rate (no annealing), element-wise gradient clip (optax.clip), "
        "separate Adam for actor and critic, clipped value loss, flax default (lecun) init",
    ]
    if settings["anneal_lr"]:
        notes.append("the task anneals the learning rate; rejax cannot, so it runs at the initial rate throughout")
    report("rejax", args, settings, returns, compile_s, run_s, PROCESS_START, notes)


if __name__ == "__main__":
    main()
