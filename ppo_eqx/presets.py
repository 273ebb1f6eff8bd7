"""The defaults that a kind of task replaces (``preset_for``): CleanRL's ppo.py for vector tasks, gymnax-blines' for
MinAtar's grids, and many iterations per program where the envs run inside it. No jax here (``PPOConfig.for_task``
and the command line read them before jax is imported).
"""

from typing import Any

from .errors import ConfigError

# CleanRL's ppo.py defaults for vector-observation tasks (CartPole-v1 and friends): only what differs. ppo.py
# clips the value loss and standardises each minibatch's advantages by torch's std() (the sample's:
# "cleanrl-torch"); without the clip, 16 CartPole agents ended at a mean return of 440, with it 496 (PureJaxRL's
# ppo.py, which clips, 488). And ppo_eqx's own checkpoint interval: CartPole's iterations take milliseconds, and
# each segment of envs costs a compile, so its checkpoints come every 128k steps rather than Atari's 51k.
VECTOR_PRESET: dict[str, Any] = {
    "total_timesteps": 500_000,
    "num_envs": 4,
    "clip_coef": 0.2,
    "clip_vloss": True,
    "loss": "cleanrl-torch",
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
# CleanRL's ppo_continuous_action.py (MuJoCo, 1M steps): one env of 2048 steps, 32 minibatches, 10 epochs, a
# learning rate of 3e-4 annealed, the value loss clipped, no entropy bonus, observations and rewards normalised, the
# advantages standardised by torch's std() (the sample's: "cleanrl-torch").
CONTINUOUS_PRESET: dict[str, Any] = {
    "total_timesteps": 1_000_000,
    "learning_rate": 3e-4,
    "num_envs": 1,
    "num_steps": 2048,
    "anneal_lr": True,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "num_minibatches": 32,
    "update_epochs": 10,
    "norm_adv": True,
    "clip_coef": 0.2,
    "clip_vloss": True,
    "ent_coef": 0.0,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "normalize_obs": True,
    "normalize_reward": True,
    "loss": "cleanrl-torch",
    "checkpoint_every": 50,
}
# ``--preset fast`` for continuous tasks: CleanRL's update (its batch of 2048 steps, 32 minibatches, 10 epochs, its
# loss and normalisation) on 16 envs of 128 steps stepped at once, over more steps, the value loss not clipped:
# chosen by measurement for the wall time to CleanRL's 1M-step return on a 2-core CPU (docs/performance.md,
# "Continuous control"). Without the clip Hopper-v4's five seeds ended at 2,613 +- 402 where they ended at 2,064 +-
# 375 with it (the clip holds the value function back; Andrychowicz et al. 2021 found it hurts too).
CONTINUOUS_FAST_PRESET: dict[str, Any] = {
    "total_timesteps": 2_000_000,
    "num_envs": 16,
    "num_steps": 128,
    "clip_vloss": False,
}
# ``--preset tpu`` for Atari frames: EnvPool's envs stepped from the host by actor threads (host-envs; a TPU's
# programs cannot hold EnvPool's XLA step), 64 envs x 32 steps in 8 minibatches. The envs: at 8 the chip's round trip
# (1.4 ms a policy call) leaves the host idle; 64 reach more of the host's ceiling (EnvPool's own step: 5,063 env
# steps/s at 8 envs, 12,115 at 64 on the lent TPU v5e's 13 cores). The steps and minibatches keep CleanRL's update:
# minibatches of 256, 16 gradient steps per 1,024 env steps, so 10M steps make as many updates as CleanRL's.
# Actor threads: host-envs' default (one per 8 envs, at most a third of the cores: 4 on 13). Measured on the chip
# and on a CPU in docs/performance.md ("One TPU v5e").
TPU_FRAMES_PRESET: dict[str, Any] = {
    "num_envs": 64,
    "num_steps": 32,
    "num_minibatches": 8,
    "rollout_on": "host-envs",
}
PRESETS = ("cleanrl", "fast", "tpu")
"""``PPOConfig.preset``'s values: the defaults a task takes (``preset_for``)."""
PRESET_HELP = (
    "the defaults a task takes before these flags: cleanrl (CleanRL's script for its kind: Atari, vector, "
    "continuous; gymnax-blines' for MinAtar), fast (continuous actions: CleanRL's update, value loss unclipped, "
    "more envs stepped at once, more steps: chosen for the wall time to CleanRL's return) or tpu (Atari: 64 envs "
    "x 32 steps, 8 minibatches, host-envs: CleanRL's update at a TPU host's pace) (ppo_eqx's own)"
)
# CleanRL's ppo_atari_lstm.py, what it sets apart from ppo_atari_envpool_xla_jax.py: the value loss clipped (its
# torch script honours the flag) and the advantages standardised by torch's std() ("cleanrl-torch"). It stacks one
# frame where EnvPool's Atari tasks stack four: ppo_eqx keeps EnvPool's four (docs/design.md's deviations).
LSTM_FRAMES_PRESET: dict[str, Any] = {"clip_vloss": True, "loss": "cleanrl-torch"}
# Envs written in JAX run whole chunks of iterations as one program: a CartPole checkpoint interval (250
# iterations, about a second on a 2-core CPU) at once; MinAtar's iterations take a third of a second there, so 10
# of them, and the progress bar, Ctrl-C and the NaN check answer within seconds.
JAX_ENV_DISPATCH: dict[str, int] = {"vector": 250, "grid": 10, "continuous": 10}


AUTO_ROLLOUT: tuple[tuple[str, str], ...] = (
    ("device", "for a recurrent policy"),
    ("host-envs", "for EnvPool's continuous tasks"),
    ("host", "on a device whose programs cannot hold the env step (EnvPool's on a TPU v5e: the host route measured "
     "fastest for the device's kind; host-envs on a kind not measured)"),
    ("device", "otherwise, unless a measurement of the device's kind names another"),
)  # fmt: skip
"""``rollout_on="auto"``'s rules, (the route, when), in the order ``host.placement.rollout_place`` applies them;
``--rollout-on``'s help is made from them (``auto_rollout_help``)."""


def auto_rollout_help() -> str:
    return "; ".join(f"{route} {when}" for route, when in AUTO_ROLLOUT)


def preset_for(
    kind: str,
    *,
    state_is_data: bool = False,
    continuous: bool = False,
    network: str = "feedforward",
    preset: str = "cleanrl",
) -> dict[str, Any]:
    """Defaults that replace PPOConfig's for a kind of observation (``EnvSpec.kind``): none for Atari frames (with
    ``network`` "lstm", CleanRL's ppo_atari_lstm.py's), CleanRL's ppo.py for vectors, gymnax-blines' for MinAtar
    grids, and for ``continuous`` actions CleanRL's ppo_continuous_action.py (``preset`` "fast": with
    ``CONTINUOUS_FAST_PRESET`` over it, continuous tasks only; "tpu": ``TPU_FRAMES_PRESET``, Atari frames and the
    feedforward network only); on a backend whose envs run in the program (``state_is_data``), many iterations
    per dispatch."""
    if preset == "fast" and not continuous:
        raise ConfigError(
            f"preset='fast' is for tasks of continuous actions (MuJoCo's); a task of {kind} observations and "
            "discrete actions takes CleanRL's; allowed: cleanrl"
        )
    kind = "continuous" if continuous else kind
    if preset == "tpu" and (kind != "frames" or state_is_data or network != "feedforward"):
        task = f"{kind} observations{' stepped in the program' if state_is_data else ''}, network={network!r}"
        raise ConfigError(
            f"preset='tpu' is for Atari frames stepped from the host (EnvPool's) with the feedforward network; this "
            f"task has {task}; allowed: cleanrl{', fast' if continuous else ''}"
        )
    chosen = {"fast": CONTINUOUS_FAST_PRESET, "tpu": TPU_FRAMES_PRESET}.get(preset, {})
    over = {**chosen, "preset": preset} if chosen else {}
    frames = LSTM_FRAMES_PRESET if network == "lstm" else {}
    presets = {"frames": frames, "vector": VECTOR_PRESET, "grid": GRID_PRESET, "continuous": CONTINUOUS_PRESET}
    dispatch = {"iterations_per_dispatch": JAX_ENV_DISPATCH[kind]} if state_is_data and kind in JAX_ENV_DISPATCH else {}
    return {**presets[kind], **over, **dispatch}
