"""A model trained for a short while on one backend scores the same on the other.

Trains Breakout-v5 (CleanRL's settings) on ``--train-on`` for ``--steps`` env steps, then plays ``--episodes``
whole games with the final model on each backend (``ppo_eqx.evaluate``, sampled actions, envs seeded apart from
training's) and compares the two score samples: a two-sided Mann-Whitney U test, and a 95% bootstrap interval
of the difference of the means (10,000 resamples), which should hold 0.

    python bench/backends_trained.py --steps 100000 --episodes 40 --json bench/results/backends_trained.json
"""

import argparse
import time
from pathlib import Path

import jax
import numpy as np
from _common import environment, write_results
from scipy import stats

from ppo_eqx import PPOConfig, Trainer, evaluate, run


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="Breakout-v5")
    parser.add_argument("--train-on", choices=["envpool", "ale"], default="envpool")
    parser.add_argument("--steps", type=int, default=100_000, help="training env steps")
    parser.add_argument("--episodes", type=int, default=40, help="whole games per backend")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args()


def bootstrap_difference(a: np.ndarray, b: np.ndarray, resamples: int = 10_000) -> tuple[float, float]:
    """95% percentile interval of mean(a) - mean(b) over resamples of each sample."""
    rng = np.random.default_rng(0)
    diffs = rng.choice(a, (resamples, a.size)).mean(1) - rng.choice(b, (resamples, b.size)).mean(1)
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high)


def main() -> None:
    args = parse_args()
    config = PPOConfig(env_id=args.env_id, total_timesteps=args.steps, env_backend=args.train_on)
    start = time.perf_counter()
    trainer = Trainer(config)
    try:
        records = list(run(trainer))
        model = trainer.checkpoint().model
    finally:
        trainer.close()
    train_s = time.perf_counter() - start
    returns = {}
    for env_backend in ("envpool", "ale"):
        played = evaluate(
            model, config.replace(env_backend=env_backend), episodes=args.episodes, seed=7, key=jax.random.key(7)
        )
        returns[env_backend] = np.asarray(played.returns, np.float64)
    envpool, ale = returns["envpool"], returns["ale"]
    low, high = bootstrap_difference(envpool, ale)
    row = {
        "env_id": args.env_id,
        "trained_on": args.train_on,
        "train_steps": records[-1]["global_step"],
        "train_final_episodic_return": records[-1]["episodic_return"],
        "episodes": args.episodes,
        "envpool_mean": float(envpool.mean()),
        "ale_mean": float(ale.mean()),
        "envpool_std": float(envpool.std()),
        "ale_std": float(ale.std()),
        "difference_ci95_low": low,
        "difference_ci95_high": high,
        "mann_whitney_p": float(stats.mannwhitneyu(envpool, ale, alternative="two-sided").pvalue),
        "zero_in_interval": low <= 0 <= high,
    }
    header = {
        "environment": environment(model.conv_impl),
        "train_s": train_s,
        "returns": {k: v.tolist() for k, v in returns.items()},
    }
    write_results([row], header, args.json)


if __name__ == "__main__":
    main()
