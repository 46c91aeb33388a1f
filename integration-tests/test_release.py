"""The release checks (noxfile's `release-check` / `release-build`, tools/release.py) on a made-up
workspace: a releasable package passes, and each deliberate defect is named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = "https://github.com/example/monorepo"
DOCUMENTATION = "https://example.github.io/monorepo/"
README = "# paper-a\n\n" + "A method from a paper, as a library. " * 10 + "\n"


def tool(name: str) -> str:
    """A command installed beside this interpreter (the integration venv holds uv and nox)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"`{name}` is not installed beside {sys.executable}")
    return found


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def package(root: Path, name: str, version: str = "0.1.0", **overrides: str) -> Path:
    """A releasable member under packages/`name`; `overrides` replace pyproject.toml lines
    (`dependencies`, `classifiers`, `urls`, `extra`) or files (`changelog`)."""
    folder = root / "packages" / name
    module = name.replace("-", "_")
    urls = overrides.get(
        "urls",
        f"""
        [project.urls]
        Homepage = "{DOCUMENTATION}{name}/"
        Documentation = "{DOCUMENTATION}{name}/"
        Repository = "{REPOSITORY}/tree/main/packages/{name}"
        Changelog = "{REPOSITORY}/blob/main/packages/{name}/CHANGELOG.md"
        Issues = "{REPOSITORY}/issues"
        """,
    )
    write(
        folder / "pyproject.toml",
        f"""
        [build-system]
        requires = ["hatchling>=1.25"]
        build-backend = "hatchling.build"

        [project]
        name = "{name}"
        version = "{version}"
        description = "A paper's method."
        readme = "README.md"
        requires-python = ">=3.11"
        license = "Apache-2.0"
        dependencies = {overrides.get("dependencies", "[]")}
        classifiers = {overrides.get("classifiers", '["Typing :: Typed"]')}
        {textwrap.dedent(urls)}
        {overrides.get("extra", "")}
        [tool.hatch.build.targets.wheel]
        packages = ["src/{module}"]
        """,
    )
    (folder / "README.md").write_text(README)
    (folder / "LICENSE").write_text("Apache License, Version 2.0\n")
    changelog = overrides.get(
        "changelog", f"# Changelog\n\n## {version} (unreleased)\n\n- First.\n"
    )
    (folder / "CHANGELOG.md").write_text(changelog)
    write(folder / f"src/{module}/__init__.py", f'__version__ = "{version}"\n')
    (folder / f"src/{module}/py.typed").touch()
    write(folder / "tests/test_it.py", f"def test_it():\n    import {module}\n")
    return folder


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    write(
        tmp_path / "pyproject.toml",
        f"""
        [tool.uv.workspace]
        members = ["packages/*"]
        [tool.uv]
        package = false
        [tool.monorepo]
        repository = "{REPOSITORY}"
        documentation = "{DOCUMENTATION}"
        """,
    )
    package(tmp_path, "base")
    package(tmp_path, "paper-a", dependencies='["base>=0.1,<0.2"]')
    return tmp_path


def git(root: Path, *args: str) -> None:
    identity = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "tag.gpgSign=false"]
    subprocess.run(["git", "-C", str(root), *identity, *args], check=True, capture_output=True)


def problems(noxfile, root: Path, names=("base", "paper-a"), **kwargs) -> list[str]:
    """Build `names` with --no-sources, as the release sessions do, and check them."""
    noxfile.members.cache_clear()  # the made-up workspace changes between calls
    dist = root / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for name in names:
        subprocess.run(
            [tool("uv"), "build", "-q", "--no-sources", "--package", name, "--out-dir", str(dist)],
            cwd=root,
            check=True,
            capture_output=True,
        )
    try:
        return noxfile.release_problems(root, dist, list(names), **{"released": False, **kwargs})
    finally:
        noxfile.members.cache_clear()


def test_a_releasable_package_passes(noxfile, workspace):
    assert problems(noxfile, workspace) == []


