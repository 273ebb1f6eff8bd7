"""What ``conv_impl="auto"`` resolves to on each backend, with the backend faked (no GPU needed)."""

import jax
import pytest

from ppo_eqx import ActorCritic
from ppo_eqx.core import cpu_kernel
from ppo_eqx.core.networks import choose_conv_impl

pytestmark = pytest.mark.unit

ATARI_SHAPE = (4, 84, 84)


def _fake_backend(monkeypatch: pytest.MonkeyPatch, backend: str, *, kernel_builds: bool) -> None:
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    monkeypatch.setattr(cpu_kernel, "available", lambda: kernel_builds)


@pytest.mark.compile
@pytest.mark.parametrize("backend", ["gpu", "cuda", "rocm", "tpu"])
def test_auto_is_xla_off_the_cpu(monkeypatch, backend):
    def not_consulted() -> bool:
        raise AssertionError("the CPU kernel is no candidate off the CPU")

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    monkeypatch.setattr(cpu_kernel, "available", not_consulted)
    assert choose_conv_impl("auto", ATARI_SHAPE) == "xla"
    assert ActorCritic(ATARI_SHAPE, 4, key=jax.random.PRNGKey(0)).conv_impl == "xla"


@pytest.mark.parametrize(("kernel_builds", "expected"), [(True, "kernel"), (False, "matmul")])
def test_auto_on_the_cpu_is_the_kernel_where_it_builds(monkeypatch, kernel_builds, expected):
    _fake_backend(monkeypatch, "cpu", kernel_builds=kernel_builds)
    assert choose_conv_impl("auto", ATARI_SHAPE) == expected


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_auto_without_convolutions_is_unchanged(monkeypatch, backend):
    _fake_backend(monkeypatch, backend, kernel_builds=True)
    assert choose_conv_impl("auto", (4,)) == "matmul"


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("conv_impl", ["xla", "matmul"])
def test_an_explicit_route_is_kept_on_every_backend(monkeypatch, backend, conv_impl):
    _fake_backend(monkeypatch, backend, kernel_builds=True)
    assert choose_conv_impl(conv_impl, ATARI_SHAPE) == conv_impl


def test_the_kernel_is_refused_off_the_cpu(monkeypatch):
    _fake_backend(monkeypatch, "gpu", kernel_builds=True)
    with pytest.raises(ValueError, match="CPU backend only, not 'gpu'"):
        choose_conv_impl("kernel", ATARI_SHAPE)
