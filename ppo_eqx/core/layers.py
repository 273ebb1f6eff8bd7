"""The layers every model is built of: ``Dense``, started as CleanRL's ``layer_init`` or as gymnax-blines' flax
agents start (``NetworkInit``)."""

import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray


def _orthogonal(key: PRNGKeyArray, shape: tuple[int, ...], scale: float) -> Float[Array, "..."]:
    """CleanRL's ``layer_init``: an orthogonal (fan-in x fan-out) matrix times ``scale``."""
    fan_out = shape[-1]
    matrix = jax.nn.initializers.orthogonal(scale)(key, (math.prod(shape[:-1]), fan_out), jnp.float32)
    return matrix.reshape(shape)


NetworkInit = Literal["cleanrl", "gymnax-blines"]
"""How a model's layers start. ``"cleanrl"``: CleanRL's ``layer_init``, an orthogonal matrix (fan-in x fan-out)
times the layer's gain, zero biases. ``"gymnax-blines"``: as gymnax-blines' flax agents start, flax's default
kernels (LeCun normal: variance 1 / fan-in, truncated at two standard deviations) and biases uniform in
``[0, GYMNAX_BLINES_BIAS_HIGH)``; the gains play no part."""
GYMNAX_BLINES_BIAS_HIGH = 0.05


def _init_layer(
    key: PRNGKeyArray, shape: tuple[int, ...], scale: float, init: NetworkInit
) -> tuple[Float[Array, "..."], Float[Array, " fan_out"]]:
    """A layer's weight of ``shape`` (fan-in axes first, fan-out last) and its bias, started as ``init`` says."""
    if init == "cleanrl":
        return _orthogonal(key, shape, scale), jnp.zeros(shape[-1:], jnp.float32)
    weight_key, bias_key = jax.random.split(key)
    weight = jax.nn.initializers.lecun_normal(in_axis=tuple(range(len(shape) - 1)), out_axis=-1)(
        weight_key, shape, jnp.float32
    )
    return weight, jax.random.uniform(bias_key, shape[-1:], jnp.float32, 0.0, GYMNAX_BLINES_BIAS_HIGH)


class Dense(eqx.Module):
    weight: Float[Array, "fan_in fan_out"]
    bias: Float[Array, " fan_out"]

    def __init__(self, fan_in: int, fan_out: int, scale: float, *, init: NetworkInit = "cleanrl", key: PRNGKeyArray):
        self.weight, self.bias = _init_layer(key, (fan_in, fan_out), scale, init)

    def __call__(self, x: Float[Array, "B fan_in"]) -> Float[Array, "B fan_out"]:
        return x @ self.weight + self.bias