def test_a_workspace_path_in_the_metadata_is_refused(noxfile, workspace):
    base = (workspace / "packages/base").as_uri()
    package(
        workspace,
        "paper-a",
        dependencies=f'["base @ {base}"]',
        extra="[tool.hatch.metadata]\nallow-direct-references = true\n",
    )
    found = problems(noxfile, workspace)
    assert any("points at a URL or path; build with --no-sources" in p for p in found), found
    assert any("metadata holds a local path file://" in p for p in found), found


def test_a_missing_or_undated_changelog_entry_is_refused(noxfile, workspace):
    package(workspace, "paper-a", changelog="# Changelog\n\n## 0.0.9\n\n- Older.\n")
    found = problems(noxfile, workspace, names=("paper-a",))
    assert found == ["paper-a 0.1.0: CHANGELOG.md has no `## 0.1.0` entry"]

    package(workspace, "paper-a")  # `## 0.1.0 (unreleased)`: fine until it is released
    assert problems(noxfile, workspace, names=("paper-a",)) == []
    found = problems(noxfile, workspace, names=("paper-a",), released=True)
    assert found == [
        "paper-a 0.1.0: the CHANGELOG.md entry is `(unreleased)`; a release dates it, "
        "`## 0.1.0 (YYYY-MM-DD)`"
    ]
    package(workspace, "paper-a", changelog="# Changelog\n\n## 0.1.0\n\n- First.\n")
    found = problems(noxfile, workspace, names=("paper-a",), released=True)
    assert found == [
        "paper-a 0.1.0: the CHANGELOG.md entry is undated; a release dates it, "
        "`## 0.1.0 (YYYY-MM-DD)`"
    ]
    package(workspace, "paper-a", changelog="# Changelog\n\n## 0.1.0 (2026-11-30)\n\n- First.\n")
    assert problems(noxfile, workspace, names=("paper-a",), released=True) == []


def test_a_changed_package_without_a_new_version_is_refused(noxfile, workspace):
    git(workspace, "init", "-q")
    git(workspace, "add", ".")
    git(workspace, "commit", "-q", "-m", "first")
    git(workspace, "tag", "paper-a-v0.1.0")
    git(workspace, "tag", "paper-a-v0.0.1")  # older tags do not count
    assert problems(noxfile, workspace) == []

    (workspace / "packages/paper-a/tests/test_more.py").write_text("def test_more():\n    pass\n")
    assert problems(noxfile, workspace) == [], "tests are not shipped: no new version needed"

    new_module = workspace / "packages/paper-a/src/paper_a/extra.py"
    new_module.write_text("ANSWER = 42\n")  # not yet known to git: still a change
    found = problems(noxfile, workspace)
    assert found == [
        "paper-a 0.1.0: 1 shipped file(s) changed since paper-a-v0.1.0 "
        "(packages/paper-a/src/paper_a/extra.py) but the version was not bumped"
    ]
    new_module.unlink()
    source = workspace / "packages/paper-a/src/paper_a/__init__.py"
    source.write_text(source.read_text() + "ANSWER = 42\n")
    found = problems(noxfile, workspace)
    assert found == [
        "paper-a 0.1.0: 1 shipped file(s) changed since paper-a-v0.1.0 "
        "(packages/paper-a/src/paper_a/__init__.py) but the version was not bumped"
    ]
    package(workspace, "paper-a", version="0.0.2", dependencies='["base>=0.1,<0.2"]')
    found = problems(noxfile, workspace)
    assert "paper-a 0.0.2: lower than the last release paper-a-v0.1.0" in found

    package(workspace, "paper-a", version="0.1.1", dependencies='["base>=0.1,<0.2"]')
    assert problems(noxfile, workspace) == []


def test_an_internal_range_must_admit_the_workspace_version(noxfile, workspace):
    package(
        workspace,
        "paper-a",
        dependencies='["base>=0.2"]',
        extra='[project.optional-dependencies]\ntest = ["base>=0.1,<0.2"]\n',
    )
    found = problems(noxfile, workspace)
    assert found == ["paper-a: requires base>=0.2, which excludes the workspace's base 0.1.0"]


