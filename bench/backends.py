"""EnvPool and ALE's vector env side by side: random-policy scores, env-only and training steps/s, in one run.

1. Scores. With CleanRL's 30 no-ops at reset each library draws them from its own random stream, so the two
   cannot play the same games; instead each plays ``--episodes`` whole games (all lives) of every game in
   ``--games`` with uniformly random actions, and the two samples of raw scores (and of lengths in agent
   steps) are compared with a two-sided Mann-Whitney U test and a Kolmogorov-Smirnov test (scipy). The power
   is stated as the smallest shift of the mean, in standard deviations of the scores, that the U test finds
   with probability 0.8 at the Bonferroni level 0.05 / games (normal approximation, asymptotic relative
   efficiency 3/pi against the t test).
2. Env-only steps/s of both backends (a jitted ``lax.scan`` of env steps with random actions), then training
   steps/s (``Trainer`` on each backend, ``--warmup`` then ``--iterations`` timed iterations).

    python bench/backends.py --episodes 60 --json bench/results/backends.json
"""

import argparse
import math
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _common import add_config_args, config_from_args, env_only_sps, environment, write_results
from scipy import stats

from ppo_eqx import Trainer
from ppo_eqx.core.envs import backend

BACKENDS = ("envpool", "ale")
GAMES = ("Breakout-v5", "SpaceInvaders-v5", "Seaquest-v5", "Qbert-v5", "MsPacman-v5")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--games", nargs="+", default=list(GAMES), help="games of the score comparison")
    parser.add_argument("--episodes", type=int, default=100, help="whole games per game and backend")
    parser.add_argument("--score-envs", type=int, default=8, help="envs playing the random games at once")
    parser.add_argument("--warmup", type=int, default=2, help="training iterations before timing")
    parser.add_argument("--iterations", type=int, default=3, help="timed training iterations")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the env-only measurement")
    return parser.parse_args()


def random_games(env_backend: str, env_id: str, episodes: int, num_envs: int, chunk: int = 256) -> dict[str, list]:
    """Raw scores and lengths (agent steps) of the first ``episodes`` whole games of uniformly random play."""
    pool = backend(env_backend).make(env_id, [1000 + i for i in range(num_envs)])

    @jax.jit
    def play(handle: Any, key: jax.Array) -> tuple[Any, tuple[jax.Array, jax.Array]]:
        def step(handle: Any, key: jax.Array) -> tuple[Any, tuple[jax.Array, jax.Array]]:
            actions = jax.random.randint(key, (num_envs,), 0, pool.spec.num_actions, jnp.int32)
            handle, out = pool.step(handle, actions)
            return handle, (out.raw_reward, out.game_over)

        return jax.lax.scan(step, handle, jax.random.split(key, chunk))

    scores: list[float] = []
    lengths: list[int] = []
    running, steps = np.zeros(num_envs), np.zeros(num_envs, int)
    handle, key = pool.handle, jax.random.key(0)
    while len(scores) < episodes:
        key, play_key = jax.random.split(key)
        handle, (rewards, game_overs) = play(handle, play_key)
        for reward, game_over in zip(np.asarray(rewards), np.asarray(game_overs), strict=True):
            running, steps = running + reward, steps + 1
            scores += running[game_over].tolist()
            lengths += steps[game_over].tolist()
            running[game_over], steps[game_over] = 0.0, 0
    pool.close()
    return {"scores": scores[:episodes], "lengths": lengths[:episodes]}


def detectable_shift_sd(n: int, alpha: float, power: float = 0.8) -> float:
    """The mean shift (in standard deviations) that a two-sided U test on two samples of ``n`` finds with
    probability ``power`` at level ``alpha`` (the t test's, over the U test's efficiency of 3/pi)."""
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return float(z * math.sqrt(2 / n) / math.sqrt(3 / math.pi))


