"""The noxfile's workspace logic on a made-up workspace: members, dependency closure, per-extra
system packages, torch pin."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    write(tmp_path / "pyproject.toml", '[tool.uv.workspace]\nmembers = ["base", "packages/*"]\n')
    write(
        tmp_path / "base/pyproject.toml",
        """
        [project]
        name = "base"
        version = "0.1.0"
        dependencies = ["torch>=2.4"]
        [project.optional-dependencies]
        test = ["pytest"]
        report = ["matplotlib"]
        """,
    )
    write(
        tmp_path / "packages/paper-a/pyproject.toml",
        """
        [project]
        name = "paper-a"
        version = "0.1.0"
        dependencies = ["base>=0.1,<0.2", "numpy"]
        [project.optional-dependencies]
        test = ["pytest", "base[test]>=0.1,<0.2"]
        reproduce = ["base[report]>=0.1,<0.2", "paper-data"]
        never = ["base[test]; sys_platform == 'no-such-platform'"]
        [tool.monorepo]
        reproduce = true
        apt = ["dataset-fashion-mnist"]
        """,
    )
    write(
        tmp_path / "packages/paper-data/pyproject.toml",
        """
        [project]
        name = "Paper_Data"
        version = "0.1.0"
        dependencies = ["base"]
        [project.optional-dependencies]
        text = []
        model = ["transformers"]
        all = ["paper-data[text,model]"]
        [tool.monorepo.apt]
        text = ["fortunes"]
        [tool.monorepo.no-deps]
        model = ["weights-wheel==1.0"]
        """,
    )
    return tmp_path


def test_members_are_found_from_the_globs(noxfile, workspace):
    members = noxfile.members(workspace)
    assert sorted(members) == ["base", "paper-a", "paper-data"]
    assert members["paper-a"].import_name == "paper_a"
    assert members["paper-a"].tool == {"reproduce": True, "apt": ["dataset-fashion-mnist"]}


def test_closure_follows_workspace_dependencies_with_their_extras(noxfile, workspace):
    assert noxfile.closure("paper-a", set(), workspace) == {"paper-a": set(), "base": set()}
    assert noxfile.closure("paper-a", {"test"}, workspace) == {
        "paper-a": {"test"},
        "base": {"test"},
    }
    assert noxfile.closure("paper-a", {"test", "reproduce"}, workspace) == {
        "paper-a": {"test", "reproduce"},
        "base": {"test", "report"},
        "paper-data": set(),
    }


def test_closure_skips_requirements_whose_marker_does_not_apply(noxfile, workspace):
    assert noxfile.closure("paper-a", {"never"}, workspace) == {"paper-a": {"never"}, "base": set()}


def test_unknown_extra_is_an_error(noxfile, workspace):
    with pytest.raises(ValueError, match=r"paper-a has no extra\(s\) \['gpu'\]"):
        noxfile.closure("paper-a", {"gpu"}, workspace)


def test_torch_pin_prefers_the_local_cpu_wheel(noxfile, tmp_path: Path):
    assert noxfile.torch_pin(str(tmp_path)) == "torch==2.13.0"
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    assert noxfile.torch_pin(f"/nonexistent {tmp_path}") == "torch==2.13.0+cpu"
    assert noxfile.torch_pin("") == "torch==2.13.0"


def test_system_packages_and_no_deps_installs_follow_the_extras(noxfile, workspace):
    members = noxfile.members(workspace)
    data = members["paper-data"]
    assert data.per_extra("apt", set()) == set()
    assert data.per_extra("apt", {"text"}) == {"fortunes"}
    assert data.per_extra("no-deps", {"text"}) == set()
    assert data.per_extra("no-deps", {"model", "text"}) == {"weights-wheel==1.0"}
    # a list applies whatever the extras
    assert members["paper-a"].per_extra("apt", set()) == {"dataset-fashion-mnist"}
    # a self-referencing extra pulls in the extras it names, and so their system packages
    wanted = noxfile.closure("paper-data", {"all"}, workspace)["paper-data"]
    assert wanted == {"all", "text", "model"}
    assert data.per_extra("apt", wanted) == {"fortunes"}


def test_per_extra_table_naming_an_unknown_extra_is_an_error(noxfile, workspace):
    write(
        workspace / "packages/paper-b/pyproject.toml",
        """
        [project]
        name = "paper-b"
        version = "0.1.0"
        [tool.monorepo.apt]
        typo = ["fortunes"]
        """,
    )
    with pytest.raises(ValueError, match=r"paper-b: \[tool.monorepo.apt\] names unknown extras"):
        noxfile.members(workspace)["paper-b"].per_extra("apt", set())
