"""The house keeps its shape (issue 33): data flows one way, ``core -> host -> cli``, and the core is pure.

Read from the source (``ast``), not by importing: a module's imports, wherever they are in it (a lazy import
inside a function counts as much as one at the top).
"""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "ppo_eqx"
LAYERS = ("core", "host", "cli")
"""The folders, lowest first: a module may import its own folder and those before it."""
IMPURE = {"subprocess", "ctypes", "logging", "shutil", "tempfile", "socket", "threading", "importlib", "os", "sys"}
"""What the core never imports: processes, loaded libraries or modules, the process's own state (its environment,
working directory, module table), logs, files, sockets, threads: names become objects at the edge (host.named)."""
FILE_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink", "rename", "replace"}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def layer_of(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 and parts[0] in LAYERS else None


def imported(path: Path) -> list[str]:
    """The absolute module names that ``path`` imports (relative imports resolved against its package)."""
    package = ["ppo_eqx", *path.relative_to(PACKAGE).parts[:-1]]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            names += [stem] + [f"{stem}.{alias.name}" for alias in node.names]
    return names


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_layer_above_its_own(path: Path) -> None:
    own = layer_of(path)
    allowed = LAYERS[: LAYERS.index(own) + 1] if own else ()
    above = [
        name
        for name in imported(path)
        if name.startswith("ppo_eqx.")
        and name.split(".")[1] in LAYERS
        and (own is None or name.split(".")[1] not in allowed)
    ]
    if own is None:
        # The top-level modules (config, settings, errors, presets) are below every layer, but for the public
        # face (__init__, _lazy, __main__), which only names and re-exports, and config's lazy backend lookup.
        top = path.name in ("__init__.py", "_lazy.py", "__main__.py") or path.name == "config.py"
        above = [] if top else above
    assert not above, f"{path.relative_to(PACKAGE)} imports {above}"


@pytest.mark.parametrize(
    "path", [p for p in modules() if layer_of(p) == "core"], ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_the_core_runs_no_process_loads_no_library_and_touches_no_file(path: Path) -> None:
    impure = sorted({name.split(".")[0] for name in imported(path)} & IMPURE)
    assert not impure, f"{path.relative_to(PACKAGE)} imports {impure}"
    calls = {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
    }
    assert not calls & FILE_CALLS, f"{path.relative_to(PACKAGE)} calls {sorted(calls & FILE_CALLS)}"


RUN_DIR = ("names", "lock", "manifest", "directory", "take")
"""``host/run_dir/``'s modules in their stack's order: each imports only those before it."""


@pytest.mark.parametrize("position", range(len(RUN_DIR)), ids=lambda i: RUN_DIR[i])
def test_the_run_directory_is_a_straight_stack(position: int) -> None:
    name = RUN_DIR[position]
    inside = {f"ppo_eqx.host.run_dir.{other}" for other in RUN_DIR[:position]}
    ours = {stem for stem in imported(PACKAGE / "host" / "run_dir" / f"{name}.py") if stem.startswith("ppo_eqx.")}
    beyond = {
        stem for stem in ours
        if not any(stem == allowed or stem.startswith(f"{allowed}.") for allowed in inside)
        and stem.split(".")[1] not in ("errors", "config")
    }  # fmt: skip
    assert not beyond, f"run_dir/{name}.py imports {sorted(beyond)}; allowed: {sorted(inside)}, errors, config"
    assert sorted(path.stem for path in (PACKAGE / "host" / "run_dir").glob("*.py")) == sorted([*RUN_DIR, "__init__"])


def test_host_keeps_at_most_15_modules_beside_the_run_directory() -> None:
    """host/ is what runs the core on a machine; the run directory is one room of it (issue 54)."""
    beside = sorted(path.stem for path in (PACKAGE / "host").glob("*.py") if path.stem != "__init__")
    assert len(beside) <= 15, beside
