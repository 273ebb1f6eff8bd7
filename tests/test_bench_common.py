"""bench/_common.py's ``--isa`` cap: the environment a bench script restarts itself under."""

import pytest

from .bench_scripts import load_bench_script

pytestmark = pytest.mark.unit

common = load_bench_script("_common")


@pytest.mark.parametrize(("isa", "xla", "openblas"), [("avx2", "AVX2", "Haswell"), ("avx512", "AVX512", "SkylakeX")])
def test_the_cap_sets_the_kernel_xla_and_openblas_and_keeps_the_rest(isa, xla, openblas):
    environ = {"HOME": "/home/x", "XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_cpu_max_isa=AVX512_SPR"}
    capped = common.isa_environment(isa, environ)
    assert capped == {
        "HOME": "/home/x",
        "XLA_FLAGS": f"--xla_dump_to=/tmp/x --xla_cpu_max_isa={xla}",  # the earlier cap replaced, not doubled
        "PPO_EQX_KERNEL_ISA": isa,
        "OPENBLAS_CORETYPE": openblas,
    }
    assert environ["XLA_FLAGS"].endswith("AVX512_SPR")  # the caller's environment is not changed
    assert common.isa_environment(isa, capped) == capped  # so run_as_isa restarts once, not again


def test_without_flags_the_cap_is_the_only_flag():
    assert common.isa_environment("avx2", {})["XLA_FLAGS"] == "--xla_cpu_max_isa=AVX2"
