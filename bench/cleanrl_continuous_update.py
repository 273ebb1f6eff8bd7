"""One update of ppo_eqx's continuous policy against CleanRL's ``ppo_continuous_action.py`` (torch), on the same
parameters, batch and minibatch order.

    python bench/cleanrl_continuous_update.py --torch-python .peers/torch/bin/python

ppo_eqx's side: a ``GaussianActorCritic`` of HalfCheetah's sizes (17 observations, 6 actions), a batch of 2048
transitions drawn at random, CleanRL's continuous preset (32 minibatches, 10 epochs, Adam at 3e-4 with eps 1e-5,
clip 0.2 with the value loss clipped, entropy 0, global norm 0.5, advantages normalised), ``update`` once. The
torch side (a child process of ``--torch-python``, a venv with torch outside this project) builds CleanRL's
``Agent`` layer by layer as that script does, loads the same parameters, and runs that script's minibatch loop
over ppo_eqx's minibatch indices. Both sides' parameters after the 320 steps and the first step's losses are
compared; ``--mutate`` changes ppo_eqx's side (the log standard deviation frozen, the value loss unclipped, the
advantages not normalised) to show that the comparison catches each.
Writes the rows, the machine in a header (``--json``).
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ppo_eqx import AgentHyperparameters, Batch, Hyperparameters, Sizes
from ppo_eqx.core.gaussian import GaussianActorCritic
from ppo_eqx.core.update import make_optimizer, minibatch_indices, torch_model_loss, update
from ppo_eqx.presets import CONTINUOUS_PRESET

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, write_results  # noqa: E402

OBS, ACTIONS, STEPS = 17, 6, 2048
MUTATIONS = ("none", "frozen-log-std", "unclipped-value-loss", "advantages-not-normalised")

TORCH_SIDE = r"""
import sys
import numpy as np
import torch
from torch import nn
from torch.distributions.normal import Normal

torch.use_deterministic_algorithms(True)
data = np.load(sys.argv[1])
h = {k: float(data["h_" + k]) for k in ("lr", "clip", "vf", "ent", "max_grad_norm")}


class Agent(nn.Module):
    # CleanRL's ppo_continuous_action.py agent: critic and actor mean 64-64 tanh MLPs, a log std parameter.
    def __init__(self, obs, actions):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(obs, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
        self.actor_mean = nn.Sequential(
            nn.Linear(obs, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, actions)
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, actions))

    def get_action_and_value(self, x, action):
        mean = self.actor_mean(x)
        probs = Normal(mean, torch.exp(self.actor_logstd.expand_as(mean)))
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


agent = Agent(data["obs"].shape[1], data["actions"].shape[1])
with torch.no_grad():
    for net in ("actor_mean", "critic"):
        for i, layer in enumerate((0, 2, 4)):
            getattr(agent, net)[layer].weight.copy_(torch.from_numpy(data[f"{net}_{i}_w"].T.copy()))
            getattr(agent, net)[layer].bias.copy_(torch.from_numpy(data[f"{net}_{i}_b"]))
    agent.actor_logstd.copy_(torch.from_numpy(data["log_std"][None]))
optimizer = torch.optim.Adam(agent.parameters(), lr=h["lr"], eps=1e-5)
b_obs, b_actions = torch.from_numpy(data["obs"]), torch.from_numpy(data["actions"])
b_logprobs, b_values = torch.from_numpy(data["logprobs"]), torch.from_numpy(data["values"])
b_advantages, b_returns = torch.from_numpy(data["advantages"]), torch.from_numpy(data["returns"])
first = None
for mb_inds in torch.from_numpy(data["indices"]).long():
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
    logratio = newlogprob - b_logprobs[mb_inds]
    ratio = logratio.exp()
    mb_advantages = b_advantages[mb_inds]
    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
    clipped = torch.clamp(ratio, 1 - h["clip"], 1 + h["clip"])
    pg_loss = torch.max(-mb_advantages * ratio, -mb_advantages * clipped).mean()
    newvalue = newvalue.view(-1)
    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
    v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -h["clip"], h["clip"])
    v_loss = 0.5 * torch.max(v_loss_unclipped, (v_clipped - b_returns[mb_inds]) ** 2).mean()
    loss = pg_loss - h["ent"] * entropy.mean() + v_loss * h["vf"]
    if first is None:
        first = [loss.item(), pg_loss.item(), v_loss.item(), entropy.mean().item()]
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), h["max_grad_norm"])
    optimizer.step()
out = {"first": np.array(first), "log_std": agent.actor_logstd.detach().numpy()[0]}
for net in ("actor_mean", "critic"):
    for i, layer in enumerate((0, 2, 4)):
        out[f"{net}_{i}_w"] = getattr(agent, net)[layer].weight.detach().numpy().T
        out[f"{net}_{i}_b"] = getattr(agent, net)[layer].bias.detach().numpy()
