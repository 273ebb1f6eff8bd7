"""Compile time and median run time of each jitted piece of a PPO iteration, beside this machine's ceilings.

Pieces: env step (random actions, no model: the env-only ceiling), policy step, rollout of num_steps, GAE,
one minibatch update, one full update (update_epochs x num_minibatches steps), one whole iteration. Each is
reported in env steps/s and as a fraction of the compute limit of one PPO env step on this machine:

    limit_sps = 1 / (flops_per_env_step / matmul_rate + 1 / env_only_sps)

where flops_per_env_step (rollout forward + update_epochs x forward-and-backward per sample) is counted by
XLA's cost analysis of the loop-free forward and minibatch-gradient programs, and the matmul rate and the
env-only rate are measured in the same run.

    python bench/microbench.py --env-id Breakout-v5 --json bench/results/microbench.json
"""

import argparse
import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _common import (
    add_config_args,
    compile_seconds,
    compute_limit_sps,
    config_from_args,
    device_memory_mib,
    env_only_program,
    environment,
    fraction,
    matmul_rate,
    model_flops,
    peak_rss_mib,
    timed,
    write_results,
)

from ppo_eqx import (
    Batch,
    compute_gae,
    init_state,
    make_iteration,
    make_optimizer,
    make_pool,
    model_loss,
    resolve_conv_impl,
    sync_collector,
    update,
)
from ppo_eqx.core.networks import categorical_logprob_entropy
from ppo_eqx.core.rollout import RolloutCarry, init_episode_stats, rollout


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per piece (median reported)")
    return parser.parse_args()


class Pieces:
    """Times compiled pieces one by one: compile seconds, then the median over repeats after a warm-up call."""

    def __init__(self, repeats: int) -> None:
        self.repeats, self.rows = repeats, []

    def add(self, piece: str, jitted, call_args: tuple, env_steps: int, repeats: int | None = None) -> float:
        """Time one piece; its env steps per second."""
        compiled, seconds = compile_seconds(jitted, *call_args)
        jax.block_until_ready(compiled(*call_args))  # warm-up
        median, _ = timed(lambda: compiled(*call_args), repeats or self.repeats)
        self.rows.append(
            {
                "piece": piece,
                "compile_s": seconds,
                "median_s": median,
                "env_steps": env_steps,
                "env_steps_per_s": env_steps / median,
            }
        )
        print(f"# {piece}: {median * 1e3:.2f} ms", flush=True)
        return env_steps / median


def time_acting(pieces: Pieces, pool, model, config) -> float:
    """The env alone (random actions, no model: the env-only ceiling, returned), one policy step, a rollout, GAE."""
    n, t, spec = config.num_envs, config.num_steps, pool.spec
    env_only, actions = env_only_program(pool.step, spec.num_actions, t, n)
    env_sps = pieces.add("env step (x num_steps, no model)", env_only, (pool.handle, actions), n * t)
    obs = jnp.asarray(pool.first_obs)

    @eqx.filter_jit
    def policy_step(model, obs, key):
        logits, value = model(obs)
        action = jax.random.categorical(key, logits).astype(jnp.int32)
        return action, categorical_logprob_entropy(logits, action)[0], value

    pieces.add("policy step", policy_step, (model, obs, jax.random.PRNGKey(1)), n)
    carry = RolloutCarry(pool.handle, obs, init_episode_stats(n))
    rollout_fn = eqx.filter_jit(lambda m, c, k: rollout(m, pool.step, c, num_steps=t, key=k))
    pieces.add("rollout", rollout_fn, (model, carry, jax.random.PRNGKey(2)), n * t)
    rng = np.random.default_rng(0)
    f32 = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    gae = jax.jit(lambda rw, v, d, lv: compute_gae(rw, v, d, lv, gamma=config.gamma, gae_lambda=config.gae_lambda))
    pieces.add("GAE", gae, (f32(t, n), f32(t, n), jnp.asarray(rng.random((t, n)) < 0.01), f32(n)), n * t)
    return env_sps