def compare_scores(games: list[str], episodes: int, num_envs: int) -> list[dict[str, Any]]:
    alpha = 0.05 / len(games)
    rows = []
    for env_id in games:
        start = time.perf_counter()
        played = {name: random_games(name, env_id, episodes, num_envs) for name in BACKENDS}
        envpool_scores, ale_scores = (np.asarray(played[name]["scores"]) for name in BACKENDS)
        envpool_lengths, ale_lengths = (np.asarray(played[name]["lengths"]) for name in BACKENDS)
        pooled_sd = float(np.sqrt((envpool_scores.var(ddof=1) + ale_scores.var(ddof=1)) / 2))
        shift = detectable_shift_sd(episodes, alpha)
        rows.append(
            {
                "env_id": env_id,
                "episodes": episodes,
                "envpool_mean": float(envpool_scores.mean()),
                "ale_mean": float(ale_scores.mean()),
                "envpool_sd": float(envpool_scores.std(ddof=1)),
                "ale_sd": float(ale_scores.std(ddof=1)),
                "score_u_p": float(stats.mannwhitneyu(envpool_scores, ale_scores).pvalue),
                "score_ks_p": float(stats.ks_2samp(envpool_scores, ale_scores).pvalue),
                "agree_at_alpha": bool(stats.mannwhitneyu(envpool_scores, ale_scores).pvalue >= alpha),
                "detectable_shift_sd": shift,
                "detectable_shift_score": shift * pooled_sd,
                "envpool_length_mean": float(envpool_lengths.mean()),
                "ale_length_mean": float(ale_lengths.mean()),
                "length_u_p": float(stats.mannwhitneyu(envpool_lengths, ale_lengths).pvalue),
                "seconds": time.perf_counter() - start,
                "envpool_scores": played["envpool"]["scores"],
                "ale_scores": played["ale"]["scores"],
            }
        )
        row = rows[-1]
        print(
            f"# {env_id}: envpool {row['envpool_mean']:.1f} ale {row['ale_mean']:.1f} (U p={row['score_u_p']:.3f}, "
            f"KS p={row['score_ks_p']:.3f}; lengths {row['envpool_length_mean']:.0f} vs {row['ale_length_mean']:.0f}, "
            f"p={row['length_u_p']:.3f}) in {row['seconds']:.0f} s",
            flush=True,
        )
    return rows


def speeds(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name in BACKENDS:
        config = config_from_args(args, env_backend=name)
        pool = backend(name).make(config.env_id, [config.seed + i for i in range(config.num_envs)])
        spec = pool.spec
        env_sps = env_only_sps(
            pool.step, pool.handle, spec.num_actions, config.num_steps, config.num_envs, args.repeats
        )
        pool.close()
        trainer = Trainer(config)
        compile_s = trainer.compile()
        for _ in range(args.warmup):
            trainer.dispatch()
        jax.block_until_ready(trainer.state)
        step_times = []
        for _ in range(args.iterations):  # each iteration timed to its end: the loop's records are not blocked
            start = time.perf_counter()
            trainer.dispatch()
            jax.block_until_ready(trainer.state)
            step_times.append(time.perf_counter() - start)
        trainer.close()
        train_sps = config.batch_size * len(step_times) / sum(step_times)
        rows.append(
            {
                "env_backend": name,
                "env_id": config.env_id,
                "num_envs": config.num_envs,
                "num_steps": config.num_steps,
                "env_only_sps": env_sps,
                "train_sps": train_sps,
                "train_median_sps": config.batch_size / statistics.median(step_times),
                "fraction_of_env_only": train_sps / env_sps,
                "compile_s": compile_s,
                "conv_impl": trainer.state.model.conv_impl,
            }
        )
        print(f"# {name}: env-only {env_sps:.0f} steps/s, training {train_sps:.0f} steps/s", flush=True)
    return rows


def main() -> None:
    args = parse_args()
    scores = compare_scores(args.games, args.episodes, args.score_envs)
    speed_rows = speeds(args)
    header = {
        "environment": environment(None),  # each speed row names its conv_impl
        "score_test": "two-sided Mann-Whitney U (and KS) on raw random-policy scores of whole games",
        "bonferroni_alpha": 0.05 / len(args.games),
        "power": 0.8,
        "scores": scores,
        "training_iterations_timed": args.iterations,
    }
    write_results(
        speed_rows + [{k: v for k, v in row.items() if not k.endswith("_scores")} for row in scores],
        header,
        args.json,
    )


if __name__ == "__main__":
    main()
