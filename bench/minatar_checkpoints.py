"""gymnax-blines' published MinAtar PPO agents, played on the gymnax installed here by ppo-eqx's evaluator.

The 10M-step returns issue 25 quotes (Breakout 28, SpaceInvaders 131, ...) are those of gymnax-blines' PPO
checkpoints (``agents/<game>/ppo.pkl``, June 2022, each saved with its own evaluation log). Their network is
ppo-eqx's ``grid`` one (two 2 x 256 ReLU MLPs on the flattened grid), so the weights load into ``ActorCritic``
unchanged and play through ``ppo_eqx.evaluate``, as ``ppo-eqx eval`` plays our own agents: the published
figure's agent, measured as ours are, on the env we train on.

    python bench/minatar_checkpoints.py --gymnax-blines .peers/gymnax-blines \\
        --blines-python .peers/gymnax/bin/python --json bench/results/minatar_checkpoints.json

``--blines-python`` unpickles the checkpoints (it needs flax and dotmap; ``peer_runners/read_blines_checkpoint.py``
writes their arrays as .npz); this Python needs ``ppo_eqx[gymnax]``. Nothing of gymnax-blines is imported here.
Reported per game: the published return, the checkpoint's own last logged evaluation, and its mean return over
``--episodes`` episodes (sampled actions) for each ``--seeds`` evaluation seed.
"""

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
if str(REPO_ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO_ROOT))

from ppo_eqx_bench.anchors import PUBLISHED_10M  # noqa: E402

READER = HERE / "peer_runners" / "read_blines_checkpoint.py"
ACTOR = ("Dense_0", "Dense_1", "Dense_2")
CRITIC = ("critic_fc_1", "critic_fc_2", "critic_fc_v")
"""gymnax-blines' layer names (``CategoricalSeparateMLP``): the actor's three dense layers, then the critic's."""


class CheckpointError(Exception):
    """Why a checkpoint cannot be played; the message is one line."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gymnax-blines", type=Path, required=True, help="a gymnax-blines checkout (holds agents/)")
    parser.add_argument("--blines-python", type=Path, required=True, help="a Python with flax, dotmap and numpy")
    parser.add_argument("--games", nargs="+", default=["Breakout-MinAtar", "SpaceInvaders-MinAtar"])
    parser.add_argument("--episodes", type=int, default=164, help="per evaluation seed (default: %(default)s)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="evaluation seeds")
    parser.add_argument("--json", type=Path, help="write the results here")
    return parser.parse_args(argv)


def read_checkpoint(checkpoint: Path, python: Path, workdir: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The checkpoint's dense arrays and evaluation log, unpickled by ``python`` (the reader runner)."""
    out = workdir / checkpoint.parent.name
    result = subprocess.run([str(python), str(READER), str(checkpoint), str(out)], capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise CheckpointError(f"{python} could not read {checkpoint}: {last}")
    with np.load(out.with_suffix(".npz")) as arrays:
        weights = {name: arrays[name] for name in arrays.files}
    return weights, json.loads(out.with_suffix(".json").read_text())


def blines_model(weights: Mapping[str, np.ndarray], obs_shape: tuple[int, ...], num_actions: int) -> Any:
    """ppo-eqx's ``grid`` ActorCritic holding gymnax-blines' weights (flax's ``kernel`` is ``[in, out]``, as our
    ``Dense.weight``)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from ppo_eqx.core.networks import ActorCritic

    model = ActorCritic(obs_shape, num_actions, kind="grid", key=jax.random.key(0))
    for part, names in (("actor", ACTOR), ("critic", CRITIC)):
        for index, name in enumerate(names):
            for field in ("weight", "bias"):
                array = weights.get(f"{name}/{'kernel' if field == 'weight' else 'bias'}")
                old = getattr(getattr(model, part).layers[index], field)
                if array is None or array.shape != old.shape:
                    found = "missing" if array is None else f"of shape {list(array.shape)}"
                    raise CheckpointError(
                        f"{name}'s {field} is {found}; allowed: shape {list(old.shape)} (the {part}'s layer {index} "
                        f"for observations {list(obs_shape)} and {num_actions} actions)"
                    )
                model = eqx.tree_at(
                    lambda m, part=part, index=index, field=field: getattr(getattr(m, part).layers[index], field),
                    model,
                    jnp.asarray(array, jnp.float32),
                )
    return model


def play(env_id: str, weights: Mapping[str, np.ndarray], episodes: int, seeds: Sequence[int]) -> list[float]:
    """Mean return over ``episodes`` episodes for each evaluation seed: ``ppo_eqx.evaluate``, sampled actions."""
    from ppo_eqx import PPOConfig, evaluate
    from ppo_eqx.core.envs import backend
    from ppo_eqx.host.evaluate import eval_key

    config = PPOConfig.for_task(env_id, "gymnax")
    spec = backend("gymnax").spec(env_id)
    model = blines_model(weights, spec.obs_shape, spec.num_actions)
    means = []
    for seed in seeds:
        key = eval_key(seed)  # as `ppo-eqx eval --seed SEED`
        played = evaluate(model, config, episodes=episodes, seed=seed, key=key)
        means.append(float(np.mean(played.returns)))
    return means


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from importlib.metadata import version

    rows = []
    try:
        with tempfile.TemporaryDirectory() as workdir:
            for env_id in args.games:
                checkpoint = args.gymnax_blines / "agents" / env_id / "ppo.pkl"
                if not checkpoint.is_file():
                    raise CheckpointError(f"{checkpoint} does not exist; allowed: a game of gymnax-blines' agents/")
                weights, log = read_checkpoint(checkpoint, args.blines_python, Path(workdir))
                means = play(env_id, weights, args.episodes, args.seeds)
                rows.append(
                    {
                        "env_id": env_id,
                        "published_return": PUBLISHED_10M.get(env_id),
                        "checkpoint_log_last_return": log["log_return"][-1],
                        "checkpoint_log_last_step": log["log_steps"][-1],
                        "ppo_eqx_eval_returns": means,
                        "ppo_eqx_eval_mean": float(np.mean(means)),
                        "episodes_per_seed": args.episodes,
                        "eval_seeds": args.seeds,
                        "checkpoint_log": log,
                    }
                )
                print(
                    f"{env_id}: published {PUBLISHED_10M.get(env_id)}, its checkpoint's last logged evaluation "
                    f"{log['log_return'][-1]:.1f}; played here ({args.episodes} episodes x {len(args.seeds)} seeds): "
                    + ", ".join(f"{mean:.1f}" for mean in means),
                    flush=True,
                )
    except CheckpointError as error:
        print(f"minatar_checkpoints.py: {error}", file=sys.stderr)
        return 1
    if args.json:
        result = {
            "rows": rows,
            "gymnax_version": version("gymnax"),
            "jax_version": version("jax"),
            "python_version": platform.python_version(),
            "command": " ".join(
                ["python", "bench/minatar_checkpoints.py", *(argv if argv is not None else sys.argv[1:])]
            ),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"written {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
