"""What ``conv_impl="auto"`` resolves to on each backend, with the backend faked (no GPU needed), that "auto" never
starts a compiler, and that a model is built with the route it is given."""

import jax
import pytest

from ppo_eqx import ActorCritic
from ppo_eqx.errors import ConfigError
from ppo_eqx.host import kernel_build
from ppo_eqx.host.kernel_build import resolve_conv_impl

pytestmark = pytest.mark.unit

ATARI_SHAPE = (4, 84, 84)


def _fake_backend(monkeypatch: pytest.MonkeyPatch, backend: str, *, kernel_builds: bool) -> None:
    """``backend`` as jax's; the kernel built and loadable (``kernel_builds``), or where it is not built, a build
    that fails."""

    def unavailable_reason(*, build_if_missing: bool = True) -> str | None:
        return None if kernel_builds else "no C++ compiler found"

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    monkeypatch.setattr(kernel_build, "unavailable_reason", unavailable_reason)


@pytest.mark.compile
@pytest.mark.parametrize("backend", ["gpu", "cuda", "rocm", "tpu"])
def test_auto_is_xla_off_the_cpu(monkeypatch, backend):
    def not_consulted() -> bool:
        raise AssertionError("the CPU kernel is no candidate off the CPU")

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    monkeypatch.setattr(kernel_build, "unavailable_reason", not_consulted)
    assert resolve_conv_impl("auto", ATARI_SHAPE) == "xla"


@pytest.mark.parametrize(("kernel_builds", "expected"), [(True, "kernel"), (False, "matmul")])
def test_auto_on_the_cpu_is_the_kernel_where_it_builds(monkeypatch, kernel_builds, expected):
    _fake_backend(monkeypatch, "cpu", kernel_builds=kernel_builds)
    assert resolve_conv_impl("auto", ATARI_SHAPE) == expected


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_auto_without_convolutions_is_unchanged(monkeypatch, backend):
    _fake_backend(monkeypatch, backend, kernel_builds=True)
    assert resolve_conv_impl("auto", (4,)) == "matmul"


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("conv_impl", ["xla", "matmul"])
def test_an_explicit_route_is_kept_on_every_backend(monkeypatch, backend, conv_impl):
    _fake_backend(monkeypatch, backend, kernel_builds=True)
    assert resolve_conv_impl(conv_impl, ATARI_SHAPE) == conv_impl


def test_the_kernel_is_refused_off_the_cpu(monkeypatch):
    _fake_backend(monkeypatch, "gpu", kernel_builds=True)
    with pytest.raises(ConfigError, match="CPU backend only, not 'gpu'"):
        resolve_conv_impl("kernel", ATARI_SHAPE)


def test_without_the_kernel_auto_falls_back_and_kernel_is_refused(monkeypatch):
    _fake_backend(monkeypatch, "cpu", kernel_builds=False)
    assert resolve_conv_impl("auto", ATARI_SHAPE) == "matmul"
    with pytest.raises(ConfigError, match="conv_impl='kernel' is unavailable: no C\\+\\+ compiler found"):
        resolve_conv_impl("kernel", ATARI_SHAPE)


@pytest.mark.compile
@pytest.mark.parametrize("conv_impl", ["xla", "matmul", "kernel"])
def test_a_model_takes_the_route_it_is_given_and_never_chooses(monkeypatch, conv_impl):
    def chosen() -> bool:
        raise AssertionError("building a model must not look for the kernel")

    for name in ("unavailable_reason", "load", "build", "built"):
        monkeypatch.setattr(kernel_build, name, chosen)
    assert ActorCritic(ATARI_SHAPE, 4, conv_impl=conv_impl, key=jax.random.PRNGKey(0)).conv_impl == conv_impl
    assert ActorCritic(ATARI_SHAPE, 4, key=jax.random.PRNGKey(0)).conv_impl == "xla"  # XLA's own, as CleanRL


def test_auto_is_no_route_for_a_model():
    # Under pytest jaxtyping's check of the Literal refuses it first; a caller outside pytest gets the ValueError.
    with pytest.raises((ValueError, TypeError), match="auto"):
        ActorCritic((4,), 2, conv_impl="auto", key=jax.random.PRNGKey(0))  # pyright: ignore[reportArgumentType]


def test_auto_never_starts_a_compiler_where_the_kernel_is_not_built(monkeypatch, tmp_path):
    """A first CPU run with "auto" takes the matmuls where the kernel is not in the cache, and builds nothing."""

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise AssertionError("auto started the C++ compiler")

    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    monkeypatch.setenv("PPO_EQX_CACHE", str(tmp_path))
    monkeypatch.setattr(kernel_build, "_loaded", {})
    monkeypatch.setattr(kernel_build, "build", no_compiler)
    assert resolve_conv_impl("auto", ATARI_SHAPE) == "matmul"
    assert list(tmp_path.iterdir()) == []
