"""The docs name what exists: every back-quoted path in README.md and docs/*.md is a file or folder of this
checkout, every back-quoted ``ppo_eqx.NAME`` imports, and every back-quoted ``--flag`` is one of ``ppo-eqx``'s or of
a script in bench/ (issue 39: text that is false today stays caught)."""

import importlib
import re
from pathlib import Path

import pytest

from ppo_eqx.cli.command_line import build_parser

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PATH = re.compile(r"^(ppo_eqx|ppo_eqx_bench|tests|bench|docs|constraints|\.ci)/[\w./*-]*$|^(pyproject\.toml|tox\.ini)$")
DOTTED = re.compile(r"^ppo_eqx(\.[A-Za-z_]\w*)+$")
FLAG = re.compile(r"^--[a-z][a-z0-9-]+(?=[\s=]|$)")
PLACEHOLDERS = ("NAME", "--flag")
"""Spans that stand for any name: a path pattern (``tests/test_NAME.py``), a flag in general."""


def spans() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # code blocks are run or read elsewhere
        found += [(doc.name, span.strip()) for span in SPAN.findall(text) if not any(p in span for p in PLACEHOLDERS)]
    return found


def ppo_eqx_flags() -> set[str]:
    flags: set[str] = set()
    stack = [build_parser()]
    while stack:
        parser = stack.pop()
        for action in parser._actions:
            flags.update(option for option in action.option_strings if option.startswith("--"))
            stack.extend(action.choices.values() if isinstance(action.choices, dict) else [])
    return flags


def bench_text() -> str:
    return "\n".join(path.read_text() for path in (ROOT / "bench").rglob("*.py"))


def resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            thing = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                thing = getattr(thing, attribute)
        except AttributeError:
            return False
        return True
    return False


def test_back_quoted_paths_exist():
    missing = []
    for doc, span in spans():
        if PATH.match(span):
            path = span.rstrip("/")
            if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                missing.append((doc, span))
    assert not missing, missing


def test_back_quoted_ppo_eqx_names_import():
    wrong = [(doc, span) for doc, span in spans() if DOTTED.match(span) and not resolves(span)]
    assert not wrong, wrong


def test_back_quoted_flags_are_ppo_eqx_or_bench_flags():
    known, bench = ppo_eqx_flags(), bench_text()
    unknown = []
    for doc, span in spans():
        match = FLAG.match(span)
        if match and match.group(0) not in known and f'"{match.group(0)}"' not in bench:
            unknown.append((doc, span))
    assert not unknown, unknown


DESIGN = ROOT / "docs" / "design.md"
PACKAGES = ["core", "core/envs", "host", "host/run_dir", "cli"]


@pytest.mark.parametrize("package", PACKAGES)
def test_the_design_names_every_module_of_the_package(package: str) -> None:
    # "One iteration, file by file" and "The structure" list each folder's modules: one added or merged away is a
    # sentence to write or to drop.
    section = structure()
    named = set(re.findall(r"`(?:[\w/]+/)?(\w+\.py)`", section))
    modules = {path.name for path in (ROOT / "ppo_eqx" / package).glob("*.py") if path.name != "__init__.py"}
    assert modules <= named, sorted(modules - named)


def test_the_design_names_every_env_backend_and_no_other() -> None:
    from ppo_eqx.settings import ENV_BACKENDS

    # Each backend a config may name is in the module of its own that the design names (``jax``: an env object of
    # the user's, through ``jax_env.py``), and the design names no backend module that is not one.
    named = set(re.findall(r"`envs/(\w+)\.py`", structure()))
    modules = {f"{name}_env" if name == "jax" else name for name in ENV_BACKENDS}
    assert all((ROOT / "ppo_eqx" / "core" / "envs" / f"{module}.py").is_file() for module in modules)
    assert modules <= named, sorted(modules - named)
    assert named - modules <= {"spaces", "normalize"}, sorted(named - modules)


def structure() -> str:
    """docs/design.md from "One iteration, file by file" to the end of "The structure"."""
    text = DESIGN.read_text()
    return text[text.index("## One iteration, file by file") : text.index("## The pure functions")]


DEFAULT_SAID = re.compile(r"`(--[a-z][a-z0-9-]+)[^`]*`[^`(\n]{0,40}\((?:the )?default:? ([^),;]+)")
"""A back-quoted flag followed closely by "(default V": what the docs say its default is."""


def parser_defaults() -> dict[str, object]:
    defaults: dict[str, object] = {}
    stack = [build_parser()]
    while stack:
        parser = stack.pop()
        for action in parser._actions:
            defaults.update((option, action.default) for option in action.option_strings if option.startswith("--"))
            stack.extend(action.choices.values() if isinstance(action.choices, dict) else [])
    return defaults


def test_a_default_the_docs_state_is_the_flags_default() -> None:
    from ppo_eqx.config import PPOConfig

    defaults, said = parser_defaults(), []
    for doc in DOCS:
        said += [(doc.name, flag, value.strip()) for flag, value in DEFAULT_SAID.findall(doc.read_text())]
    assert said  # README's --episodes at least
    for doc, flag, value in said:
        default = defaults.get(flag)
        field = PPOConfig.__dataclass_fields__.get(flag[2:].replace("-", "_"))
        if default is None and field is not None:  # train's flags default to None: the config's (or preset's) value
            default = field.default
        assert str(default) == value, (doc, flag, value, default)