def test_metadata_urls_license_and_py_typed_are_checked(noxfile, workspace):
    package(
        workspace,
        "paper-a",
        classifiers="[]",  # py.typed is shipped but the classifier is missing
        urls=f'[project.urls]\nHomepage = "https://elsewhere.example/"\nIssues = "{REPOSITORY}"\n',
    )
    (workspace / "packages/paper-a/LICENSE").unlink()
    found = problems(noxfile, workspace, names=("paper-a",))
    docs, repo = f"{DOCUMENTATION}paper-a/", f"{REPOSITORY}/tree/main/packages/paper-a"
    assert sorted(found) == sorted(
        [
            "paper-a 0.1.0: no license file in the wheel (add LICENSE next to pyproject.toml)",
            f"paper-a 0.1.0: [project.urls] Homepage = https://elsewhere.example/, not {docs}",
            f"paper-a 0.1.0: [project.urls] Issues = {REPOSITORY}, not {REPOSITORY}/issues",
            f"paper-a 0.1.0: no `Documentation` in [project.urls] (it is {docs})",
            f"paper-a 0.1.0: no `Repository` in [project.urls] (it is {repo})",
            "paper-a 0.1.0: no `Changelog` in [project.urls] (it is "
            f"{REPOSITORY}/blob/main/packages/paper-a/CHANGELOG.md)",
            "paper-a 0.1.0: the classifier 'Typing :: Typed' and paper_a/py.typed in the wheel "
            "must go together (classifier: False, file: True)",
            "paper-a 0.1.0: the sdist has no LICENSE",
        ]
    )


def test_a_readme_with_relative_links_or_a_local_path_is_refused(noxfile, workspace):
    folder = workspace / "packages/paper-a"
    (folder / "README.md").write_text(
        README
        + "See [the benchmark](benchmarks/bench.py), ![a plot](plot.png) and [ref].\n\n"
        + "[ref]: ../other/README.md\n\n"
        + "Fine: [docs](https://example.com/x), [a section](#install), `[not](a link)`.\n\n"
        + f"Built in {workspace}.\n"
    )
    found = problems(noxfile, workspace, names=("paper-a",))
    relative = [p for p in found if "a relative path PyPI cannot follow" in p]
    assert [p.split("links to ")[1].split(",")[0] for p in relative] == [
        "'benchmarks/bench.py'",
        "'plot.png'",
        "'../other/README.md'",
    ]
    assert f"paper-a 0.1.0: the wheel's metadata holds a local path {workspace}" in found


def test_release_tags_name_a_member_at_its_version(noxfile, workspace):
    release = noxfile.release
    tag = release.Tag.parse("refs/tags/tfla-mlstm-v0.2.0rc1")
    assert (tag.package, str(tag.version), str(tag)) == (
        "tfla-mlstm",
        "0.2.0rc1",
        "tfla-mlstm-v0.2.0rc1",
    )
    # not tags, or tags written in a way the next release's search would not find
    for bad in ("flashdp-0.1.0", "-v0.1.0", "flashdp-vnext", "Flash_DP-v1.0", "flashdp-v0.2.0-rc1"):
        with pytest.raises(ValueError, match="release tag"):
            release.Tag.parse(bad)
    found = problems(noxfile, workspace, names=("paper-a",), released=True, tag="paper-a-v0.2.0")
    assert found == [
        "release tag paper-a-v0.2.0: paper-a's version is 0.1.0",
        "paper-a 0.1.0: the CHANGELOG.md entry is `(unreleased)`; a release dates it, "
        "`## 0.1.0 (YYYY-MM-DD)`",
    ]
    found = problems(noxfile, workspace, names=("paper-a",), tag="paper-b-v0.1.0")
    assert "release tag paper-b-v0.1.0: no workspace member is called paper-b" in found


