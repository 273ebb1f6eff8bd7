"""``SplitPlacement``: the rollout compiled for one device (the host's CPU), the learning for another (the
accelerator), the batch moved once an iteration and the parameters back once.

On a GPU machine the one-program iteration steps EnvPool's envs from inside the GPU program: every env step is a
round trip (EnvPool's XLA call copies the actions to the host, waits for the envs, and copies the observations
back, a stream synchronisation each way). Here the rollout (the env step and the policy's forward pass, GAE) runs
on the CPU, where EnvPool's envs live, and only the update runs on the accelerator. It computes what the
one-program iteration computes (``core.iteration.make_stages``: the same stages, the same keys), to float32
rounding (each program is fused apart, and the rollout's convolutions may take the CPU's route: ``rollout_conv``).
"""

from typing import Any, cast

import equinox as eqx
import jax
from jax import Device

from ..core.collect import Collector
from ..core.hyperparameters import AgentHyperparameters, Sizes
from ..core.iteration import Metrics, make_stages
from ..core.networks import ActorCritic, ConvRoute
from ..core.state import Checkpoint, TrainState
from ..core.update import Loss, OptimizerFactory, make_optimizer, model_loss
from .compiled import own_jit
from .fresh import EnvShare
from .kernel_build import ready


class SplitPlacement:
    """``Placement``: the rollout on ``rollout_device``, the learning on ``learn_device``; every env in this
    process. ``rollout_conv``: the route the rollout's convolutions take (default: the model's own)."""

    share = EnvShare()

    def __init__(self, rollout_device: Device, learn_device: Device, *, rollout_conv: ConvRoute | None = None):
        self.rollout_device, self.learn_device, self.rollout_conv = rollout_device, learn_device, rollout_conv
        if rollout_conv is not None:
            ready(rollout_conv)

    def place(self, checkpoint: Checkpoint, collector: Collector, hyperparameters: AgentHyperparameters) -> TrainState:
        carry = jax.device_put(collector.restore(checkpoint.envs), self.rollout_device)
        model, opt_state, iteration, hyperparameters = jax.device_put(
            (checkpoint.model, checkpoint.opt_state, checkpoint.iteration, hyperparameters), self.learn_device
        )
        key = jax.device_put(checkpoint.key, self.rollout_device)
        return TrainState(model, opt_state, carry, key, iteration, hyperparameters)

    def program(
        self,
        collector: Collector,
        sizes: Sizes,
        *,
        loss: Loss = model_loss,
        optimizer: OptimizerFactory = make_optimizer,
    ) -> "_SplitProgram":
        return _SplitProgram(self, collector, sizes, loss, optimizer)

    def checkpoint(self, state: TrainState, collector: Collector) -> Checkpoint:
        return Checkpoint(state.model, state.opt_state, state.key, collector.save(state.carry), state.iteration)

    def rollout_record(self) -> dict[str, Any]:
        return {
            "on": "host",
            "rollout_device": f"{self.rollout_device.platform}:{self.rollout_device.id}",
            "rollout_conv_impl": self.rollout_conv,
            "learn_device": f"{self.learn_device.platform}:{self.learn_device.id}",
        }


class _SplitProgram:
    """One iteration a call (``Program.length`` 1): the collect program on the rollout device, the learn program
    on the learning device, each compiled once (``own_jit``)."""

    length = 1
    host_loop = True

    def __init__(
        self, placement: SplitPlacement, collector: Collector, sizes: Sizes, loss: Loss, optimizer: OptimizerFactory
    ):
        self.placement, self.collector, self.sizes = placement, collector, sizes
        self._stages = make_stages(collector, sizes, loss=loss, optimizer=optimizer)
        # What each program reuses: the carry and the key (collect, prime), the model, optimizer state, batch and
        # key (learn); never the model's copy for the rollout, which is the model itself where both devices are one.
        self._collect = own_jit(self._stages.collect, donate=(2, 3))
        self._learn = own_jit(self._stages.learn, donate=(1, 2, 3, 4))
        self._prime = own_jit(self._prime_fn, donate=(1, 2))
        self._rollout_hyperparameters: AgentHyperparameters | None = None

    def _prime_fn(self, model: Any, carry: Any, key: Any) -> tuple[Any, Any]:
        if self.sizes.num_agents == 1:
            return self.collector.prime(model, carry, key)
        axes = jax.tree.map(lambda x: 0 if eqx.is_array(x) else None, (model, carry, key))
        if self.collector.shared_handle:
            axes = eqx.tree_at(lambda a: a[1].handle, axes, None, is_leaf=lambda x: x is None)
        return eqx.filter_vmap(self.collector.prime, in_axes=axes, out_axes=axes[1:])(model, carry, key)

    def _on_rollout_device(self, state: TrainState, *, example: bool = False) -> tuple[AgentHyperparameters, Any]:
        """The hyperparameters (moved once; an ``example`` state's are not kept: they are zeros) and a copy of
        the model on the rollout device, with its route."""
        placement = self.placement
        hyperparameters = self._rollout_hyperparameters
        if hyperparameters is None:
            hyperparameters = jax.device_put(state.hyperparameters, placement.rollout_device)
            if not example:
                self._rollout_hyperparameters = hyperparameters
        model = jax.device_put(state.model, placement.rollout_device)
        route = placement.rollout_conv
        if isinstance(model, ActorCritic) and route is not None and route != model.conv_impl:
            model = model.with_conv_impl(cast(ConvRoute, route))
        return hyperparameters, model

    def __call__(self, state: TrainState, count: int = 1) -> tuple[TrainState, Metrics]:
        hyperparameters, model = self._on_rollout_device(state)
        carry, batch, key, update_key, episode = self._collect(hyperparameters, model, state.carry, state.key)
        batch, update_key = jax.device_put((batch, update_key), self.placement.learn_device)
        model, opt_state, learned = self._learn(state.hyperparameters, state.model, state.opt_state, batch, update_key)
        next_state = TrainState(model, opt_state, carry, key, state.iteration + 1, state.hyperparameters)
        return next_state, {**episode, **learned}

    def prime(self, state: TrainState) -> TrainState:
        _, model = self._on_rollout_device(state, example=True)
        carry, key = jax.device_put((state.carry, state.key), self.placement.rollout_device)  # a new segment's
        carry, key = self._prime(model, carry, key)
        return eqx.tree_at(lambda s: (s.carry, s.key), state, (carry, key))

    def compile(self, state: TrainState) -> None:
        """Compile the three programs for states shaped and placed as ``state`` (an example: its values unused)."""
        rollout, learning = self.placement.rollout_device, self.placement.learn_device
        hyperparameters, model = self._on_rollout_device(state, example=True)
        carry, key = jax.device_put((state.carry, state.key), rollout)
        self._prime.compile(model, carry, key)
        self._collect.compile(hyperparameters, model, carry, key)
        _, batch, _, update_key, _ = jax.eval_shape(self._stages.collect, hyperparameters, model, carry, key)
        on_learning = jax.sharding.SingleDeviceSharding(learning)
        batch, update_key = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_learning), (batch, update_key)
        )
        learn_state = jax.device_put((state.hyperparameters, state.model, state.opt_state), learning)
        self._learn.compile(*learn_state, batch, update_key)