np.savez(sys.argv[2], **out)
"""


def parameters(model: GaussianActorCritic) -> dict[str, np.ndarray]:
    """The model's arrays under the torch side's names (weights ``[in, out]``)."""
    found = {"log_std": np.asarray(model.log_std)}
    for net, mlp in (("actor_mean", model.actor), ("critic", model.critic)):
        for i, layer in enumerate(mlp.layers):  # pyright: ignore[reportAttributeAccessIssue]
            found[f"{net}_{i}_w"], found[f"{net}_{i}_b"] = np.asarray(layer.weight), np.asarray(layer.bias)
    return found


def case(mutation: str, torch_python: str, seed: int) -> dict:
    preset = {k: v for k, v in CONTINUOUS_PRESET.items() if k in Hyperparameters.__dataclass_fields__}
    settings = Hyperparameters(**preset)
    if mutation == "unclipped-value-loss":
        settings = Hyperparameters(**{**preset, "clip_vloss": False})
    if mutation == "advantages-not-normalised":
        settings = Hyperparameters(**{**preset, "norm_adv": False})
    hyperparameters = AgentHyperparameters.of([settings])
    sizes = Sizes(1, STEPS, CONTINUOUS_PRESET["num_minibatches"], CONTINUOUS_PRESET["update_epochs"], 488)
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    model = GaussianActorCritic((OBS,), ACTIONS, key=keys[0])
    model = eqx.tree_at(lambda m: m.log_std, model, jnp.full((ACTIONS,), -0.3))  # a trained-looking std
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(STEPS, OBS)).astype(np.float32)
    mean, values = model(jnp.asarray(obs))
    actions = np.asarray(mean) + np.exp(-0.3) * rng.normal(size=(STEPS, ACTIONS)).astype(np.float32)
    logprobs, _, _ = model.evaluate_actions(jnp.asarray(obs), jnp.asarray(actions, jnp.float32))
    advantages = rng.normal(size=STEPS).astype(np.float32)
    returns = (np.asarray(values) + advantages + rng.normal(size=STEPS) * 0.5).astype(np.float32)
    batch = Batch(*(jnp.asarray(x) for x in (obs, actions, logprobs, values, advantages, returns)))
    indices = minibatch_indices(
        STEPS, num_minibatches=sizes.num_minibatches, update_epochs=sizes.update_epochs, key=keys[1]
    )
    start = parameters(model)
    opt_state = make_optimizer(hyperparameters, sizes).init(eqx.filter(model, eqx.is_array))
    trained, _, infos = update(
        model, opt_state, batch, hyperparameters, sizes=sizes, loss=torch_model_loss, key=keys[1]
    )
    if mutation == "frozen-log-std":  # a policy whose standard deviation is not learned
        trained = eqx.tree_at(lambda m: m.log_std, trained, model.log_std)
    with tempfile.TemporaryDirectory() as scratch:
        given, taken = Path(scratch) / "given.npz", Path(scratch) / "taken.npz"
        h = {
            "h_lr": settings.learning_rate,
            "h_clip": settings.clip_coef,
            "h_vf": settings.vf_coef,
            "h_ent": settings.ent_coef,
            "h_max_grad_norm": settings.max_grad_norm,
        }
        np.savez(
            given,
            obs=obs,
            actions=actions.astype(np.float32),
            logprobs=np.asarray(logprobs),
            values=np.asarray(values),
            advantages=advantages,
            returns=returns,
            indices=np.asarray(indices),
            **start,
            **h,
        )
        subprocess.run([torch_python, "-c", TORCH_SIDE, str(given), str(taken)], check=True)
        torch_side = dict(np.load(taken))
    ours = parameters(trained)
    largest = max(float(np.max(np.abs(ours[name] - torch_side[name]))) for name in ours)
    moved = max(float(np.max(np.abs(ours[name] - start[name]))) for name in ours)
    first = [float(infos.loss[0]), float(infos.policy_loss[0]), float(infos.value_loss[0]), float(infos.entropy[0])]
    first_difference = float(np.max(np.abs(np.array(first) - torch_side["first"])))
    return {
        "mutation": mutation,
        "seed": seed,
        "max_abs_parameter_difference": largest,
        "max_abs_parameter_change": moved,
        "first_step_loss_difference": first_difference,
        "equal": largest < TOLERANCE and first_difference < 1e-5,
    }


TOLERANCE = 1e-5
"""Parameters after 320 Adam steps of 3e-4 (each moves up to 0.04): float32 rounding, summed differently by XLA and
torch, stays below this (2e-7 measured); each mutation moves some parameter by 4e-3 or more."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-python", required=True, help="a Python with torch (outside this project)")
    parser.add_argument("--mutate", choices=MUTATIONS, nargs="*", default=list(MUTATIONS))
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = [case(mutation, args.torch_python, seed) for mutation in args.mutate for seed in args.seeds]
    torch_version = subprocess.run(
        [args.torch_python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    write_results(rows, {"environment": environment(None), "torch_version": torch_version}, args.json)
    wrong = [row for row in rows if row["equal"] != (row["mutation"] == "none")]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