def run_session(workspace: Path, *args: str) -> subprocess.CompletedProcess:
    """A session of the repository's noxfile (copied, with tools/release.py) in `workspace`."""
    shutil.copy(ROOT / "noxfile.py", workspace / "noxfile.py")
    (workspace / "tools").mkdir(exist_ok=True)
    shutil.copy(ROOT / "tools/release.py", workspace / "tools/release.py")
    pyproject = workspace / "pyproject.toml"
    if "[dependency-groups]" not in pyproject.read_text():
        with pyproject.open("a") as file:
            group = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
            file.write(f"[dependency-groups]\nrelease = {json.dumps(group['release'])}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOX", "VIRTUAL_ENV"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return subprocess.run(
        [tool("nox"), "--no-color", "-s", *args],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_release_test_session_tests_the_installed_wheel_outside_the_workspace(workspace):
    # paper-a's sdist test fails unless paper_a and base come from wheels installed in a venv
    # outside the workspace (base from a wheel built by the session, not from its folder)
    package(
        workspace,
        "paper-a",
        dependencies='["base>=0.1,<0.2"]',
        extra='[project.optional-dependencies]\ntest = ["pytest>=8"]\n',
    )
    write(
        workspace / "packages/paper-a/tests/test_it.py",
        f"""
        from pathlib import Path

        import base
        import paper_a

        def test_installed_outside_the_workspace():
            for module in (paper_a, base):
                path = Path(module.__file__).resolve()
                assert "site-packages" in path.parts, path
                assert not path.is_relative_to({str(workspace.resolve())!r}), path
        """,
    )
    done = run_session(workspace, "release-test", "--", "paper-a")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout + done.stderr


def test_the_release_check_session_fails_on_a_broken_workspace(workspace):
    package(workspace, "paper-a", changelog="# Changelog\n")
    done = run_session(workspace, "release-check")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "paper-a 0.1.0: CHANGELOG.md has no `## 0.1.0` entry" in done.stderr, done.stderr
    assert "base" not in done.stderr.split("not releasable:")[1].split("(took")[0]


def test_lower_bounds_pin_each_direct_dependency_at_its_floor(noxfile):
    requirements = [
        noxfile.release.Requirement(spec)
        for spec in (
            "torch>=2.10",
            "numpy>=1.24,<3",
            "Scipy~=1.10.1",
            "pytest>=8",
            "pytest>=8.2",  # the same name twice: the higher floor
            "tqdm",  # no floor: left to the resolver
            "triton>=3.7; sys_platform == 'no-such-platform'",  # marker does not apply
            "base>=0.1,<0.2",  # a workspace member: built locally, not from the index
            "pkg>0.5",  # an exclusive bound names no version to pin
        )
    ]
    assert noxfile.release.lower_bounds(requirements, {"base"}) == [
        "numpy==1.24",
        "pytest==8.2",
        "scipy==1.10.1",
        "torch==2.10",
    ]


def test_the_workspace_pytest_settings_travel_with_a_release_test(noxfile, tmp_path):
    # outside the workspace the root pyproject's pytest options (plugin, strictness, warnings as
    # errors) still apply: they are written into the pytest.ini the release test runs with
    text = noxfile.pytest_config(tmp_path).read_text()
    assert text.startswith("[pytest]\n")
    assert "addopts =\n" in text
    assert "\n    -p\n    kernels_common.pytest_plugin\n" in text
    assert "\n    --strict-markers\n" in text
    assert "xfail_strict = true\n" in text
    assert "filterwarnings =\n    error\n" in text


def test_the_release_build_session_builds_a_tag_and_refuses_a_released_version(workspace):
    dated = "# Changelog\n\n## 0.1.0 (2026-11-30)\n\n- First.\n"
    package(workspace, "paper-a", dependencies='["base>=0.1,<0.2"]', changelog=dated)
    git(workspace, "init", "-q")
    git(workspace, "add", ".")
    git(workspace, "commit", "-q", "-m", "first")

    done = run_session(workspace, "release-build", "--", "paper-a-v0.1.0")
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((workspace / "dist/release.json").read_text())
    assert record == {"package": "paper-a", "version": "0.1.0", "tag": "paper-a-v0.1.0"}
    assert sorted(p.name for p in (workspace / "dist").glob("paper_a-*")) == [
        "paper_a-0.1.0-py3-none-any.whl",
        "paper_a-0.1.0.tar.gz",
    ]

    git(workspace, "tag", "paper-a-v0.1.0")  # released: by hand, the same version is refused
    done = run_session(workspace, "release-build", "--", "paper-a")
    assert done.returncode != 0
    assert "paper-a 0.1.0 is already released (paper-a-v0.1.0)" in done.stderr, done.stderr
