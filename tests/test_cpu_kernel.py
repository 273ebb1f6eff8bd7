"""The hand-written convolutions (``conv_impl="kernel"``: the first layer's and the other two's) against NumPy,
built for AVX-512 and for AVX2, and how the kernel is built and chosen."""

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppo_eqx.core import cpu_kernel
from ppo_eqx.core.networks import Conv
from ppo_eqx.errors import ConfigError
from ppo_eqx.host import kernel_build
from ppo_eqx.host.kernel_build import resolve_conv_impl

from .conv_reference import ATARI_SHAPE, needs_compiler, needs_kernel, numpy_conv

pytestmark = pytest.mark.subprocess

# (batch, channels, height, width, stride, k): widths on both sides of the kernel's 10-column strips, k = 1, 2,
# 3, strides 1, 2, 4 and 8, frames cropped (rows or columns past the last window) or not; Atari's frames and
# others of 4 channels at stride 4 (the kernel's shuffled fold) beside other folds.
SHAPES = [
    (1, 8, 3, 3, 1, 2),
    (3, 4, 10, 29, 2, 2),
    (2, 4, 84, 84, 4, 2),
    (2, 2, 9, 23, 2, 3),
    (1, 24, 6, 23, 1, 1),
    (2, 1, 37, 45, 4, 2),
    (1, 4, 39, 42, 4, 2),
    (1, 2, 17, 16, 8, 1),
]


# The ISAs the kernel is built for (its vectors: 16 floats and 8), each checked where this CPU runs it.
ISAS = [
    pytest.param(isa, marks=pytest.mark.skipif(not kernel_build.cpu_supports(isa), reason=f"this CPU has no {isa}"))
    for isa in ("avx512", "avx2")
]


@contextlib.contextmanager
def built_for(isa):
    """The kernel built for ``isa`` ($PPO_EQX_KERNEL_ISA, its own library) in the block; the one before it after."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(kernel_build.ISA_VARIABLE, isa)
        _forget_the_kernel()
        try:
            assert kernel_build.load().isa == isa  # what the library says its vectors are
            yield
        finally:
            _forget_the_kernel()


@pytest.fixture(autouse=True, scope="module")
def _loaded():
    """The kernel built and loaded for the wrappers (what resolving the route does), where it builds."""
    if kernel_build.find_compiler() is not None and kernel_build.cpu_supports("native"):
        kernel_build.load()


def _forget_the_kernel():
    """The next ``load()`` builds (or finds in the cache) and registers the kernel anew."""
    kernel_build._loaded.clear()


def _case(shape, seed):
    batch, channels, height, width, stride, k = shape
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, size=(batch, channels, height, width), dtype=np.uint8)
    kernel = rng.normal(size=(k * stride, k * stride, channels, 32)).astype(np.float32)
    bias = rng.normal(size=32).astype(np.float32)
    out_h, out_w = (height - k * stride) // stride + 1, (width - k * stride) // stride + 1
    dy = rng.normal(size=(batch, out_h, out_w, 32)).astype(np.float32)
    return frames, kernel, bias, dy


def _fold(kernel, stride):
    """A [k*s, k*s, C, O] kernel as the [k, k, s*s*C, O] kernel of the stride-1 convolution on space-to-depth
    folded frames, depth ordered (row in tile, column in tile, channel)."""
    size, _, channels, out = kernel.shape
    k = size // stride
    return kernel.reshape(k, stride, k, stride, channels, out).transpose(0, 2, 1, 3, 4, 5).reshape(k, k, -1, out)


def _numpy_weight_gradient(x, dy, size, stride):
    """d(sum(y * dy))/d(kernel) of the strided convolution of NHWC ``x``, as loops over the kernel taps: each
    tap's input window against dy."""
    _, out_h, out_w, _ = dy.shape
    grad = np.zeros((size, size, x.shape[3], dy.shape[3]))
    for a in range(size):
        for b in range(size):
            window = x[:, a : a + stride * (out_h - 1) + 1 : stride, b : b + stride * (out_w - 1) + 1 : stride, :]
            grad[a, b] = np.tensordot(window, dy, axes=([0, 1, 2], [0, 1, 2]))
    return grad


