"""The defaults that a kind of task replaces (``preset_for``): CleanRL's ppo.py for vector tasks, gymnax-blines' for
MinAtar's grids, and many iterations per program where the envs run inside it. No jax here (``PPOConfig.for_task``
and the command line read them before jax is imported).
"""

from typing import Any

# CleanRL's ppo.py defaults for vector-observation tasks (CartPole-v1 and friends): only what differs.
# And ppo_eqx's own checkpoint interval: CartPole's iterations take milliseconds, and each segment of envs
# costs a compile, so its checkpoints come every 128k steps rather than Atari's 51k.
VECTOR_PRESET: dict[str, Any] = {
    "total_timesteps": 500_000,
    "num_envs": 4,
    "clip_coef": 0.2,
    "checkpoint_every": 250,
}
# gymnax-blines' PPO for MinAtar (agents/<game>-MinAtar/ppo.yaml), the settings behind its published 10M-step
# returns: 64 envs x 128 steps, 8 minibatches, a constant learning rate of 5e-4, gamma 0.999, the value loss
# clipped; 2 x 256 ReLU MLPs on the flattened grid (ActorCritic's "grid" network).
GRID_PRESET: dict[str, Any] = {
    "total_timesteps": 10_000_000,
    "num_envs": 64,
    "num_steps": 128,
    "num_minibatches": 8,
    "update_epochs": 4,
    "learning_rate": 5e-4,
    "anneal_lr": False,
    "gamma": 0.999,
    "gae_lambda": 0.95,
    "clip_coef": 0.2,
    "clip_vloss": True,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "checkpoint_every": 100,
}
# Envs written in JAX run whole chunks of iterations as one program: a CartPole checkpoint interval (250
# iterations, about a second on a 2-core CPU) at once; MinAtar's iterations take a third of a second there, so 10
# of them, and the progress bar, Ctrl-C and the NaN check answer within seconds.
JAX_ENV_DISPATCH: dict[str, int] = {"vector": 250, "grid": 10}


def preset_for(kind: str, *, state_is_data: bool = False) -> dict[str, Any]:
    """Defaults that replace PPOConfig's for a kind of observation (``EnvSpec.kind``): none for Atari frames,
    CleanRL's ppo.py for vectors, gymnax-blines' for MinAtar grids; on a backend whose envs run in the program
    (``state_is_data``), many iterations per dispatch."""
    preset = {"frames": {}, "vector": VECTOR_PRESET, "grid": GRID_PRESET}[kind]
    dispatch = {"iterations_per_dispatch": JAX_ENV_DISPATCH[kind]} if state_is_data and kind in JAX_ENV_DISPATCH else {}
    return {**preset, **dispatch}
