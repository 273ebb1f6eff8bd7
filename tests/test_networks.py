from typing import get_args

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_eqx import ActorCritic, AgentHyperparameters, Batch, Hyperparameters, model_loss
from ppo_eqx.config import NETWORK_INITS
from ppo_eqx.core.networks import Conv, Dense, NetworkInit
from ppo_eqx.host import kernel_build

from .conv_reference import ATARI_SHAPE, needs_kernel, numpy_conv

pytestmark = pytest.mark.unit


@pytest.mark.compile
@settings(max_examples=12)  # NumPy's loops over 20 x 20 outputs are slow; 6 layer shapes
@given(st.sampled_from([(8, 4, 84), (8, 4, 30), (4, 2, 20), (4, 2, 11), (3, 1, 9), (2, 2, 7)]), st.integers(0, 99))
def test_conv_matmul_and_xla_match_numpy(layer, seed):
    size, stride, width = layer
    rng = np.random.default_rng(seed)
    conv = Conv(3, 5, size, stride, 1.0, key=jax.random.PRNGKey(seed))
    conv = eqx.tree_at(lambda c: c.bias, conv, jnp.asarray(rng.normal(size=5), jnp.float32))
    x = rng.normal(size=(2, width, width, 3)).astype(np.float32)
    expected = numpy_conv(x, np.asarray(conv.weight, np.float64), np.asarray(conv.bias, np.float64), stride)
    for impl in ("matmul", "xla"):
        np.testing.assert_allclose(conv(jnp.asarray(x), impl), expected, rtol=1e-4, atol=1e-4)