@pytest.mark.subprocess  # the first test to run the kernel compiles it
@needs_compiler
@pytest.mark.parametrize("isa", ISAS)
@given(shape=st.sampled_from(SHAPES), seed=st.integers(0, 99))
def test_forward_and_gradients_match_numpy(isa, shape, seed):
    frames, kernel, bias, dy = _case(shape, seed)
    stride = shape[4]
    x = frames.transpose(0, 2, 3, 1).astype(np.float64) / 255.0
    expected = numpy_conv(x, kernel.astype(np.float64), bias, stride)
    with built_for(isa):
        y, vjp = jax.vjp(
            lambda w, c: cpu_kernel.first_conv(jnp.asarray(frames), w, c, stride),
            jnp.asarray(_fold(kernel, stride)),
            jnp.asarray(bias),
        )
        dkernel, dbias = vjp(jnp.asarray(dy))
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    want = _fold(_numpy_weight_gradient(x, dy.astype(np.float64), kernel.shape[0], stride), stride)
    np.testing.assert_allclose(dkernel, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(dbias, dy.astype(np.float64).sum(axis=(0, 1, 2)), rtol=1e-4, atol=1e-3)


@pytest.mark.subprocess  # the first test to run the kernel compiles it
@needs_kernel
def test_runs_under_vmap_and_scan():
    frames, kernel, bias, _ = _case((2, 4, 10, 29, 2, 2), 0)
    kernel, bias = jnp.asarray(_fold(kernel, 2)), jnp.asarray(bias)
    stacked = jnp.stack([jnp.asarray(frames), jnp.asarray(frames[::-1])])
    kernels = jnp.stack([kernel, -kernel])
    layer = lambda x, w, c: cpu_kernel.first_conv(x, w, c, 2)  # noqa: E731
    mapped = jax.jit(jax.vmap(layer, in_axes=(0, 0, None)))(stacked, kernels, bias)
    for s in range(2):
        np.testing.assert_allclose(mapped[s], layer(stacked[s], kernels[s], bias), rtol=1e-6)

    def step(total, x):
        return total + jnp.sum(layer(x, kernels[0], bias)), None

    total, _ = jax.jit(lambda xs: jax.lax.scan(step, jnp.float32(0), xs))(stacked)
    assert float(total) == pytest.approx(
        float(jnp.sum(mapped[0]) + jnp.sum(layer(stacked[1], kernels[0], bias))), rel=1e-5
    )


@pytest.mark.unit
def test_rejects_shapes_it_does_not_compute():
    frames = jnp.zeros((1, 3, 8, 8), jnp.uint8)
    with pytest.raises(ValueError, match="not 32 from 12"):
        cpu_kernel.first_conv(frames, jnp.zeros((2, 2, 12, 32)), jnp.zeros(32), 2)
    with pytest.raises(ValueError, match="not 16 from 8"):
        cpu_kernel.first_conv(frames, jnp.zeros((2, 2, 8, 16)), jnp.zeros(16), 2)
    with pytest.raises(ValueError, match="needs a kernel depth of 12 .* not depth 16 and 8 x 8"):
        cpu_kernel.first_conv(frames, jnp.zeros((2, 2, 16, 32)), jnp.zeros(32), 2)
    with pytest.raises(ValueError, match="frames of at least 12 x 12, not depth 48 and 8 x 8"):
        cpu_kernel.first_conv(frames, jnp.zeros((3, 3, 48, 32)), jnp.zeros(32), 4)


# conv's cases, (batch, height, width, channels, k, stride): the Nature CNN's second and third layers, strides 1
# to 3 with rows and columns past the last window, input widths around its strips of 6 outputs and of 24 / C
# input columns, 16 to 64 channels.
CONV_SHAPES = [
    (2, 20, 20, 32, 4, 2),
    (3, 9, 9, 64, 3, 1),
    (2, 11, 14, 16, 3, 2),
    (1, 7, 8, 48, 2, 3),
    (2, 6, 31, 16, 3, 1),
    (1, 5, 17, 32, 5, 1),
    (1, 1, 1, 64, 1, 1),
]


def _conv_case(shape, seed):
    batch, height, width, channels, k, stride = shape
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, height, width, channels)).astype(np.float32)
    kernel = rng.normal(size=(k, k, channels, 64)).astype(np.float32)
    bias = rng.normal(size=64).astype(np.float32)
    out_h, out_w = (height - k) // stride + 1, (width - k) // stride + 1
    dy = rng.normal(size=(batch, out_h, out_w, 64)).astype(np.float32)
    return x, kernel, bias, dy


def _numpy_input_gradient(kernel, dy, x_shape, stride):
    """d(sum(y * dy))/dx: every output position's cotangent spread back over its window through the kernel."""
    k = kernel.shape[0]
    grad = np.zeros(x_shape)
    for i in range(dy.shape[1]):
        for j in range(dy.shape[2]):
            window = np.tensordot(dy[:, i, j, :], kernel, axes=([1], [3]))  # [B, k, k, C]
            grad[:, i * stride : i * stride + k, j * stride : j * stride + k, :] += window
    return grad


