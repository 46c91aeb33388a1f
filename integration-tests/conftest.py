"""Integration tests run with every workspace member installed together (`nox -s integration`)."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def workspace_members() -> list[dict]:
    """The `[project]` tables of every workspace member, read from the repository."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"][
        "members"
    ]
    return [
        tomllib.loads(path.read_text())["project"]
        for pattern in globs
        for path in sorted(ROOT.glob(f"{pattern}/pyproject.toml"))
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests taking a `project` argument run once per workspace member."""
    if "project" in metafunc.fixturenames:
        projects = workspace_members()
        metafunc.parametrize("project", projects, ids=[p["name"] for p in projects])


@pytest.fixture(scope="session")
def noxfile():
    """The repository's noxfile.py as a module (its workspace and release logic)."""
    spec = importlib.util.spec_from_file_location("workspace_noxfile", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture
def import_names() -> list[str]:
    return [project["name"].replace("-", "_") for project in workspace_members()]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.integration)


@pytest.fixture
def console_scripts() -> dict[str, str]:
    """Every member's console script -> its target (``module:function``)."""
    return {
        name: target
        for project in workspace_members()
        for name, target in project.get("scripts", {}).items()
    }
