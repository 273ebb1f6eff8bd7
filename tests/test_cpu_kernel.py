"""The hand-written first convolution (``conv_impl="kernel"``) against NumPy, and how it is chosen and built."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppo_eqx import ActorCritic, cpu_kernel
from ppo_eqx.networks import Conv, choose_conv_impl, frames_space_to_depth

from .conv_reference import ATARI_SHAPE, needs_compiler, numpy_conv

pytestmark = pytest.mark.subprocess

# (batch, height, width, depth, k): widths on both sides of the kernel's 10-column strips, k = 1, 2, 3.
SHAPES = [(1, 3, 3, 8, 2), (3, 5, 14, 16, 2), (2, 21, 21, 64, 2), (2, 4, 11, 8, 3), (1, 6, 23, 24, 1)]


def _case(shape, seed):
    batch, height, width, depth, k = shape
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, size=(batch, height, width, depth), dtype=np.uint8)
    kernel = rng.normal(size=(k, k, depth, 32)).astype(np.float32)
    bias = rng.normal(size=32).astype(np.float32)
    dy = rng.normal(size=(batch, height - k + 1, width - k + 1, 32)).astype(np.float32)
    return frames, kernel, bias, dy


def _numpy_weight_gradient(frames, dy, k):
    """d(sum(y * dy))/d(kernel) as loops over the kernel taps: each tap's input window against dy."""
    x = frames.astype(np.float64) / 255.0
    _, out_h, out_w, _ = dy.shape
    grad = np.zeros((k, k, x.shape[3], dy.shape[3]))
    for a in range(k):
        for b in range(k):
            grad[a, b] = np.tensordot(x[:, a : a + out_h, b : b + out_w, :], dy, axes=([0, 1, 2], [0, 1, 2]))
    return grad


@pytest.mark.subprocess  # the first test to run the kernel compiles it
@needs_compiler
@given(st.sampled_from(SHAPES), st.integers(0, 99))
def test_forward_and_gradients_match_numpy(shape, seed):
    frames, kernel, bias, dy = _case(shape, seed)
    expected = numpy_conv(frames.astype(np.float64) / 255.0, kernel.astype(np.float64), bias, 1)
    y, vjp = jax.vjp(
        lambda w, c: cpu_kernel.first_conv(jnp.asarray(frames), w, c), jnp.asarray(kernel), jnp.asarray(bias)
    )
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    dkernel, dbias = vjp(jnp.asarray(dy))
    want = _numpy_weight_gradient(frames, dy.astype(np.float64), shape[-1])
    np.testing.assert_allclose(dkernel, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(dbias, dy.astype(np.float64).sum(axis=(0, 1, 2)), rtol=1e-4, atol=1e-3)


@pytest.mark.subprocess  # the first test to run the kernel compiles it
@needs_compiler
def test_runs_under_vmap_and_scan():
    frames, kernel, bias, _ = _case((2, 5, 14, 16, 2), 0)
    bias = jnp.asarray(bias)
    stacked = jnp.stack([jnp.asarray(frames), jnp.asarray(frames[::-1])])
    kernels = jnp.stack([jnp.asarray(kernel), -jnp.asarray(kernel)])
    mapped = jax.jit(jax.vmap(cpu_kernel.first_conv, in_axes=(0, 0, None)))(stacked, kernels, bias)
    for s in range(2):
        np.testing.assert_allclose(mapped[s], cpu_kernel.first_conv(stacked[s], kernels[s], bias), rtol=1e-6)

    def step(total, x):
        return total + jnp.sum(cpu_kernel.first_conv(x, kernels[0], bias)), None

    total, _ = jax.jit(lambda xs: jax.lax.scan(step, jnp.float32(0), xs))(stacked)
    assert float(total) == pytest.approx(
        float(jnp.sum(mapped[0]) + jnp.sum(cpu_kernel.first_conv(stacked[1], kernels[0], bias))), rel=1e-5
    )


@pytest.mark.unit
def test_rejects_shapes_it_does_not_compute():
    frames = jnp.zeros((1, 4, 4, 12), jnp.uint8)
    with pytest.raises(ValueError, match="not 32 from 12"):
        cpu_kernel.first_conv(frames, jnp.zeros((2, 2, 12, 32)), jnp.zeros(32))
    with pytest.raises(ValueError, match="not 16 from 8"):
        cpu_kernel.first_conv(frames[..., :8], jnp.zeros((2, 2, 8, 16)), jnp.zeros(16))


@pytest.mark.subprocess  # the first test to run the kernel compiles it
@needs_compiler
def test_the_first_layer_on_folded_frames_is_the_layer_on_frames():
    conv = Conv(4, 32, 8, 4, 1.0, key=jax.random.PRNGKey(0))
    frames = jnp.asarray(np.random.default_rng(0).integers(0, 256, size=(3, 4, 36, 44), dtype=np.uint8))
    want = conv(jnp.transpose(frames, (0, 2, 3, 1)).astype(jnp.float32) / 255.0, "xla")
    got = cpu_kernel.first_conv(frames_space_to_depth(frames, 4), conv.folded_kernel(), conv.bias)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.subprocess  # the first test to run the kernel compiles it
@needs_compiler
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the kernel is chosen on the CPU backend only")
def test_auto_chooses_the_kernel_for_frames_on_cpu():
    assert choose_conv_impl("auto", ATARI_SHAPE) == "kernel"
    assert choose_conv_impl("auto", (4,)) == "matmul"  # no convolutions
    assert choose_conv_impl("xla", ATARI_SHAPE) == "xla"
    assert ActorCritic(ATARI_SHAPE, 4, key=jax.random.PRNGKey(0)).conv_impl == "kernel"


@pytest.mark.unit
def test_without_the_kernel_auto_falls_back_and_kernel_is_refused(monkeypatch):
    def unavailable():
        raise cpu_kernel.KernelUnavailable("no C++ compiler found")

    monkeypatch.setattr(cpu_kernel, "available", lambda: False)
    monkeypatch.setattr(cpu_kernel, "load", unavailable)
    assert choose_conv_impl("auto", ATARI_SHAPE) == "matmul"
    with pytest.raises(ValueError, match="conv_impl='kernel' is unavailable: no C\\+\\+ compiler found"):
        ActorCritic(ATARI_SHAPE, 4, conv_impl="kernel", key=jax.random.PRNGKey(0))


@pytest.mark.subprocess
@pytest.mark.parametrize("compiler", ["false", "/nonexistent/g++"])
def test_a_failed_build_says_which_compiler_failed(tmp_path, monkeypatch, compiler):
    monkeypatch.setenv("CXX", compiler)
    with pytest.raises(cpu_kernel.KernelUnavailable, match=re.escape(f"{compiler} could not build cpu_kernel.cc")):
        cpu_kernel.build(tmp_path / "kernel.so")
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


@pytest.mark.unit
def test_an_unwritable_cache_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "false")  # a compiler is looked up first; this one is never started
    (tmp_path / "file").write_text("")
    with pytest.raises(cpu_kernel.KernelUnavailable, match="could not create the kernel cache"):
        cpu_kernel.build(tmp_path / "file" / "kernel.so")