def random_batch(config, spec) -> Batch:
    """A batch of the run's shapes filled with random frames, actions and targets."""
    rng = np.random.default_rng(0)
    size = config.batch_size
    f32 = lambda: jnp.asarray(rng.normal(size=size), jnp.float32)  # noqa: E731
    frames = jnp.asarray(rng.integers(0, 256, size=(size, *spec.obs_shape)), jnp.dtype(spec.obs_dtype))
    actions = jnp.asarray(rng.integers(0, spec.num_actions, size), jnp.int32)
    return Batch(frames, actions, f32() * 0.1 - 1.4, f32(), f32(), f32())


def time_learning(pieces: Pieces, state, batch: Batch, config, optimizer) -> None:
    """One minibatch's gradient step and the whole update (epochs x minibatches) on a random batch."""
    hyperparameters, sizes = config.agent_hyperparameters(), config.sizes
    minibatch = jax.tree.map(lambda x: x[: config.minibatch_size], batch)

    @eqx.filter_jit
    def minibatch_step(model, opt_state, minibatch):
        grads = eqx.filter_grad(lambda m: model_loss(m, minibatch, hyperparameters)[0])(model)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state

    updates_per_iteration = config.update_epochs * config.num_minibatches
    call = (state.model, state.opt_state, minibatch)
    pieces.add("minibatch update", minibatch_step, call, config.batch_size // updates_per_iteration)
    full_update = eqx.filter_jit(lambda m, o, b, k: update(m, o, b, hyperparameters, sizes=sizes, key=k))
    call = (state.model, state.opt_state, batch, jax.random.PRNGKey(3))
    pieces.add("full update", full_update, call, config.batch_size, repeats=max(2, pieces.repeats // 2))


def main() -> None:
    args = parse_args()
    config = config_from_args(args, total_timesteps=args.num_envs * args.num_steps * 100)
    pool = make_pool(config.env_id, config.num_envs, seed=config.seed)
    spec = pool.spec
    optimizer = make_optimizer(config.agent_hyperparameters(), config.sizes)
    collector = sync_collector(pool, num_steps=config.num_steps)
    conv_impl = resolve_conv_impl(config.conv_impl, spec.obs_shape)  # what "auto" chose
    state = init_state(config, spec, collector, conv_impl=conv_impl)
    pieces = Pieces(args.repeats)
    # Ceilings: the machine's matmul rate, and the env alone (random actions, no model).
    flop_rate = matmul_rate()
    env_sps = time_acting(pieces, pool, state.model, config)
    time_learning(pieces, state, random_batch(config, spec), config, optimizer)
    iteration = eqx.filter_jit(make_iteration(collector, config.sizes))
    iteration_sps = pieces.add("whole iteration", iteration, (state,), config.batch_size, max(2, args.repeats // 2))

    ceilings = model_flops(config, spec, optimizer)
    ceilings.update(matmul_gflops=flop_rate / 1e9, env_only_sps=env_sps)
    limit_sps = compute_limit_sps(ceilings)
    for row in pieces.rows:
        row["fraction_of_limit"] = fraction(row["env_steps_per_s"], limit_sps)
    header = {
        "config": {k: v for k, v in dataclasses.asdict(config).items() if k != "total_timesteps"},
        "environment": environment(conv_impl),
        **ceilings,
        "compute_limit_sps": limit_sps,
        "iteration_sps": iteration_sps,
        "iteration_fraction_of_limit": iteration_sps / limit_sps,
        "iteration_gflops": iteration_sps * ceilings["mflop_per_env_step"] / 1e3,
        "peak_rss_mib": peak_rss_mib(),
        "device_peak_mib": device_memory_mib(),
    }
    del pool
    write_results(pieces.rows, header, args.json)


if __name__ == "__main__":
    main()
