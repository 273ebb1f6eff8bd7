"""The kernel cache is untrusted (issue 41): a truncated, overwritten or foreign ``.so`` in ``$PPO_EQX_CACHE`` is
never loaded into the process (it would end it with SIGBUS or a 43-line traceback); ``--conv-impl auto`` passes it
by with a note, an explicit ``--conv-impl kernel`` builds it again, and a load that asks for no build refuses in
one line. Each case is a child process: a bad library loaded into the test process would end the suite."""

import shutil
from pathlib import Path

import pytest

from ppo_eqx.host import kernel_build

from .conv_reference import needs_compiler
from .processes import ppo_eqx, run_child, worker_env

pytestmark = pytest.mark.subprocess

LOAD = (
    "from ppo_eqx.host import kernel_build as k; reason = k.unavailable_reason(build_if_missing={build}); "
    "print('loaded', k.isa()) if reason is None else print('refused:', reason)"
)


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 3])
    elif how == "garbage":
        path.write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
    elif how == "no digest":
        path.with_suffix(".sha256").unlink()
    elif how == "another library":  # a whole library with its digest, but not the kernel: its symbols are missing
        libm = next(Path(p) for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6") if Path(p).exists())
        path.write_bytes(libm.read_bytes())
        path.with_suffix(".sha256").write_text(kernel_build._digest(path))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding a kernel built here (the one child builds it, about 20 s)."""
    root = tmp_path_factory.mktemp("kernel_cache")
    code, out, err = run_child(["-c", LOAD.format(build=True)], env=worker_env() | {"PPO_EQX_CACHE": str(root)})
    assert code == 0 and out[-1].startswith("loaded"), out + err
    return root


@needs_compiler
@pytest.mark.parametrize("how", ["truncated", "garbage", "no digest", "another library"])
def test_a_damaged_cached_kernel_is_refused_in_one_line_and_rebuilt_where_asked(cache, tmp_path, how):
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    (library,) = copy.glob("cpu_kernel-*.so")
    damage(library, how)
    env = worker_env() | {"PPO_EQX_CACHE": str(copy)}
    code, out, err = run_child(["-c", LOAD.format(build=False)], env=env)
    assert code == 0 and len(out) == 1 and out[0].startswith("refused:"), out + err
    assert "build-kernel" in out[0] and not err, out + err
    code, out, err = run_child(["-c", LOAD.format(build=True)], env=env)
    if how == "another library":  # its digest is its own: a build is not asked for, and it is refused, not loaded
        assert code == 0 and out[0].startswith("refused:") and "could not load" in out[0], out + err
    else:
        assert code == 0 and out[0].startswith("loaded"), out + err
        assert kernel_build.cache_problem(library) is None


@needs_compiler
def test_auto_passes_a_damaged_kernel_by_with_a_note_and_trains(cache, tmp_path):
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    (library,) = copy.glob("cpu_kernel-*.so")
    damage(library, "truncated")
    before = library.read_bytes()
    run = tmp_path / "run"
    args = ["train", "--env-id", "Breakout-v5", "--num-envs", "2", "--num-steps", "8", "--num-minibatches", "2"]
    args += ["--update-epochs", "1", "--total-timesteps", "16", "--no-progress", "--run-dir", str(run)]
    code, out, err = run_child(ppo_eqx(*args), env=worker_env() | {"PPO_EQX_CACHE": str(copy)})
    assert code == 0, out + err
    assert any("damaged" in line and "build-kernel" in line for line in out + err), out + err
    assert library.read_bytes() == before  # auto starts no compiler


@needs_compiler
def test_an_unwritable_kernel_cache_is_named_as_such_not_as_a_linker_error() -> None:
    # /proc/self is a directory no process, root included, makes a file in.
    code, out, err = run_child(ppo_eqx("build-kernel"), env=worker_env() | {"PPO_EQX_CACHE": "/proc/self"})
    assert code == 1, out + err
    assert len(err) == 1 and "the kernel cache /proc/self is not writable" in err[0] and "/ld" not in err[0], err