def _batch(model: ActorCritic, obs_shape, num_actions: int, size: int, seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    if len(obs_shape) == 3:
        obs = jnp.asarray(rng.integers(0, 256, size=(size, *obs_shape), dtype=np.uint8))
    else:
        obs = jnp.asarray(rng.normal(size=(size, *obs_shape)), jnp.float32)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return Batch(
        obs,
        jnp.asarray(rng.integers(0, num_actions, size), jnp.int32),
        f32(rng.normal(size=size) - 1.5),
        f32(rng.normal(size=size)),
        f32(rng.normal(size=size)),
        f32(rng.normal(size=size)),
    )


@pytest.mark.parametrize(
    "impl",
    [
        pytest.param("matmul", marks=pytest.mark.compile),
        pytest.param("kernel", marks=[pytest.mark.subprocess, needs_kernel]),
    ],
)
def test_faster_convolutions_give_the_same_losses_and_gradients_as_xla(impl):
    if impl == "kernel":
        kernel_build.load()  # what resolving the route does before a model of it runs
    model = ActorCritic(ATARI_SHAPE, 6, conv_impl=impl, key=jax.random.PRNGKey(3))
    assert model.conv_impl == impl
    reference = ActorCritic(ATARI_SHAPE, 6, conv_impl="xla", key=jax.random.PRNGKey(3))  # same parameters
    batch = _batch(model, ATARI_SHAPE, 6, 32, 0)
    loss = eqx.filter_jit(
        eqx.filter_value_and_grad(lambda m, b: model_loss(m, b, AgentHyperparameters.of([Hyperparameters()]))[0])
    )
    value, grads = loss(model, batch)
    ref_value, ref_grads = loss(reference, batch)
    assert float(value) == pytest.approx(float(ref_value), rel=1e-5, abs=1e-6)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        scale = float(jnp.abs(want).max()) + 1e-12
        assert float(jnp.abs(got - want).max()) <= 1e-4 * scale


@pytest.mark.compile
@pytest.mark.parametrize(("obs_shape", "num_actions", "dtype"), [(ATARI_SHAPE, 4, jnp.uint8), ((4,), 2, jnp.float32)])
def test_output_shapes_and_dtypes(obs_shape, num_actions, dtype):
    model = ActorCritic(obs_shape, num_actions, conv_impl="xla", key=jax.random.PRNGKey(0))
    obs = jnp.zeros((3, *obs_shape), dtype)
    logits, value = model(obs)
    assert logits.shape == (3, num_actions) and logits.dtype == jnp.float32
    assert value.shape == (3,) and value.dtype == jnp.float32
    logprob, entropy, value = model.evaluate_actions(obs, jnp.zeros(3, jnp.int32))
    assert logprob.shape == entropy.shape == value.shape == (3,)


@pytest.mark.compile
def test_cleanrl_initialisation():
    model = ActorCritic(ATARI_SHAPE, 4, conv_impl="xla", key=jax.random.PRNGKey(0))  # "auto" may build the kernel
    assert model.torso is not None
    # Orthogonal columns scaled by the gain (fan_in >= fan_out here), zero biases.
    for layer, gain in [(model.torso.dense, np.sqrt(2)), (model.actor, 0.01), (model.critic, 1.0)]:
        w = np.asarray(layer.weight, np.float64)
        np.testing.assert_allclose(w.T @ w, gain**2 * np.eye(w.shape[1]), atol=1e-5 * max(gain**2, 1e-3))
        assert not np.any(np.asarray(layer.bias))
    first = np.asarray(model.torso.convs[0].weight, np.float64).reshape(-1, 32)
    np.testing.assert_allclose(first.T @ first, 2.0 * np.eye(32), atol=1e-4)
    assert model.torso.dense.weight.shape == (3136, 512)


@pytest.mark.parametrize(
    "kind, obs_shape",
    [("grid", (10, 10, 6)), ("vector", (4,)), pytest.param("frames", ATARI_SHAPE, marks=pytest.mark.compile)],
)
def test_network_init_gymnax_blines_starts_every_layer_as_flax_does_and_cleanrl_as_cleanrl_does(kind, obs_shape):
    """gymnax-blines' start, stated in NumPy: LeCun normal kernels (variance 1 / fan-in, cut at two of the
    untruncated normal's standard deviations, which flax widens by 1 / 0.8796 so the cut one keeps the variance),
    biases uniform in [0, 0.05). CleanRL's: orthogonal columns (or rows) times the layer's gain, zero biases."""
    key = jax.random.PRNGKey(3)
    blines = ActorCritic(obs_shape, 6, kind=kind, init="gymnax-blines", key=key)
    cleanrl = ActorCritic(obs_shape, 6, kind=kind, key=key)  # the default
    for layer in network_layers(blines):
        w, b = np.asarray(layer.weight, np.float64), np.asarray(layer.bias, np.float64)
        fan_in = w.size // w.shape[-1]
        std = 1 / np.sqrt(fan_in)
        assert np.abs(w).max() <= 2 * std / 0.87962566103423978 * (1 + 1e-6)
        assert abs(w.std() / std - 1) < 4 / np.sqrt(w.size)  # four standard errors of a sample's std
        assert abs(w.mean()) < 4 * std / np.sqrt(w.size)
        assert b.min() >= 0 and b.max() < 0.05
        assert b.size < 64 or abs(b.mean() - 0.025) < 4 * 0.05 / np.sqrt(12 * b.size)
    for layer in network_layers(cleanrl):
        w = np.asarray(layer.weight, np.float64).reshape(-1, layer.weight.shape[-1])
        gram = w @ w.T if w.shape[0] < w.shape[1] else w.T @ w
        gain = np.sqrt(gram[0, 0])
        assert min(abs(gain / g - 1) for g in (np.sqrt(2), 1.0, 0.01)) < 1e-4
        np.testing.assert_allclose(gram, gain**2 * np.eye(min(w.shape)), atol=1e-5 * max(gain**2, 1e-3))
        assert not np.any(np.asarray(layer.bias))
    # Different layers draw different numbers.
    assert not np.array_equal(network_layers(blines)[-1].weight, network_layers(blines)[-2].weight)


def test_the_config_names_the_networks_initialisations():
    assert NETWORK_INITS == get_args(NetworkInit) == ("cleanrl", "gymnax-blines")


def network_layers(model: ActorCritic) -> list[Dense | Conv]:
    torso = [*model.torso.convs, model.torso.dense] if model.torso is not None else []
    heads = [layer for head in (model.actor, model.critic) for layer in getattr(head, "layers", (head,))]
    return torso + heads


@pytest.mark.compile
def test_frames_are_scaled_by_1_over_255():
    model = ActorCritic(ATARI_SHAPE, 4, conv_impl="xla", key=jax.random.PRNGKey(0))
    frames = jnp.full((1, *ATARI_SHAPE), 255, jnp.uint8)
    as_float = frames.astype(jnp.float32)
    assert model.torso is not None
    np.testing.assert_allclose(model.torso(frames, "xla"), model.torso(as_float, "xla"), rtol=1e-6)
    zero = model.torso(jnp.zeros((1, *ATARI_SHAPE), jnp.uint8), "xla")
    np.testing.assert_allclose(zero, 0.0)  # zero biases and ReLU: a black frame gives zero features


def test_rejects_other_observation_ranks():
    with pytest.raises(ValueError, match="neither"):
        ActorCritic((2, 3), 2, key=jax.random.PRNGKey(0))


def test_dense_is_an_affine_map():
    layer = Dense(3, 2, 1.0, key=jax.random.PRNGKey(0))
    x = jnp.array([[1.0, 2.0, 3.0]])
    np.testing.assert_allclose(layer(x), np.asarray(x) @ np.asarray(layer.weight), rtol=1e-6)


@pytest.mark.parametrize("obs_shape", [(4,), ATARI_SHAPE])
def test_one_observation_is_refused_with_a_clear_message(obs_shape):
    model = ActorCritic(obs_shape, 2, conv_impl="xla", key=jax.random.PRNGKey(0))
    one = jnp.zeros(obs_shape, jnp.uint8 if len(obs_shape) == 3 else jnp.float32)
    with pytest.raises(
        ValueError, match=r"takes a batch of observations \[B, .*\]; for one observation pass obs\[None\]"
    ):
        model(one)
    logits, value = model(one[None])
    assert logits.shape == (1, 2) and value.shape == (1,)


def test_shape_errors_are_caught_by_jaxtyping():
    """The test run checks annotated shapes (pytest's --jaxtyping-packages): a mismatch must not pass."""
    model = ActorCritic((4,), 2, key=jax.random.PRNGKey(0))
    with pytest.raises(Exception, match="(?i)type-check|jaxtyping|beartype"):
        model.evaluate_actions(jnp.zeros((3, 4)), jnp.zeros((5,), jnp.int32))