@pytest.mark.subprocess  # the first test to run the kernel compiles it
@needs_compiler
@pytest.mark.parametrize("isa", ISAS)
@given(shape=st.sampled_from(CONV_SHAPES), seed=st.integers(0, 99))
def test_conv_and_its_gradients_match_numpy(isa, shape, seed):
    x, kernel, bias, dy = _conv_case(shape, seed)
    stride = shape[5]
    x64, kernel64, dy64 = x.astype(np.float64), kernel.astype(np.float64), dy.astype(np.float64)
    arrays = (jnp.asarray(x), jnp.asarray(kernel), jnp.asarray(bias))
    with built_for(isa):
        y, vjp = jax.vjp(lambda a, k, b: cpu_kernel.conv(a, k, b, stride), *arrays)
        dx, dkernel, dbias = vjp(jnp.asarray(dy))
    np.testing.assert_allclose(y, numpy_conv(x64, kernel64, bias, stride), rtol=1e-4, atol=1e-4)
    want_dx = _numpy_input_gradient(kernel64, dy64, x.shape, stride)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-4 * np.abs(want_dx).max())
    want_dkernel = _numpy_weight_gradient(x64, dy64, shape[4], stride)
    np.testing.assert_allclose(dkernel, want_dkernel, rtol=1e-4, atol=1e-4 * np.abs(want_dkernel).max())
    np.testing.assert_allclose(dbias, dy64.sum(axis=(0, 1, 2)), rtol=1e-4, atol=1e-3)


@pytest.mark.subprocess  # the first test to run the kernel compiles it
@needs_kernel
def test_conv_runs_under_vmap_and_scan():
    x, kernel, bias, dy = (jnp.asarray(a) for a in _conv_case((2, 11, 14, 16, 3, 2), 1))
    layer = lambda x, w: cpu_kernel.conv(x, w, bias, 2)  # noqa: E731
    xs, kernels = jnp.stack([x, -x]), jnp.stack([kernel, 2 * kernel])
    mapped = jax.jit(jax.vmap(jax.value_and_grad(lambda x, w: jnp.sum(layer(x, w) * dy), argnums=(0, 1))))
    values, (dxs, dkernels) = mapped(xs, kernels)
    for s in range(2):
        value, (dx, dkernel) = jax.value_and_grad(lambda x, w: jnp.sum(layer(x, w) * dy), argnums=(0, 1))(
            xs[s], kernels[s]
        )
        np.testing.assert_allclose(values[s], value, rtol=1e-5)
        np.testing.assert_allclose(dxs[s], dx, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dkernels[s], dkernel, rtol=1e-5, atol=1e-5)
    total, _ = jax.jit(lambda xs: jax.lax.scan(lambda t, x: (t + jnp.sum(layer(x, kernel)), None), 0.0, xs))(xs)
    assert float(total) == pytest.approx(float(jnp.sum(layer(xs[0], kernel)) + jnp.sum(layer(xs[1], kernel))), rel=1e-5)


@pytest.mark.unit
def test_conv_takes_only_the_shapes_it_computes():
    assert cpu_kernel.conv_computes((8, 20, 20, 32), (4, 4, 32, 64))
    assert cpu_kernel.conv_computes((8, 9, 9, 64), (3, 3, 64, 64))
    for x_shape, kernel_shape in [
        ((8, 20, 20, 32), (4, 4, 32, 32)),  # 32 outputs
        ((8, 20, 20, 24), (4, 4, 24, 64)),  # 24 inputs
        ((8, 20, 20, 128), (4, 4, 128, 64)),  # more than 64 inputs
        ((8, 20, 20, 32), (4, 4, 16, 64)),  # kernel and input disagree
        ((8, 3, 20, 32), (4, 4, 32, 64)),  # kernel taller than the input
        ((20, 20, 32), (4, 4, 32, 64)),  # no batch axis
    ]:
        assert not cpu_kernel.conv_computes(x_shape, kernel_shape)
    with pytest.raises(ValueError, match=r"not input \(1, 5, 5, 24\) and kernel \(3, 3, 24, 64\)"):
        cpu_kernel.conv(jnp.zeros((1, 5, 5, 24)), jnp.zeros((3, 3, 24, 64)), jnp.zeros(64), 1)


@pytest.mark.subprocess  # the first test to run the kernel compiles it
@needs_kernel
def test_the_kernel_is_the_layer_on_frames():
    conv = Conv(4, 32, 8, 4, 1.0, key=jax.random.PRNGKey(0))
    frames = jnp.asarray(np.random.default_rng(0).integers(0, 256, size=(3, 4, 38, 45), dtype=np.uint8))
    want = conv(jnp.transpose(frames, (0, 2, 3, 1)).astype(jnp.float32) / 255.0, "xla")
    got = cpu_kernel.first_conv(frames, conv.folded_kernel(), conv.bias, conv.stride)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.subprocess  # the first test to run the kernel compiles it
