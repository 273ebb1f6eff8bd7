"""bench/profile_update.py's reading of compiled HLO: which ops are matrix products, and their FLOPs."""

from types import ModuleType

import jax
import jax.numpy as jnp
import pytest

from .bench_scripts import load_bench_script


@pytest.fixture(scope="module")
def profile() -> ModuleType:
    return load_bench_script("profile_update")


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


def test_describe_says_forward_or_backward(profile: ModuleType) -> None:
    assert profile.describe("jit(f)/while/body/closed_call/transpose(jvp())/dot_general") == "backward: dot_general"
    assert profile.describe("jit(<lambda>)/while/body/closed_call/jvp()/stack") == "forward: stack"
