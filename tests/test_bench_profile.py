"""bench/profile_update.py's reading of compiled HLO: which ops are matrix products, and their FLOPs."""

from types import ModuleType

import jax
import jax.numpy as jnp
import pytest

from ppo_eqx.core import cpu_kernel
from ppo_eqx.host import kernel_build

from .bench_scripts import load_bench_script
from .conv_reference import needs_kernel

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def profile() -> ModuleType:
    return load_bench_script("profile_update")


@pytest.mark.unit
def test_matmul_flops_of_compiled_products(profile: ModuleType) -> None:
    def f(a, b, x, d):
        return a @ b, x.T @ d, jnp.tanh(a)

    shapes = [(64, 32), (32, 16), (128, 8), (128, 4)]
    args = [jnp.ones(s, jnp.float32) for s in shapes]
    table = profile.hlo_instructions(jax.jit(f).lower(*args).compile().as_text())
    flops = {name: profile.matmul_flops(name, table) for name in table}
    products = sorted(v for v in flops.values() if v is not None)
    # Hand-computed: [64 x 32] x [32 x 16], and [8 x 128] x [128 x 4] (contraction over the 128 rows).
    assert products == [2 * 8 * 128 * 4, 2 * 64 * 32 * 16]
    tanh = [name for name, entry in table.items() if entry["shape"] == (64, 32) and entry["opcode"] != "parameter"]
    assert tanh and all(flops[name] is None for name in tanh)


@pytest.mark.unit
def test_describe_says_forward_or_backward(profile: ModuleType) -> None:
    assert profile.describe("jit(f)/while/body/closed_call/transpose(jvp())/dot_general") == "backward: dot_general"
    assert profile.describe("jit(<lambda>)/while/body/closed_call/jvp()/stack") == "forward: stack"


@pytest.mark.subprocess  # compiles the CPU kernel where it is not cached
@needs_kernel
def test_kernel_flops_of_the_first_convolution(profile: ModuleType) -> None:
    kernel_build.load()
    frames = jnp.zeros((3, 16, 6, 9), jnp.uint8)
    kernel, bias = jnp.ones((2, 2, 16, 32)), jnp.zeros(32)

    def f(kernel, bias):
        loss = lambda w, c: jnp.sum(cpu_kernel.first_conv(frames, w, c, 1) ** 2)  # noqa: E731
        return jax.grad(loss, argnums=(0, 1))(kernel, bias)

    table = profile.hlo_instructions(jax.jit(f).lower(kernel, bias).compile().as_text())
    calls = {entry["target"]: profile.product_flops(name, table) for name, entry in table.items() if entry["target"]}
    # Hand-computed: 3 frames x 5 x 8 outputs x (2 x 2 x 16 taps) x 32 channels, one multiply and one add each.
    each = 2 * 3 * 5 * 8 * (2 * 2 * 16) * 32
    assert calls == {"ppo_eqx_first_conv_forward": each, "ppo_eqx_first_conv_weight_gradient": each}