@needs_compiler
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the kernel is chosen on the CPU backend only")
@pytest.mark.parametrize("isa", ISAS)
def test_auto_chooses_the_kernel_for_frames_on_cpu(isa):
    # AVX2 alone (AMD Zen 1-3, most laptops) is enough: the kernel built for it is the route.
    with built_for(isa):
        assert resolve_conv_impl("auto", ATARI_SHAPE) == "kernel"
        assert kernel_build.isa() == isa
    assert resolve_conv_impl("auto", (4,)) == "matmul"  # no convolutions
    assert resolve_conv_impl("xla", ATARI_SHAPE) == "xla"


@pytest.mark.subprocess
@needs_compiler
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the kernel is chosen on the CPU backend only")
def test_where_the_kernel_does_not_build_auto_takes_matmuls(tmp_path, monkeypatch):
    # "native" as on a CPU without AVX2 and FMA (x86-64-v2), an empty cache: "auto" takes the matmuls without
    # trying to build, and "kernel", which builds, is refused (the real build refuses the CPU).
    monkeypatch.setitem(kernel_build.MARCH, "native", "x86-64-v2")
    monkeypatch.setenv("PPO_EQX_CACHE", str(tmp_path))
    monkeypatch.delenv(kernel_build.ISA_VARIABLE, raising=False)
    _forget_the_kernel()
    try:
        assert resolve_conv_impl("auto", ATARI_SHAPE) == "matmul"
        assert kernel_build.isa() is None
        with pytest.raises(ConfigError, match="conv_impl='kernel' is unavailable: .*needs AVX2 and FMA"):
            resolve_conv_impl("kernel", ATARI_SHAPE)
    finally:
        _forget_the_kernel()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.subprocess
@pytest.mark.parametrize("compiler", ["false", "/nonexistent/g++"])
def test_a_failed_build_says_which_compiler_failed(tmp_path, monkeypatch, compiler):
    monkeypatch.setenv("CXX", compiler)
    with pytest.raises(kernel_build.KernelUnavailable, match=re.escape(f"{compiler} could not build cpu_kernel.cc")):
        kernel_build.build(tmp_path / "kernel.so")
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


@pytest.mark.subprocess
@needs_compiler
@pytest.mark.skipif(not kernel_build.cpu_supports("avx512"), reason="compares the AVX-512 build with the AVX2 one")
def test_the_avx2_and_avx512_builds_give_the_same_bits():
    # Each sum is taken in the same order whatever the vector width, so the two builds agree exactly.
    frames, kernel, bias, dy = (jnp.asarray(a) for a in _case(SHAPES[2], 0))
    x, conv_kernel, conv_bias, conv_dy = (jnp.asarray(a) for a in _conv_case(CONV_SHAPES[0], 0))
    kernel = jnp.asarray(_fold(np.asarray(kernel), 4))

    def outputs():
        first = jax.vjp(lambda w: cpu_kernel.first_conv(frames, w, bias, 4), kernel)
        conv = jax.vjp(lambda x, w: cpu_kernel.conv(x, w, conv_bias, 2), x, conv_kernel)
        return [np.asarray(a) for a in (first[0], *first[1](dy), conv[0], *conv[1](conv_dy))]

    with built_for("avx512"):
        wide = outputs()
    with built_for("avx2"):
        narrow = outputs()
    for a, b in zip(wide, narrow, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.subprocess
@needs_compiler
def test_without_avx2_and_fma_the_kernel_is_not_built(tmp_path):
    # x86-64-v2 has SSE4.2 but neither AVX2 nor FMA: the source refuses, so auto takes the matmul route.
    with pytest.raises(kernel_build.KernelUnavailable, match="could not build cpu_kernel.cc: .*needs AVX2 and FMA"):
        kernel_build.build(tmp_path / "kernel.so", "x86-64-v2")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.unit
def test_an_unknown_isa_is_refused_with_the_ones_it_takes(monkeypatch):
    monkeypatch.setenv(kernel_build.ISA_VARIABLE, "avx3")
    with pytest.raises(
        kernel_build.KernelUnavailable, match="PPO_EQX_KERNEL_ISA='avx3' is not one of native, avx512, avx2"
    ):
        kernel_build.requested_isa()


@pytest.mark.unit
def test_an_unwritable_cache_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "false")  # a compiler is looked up first; this one is never started
    (tmp_path / "file").write_text("")
    with pytest.raises(kernel_build.KernelUnavailable, match="could not create the kernel cache"):
        kernel_build.build(tmp_path / "file" / "kernel.so")
