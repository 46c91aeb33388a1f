"""Every task a person or CI runs. Sessions are discovered from the uv workspace members.

    ./noxw -l                       # list the sessions
    ./noxw -t ci                    # what CI runs: every package's tests, integration, lint,
                                    # release-check, docs
    ./noxw -s tests-kernels-common  # one package, in a venv holding only it and its dependencies
    ./noxw -s reproduce             # every package's `reproduce --quick` -> reports/index.md
    ./noxw -s bench                 # every package's benchmarks/bench_*.py -> reports/bench/
    ./noxw -s gpu                   # on a CUDA machine: gpu tests (--require-gpu) + GPU benchmarks
    ./noxw -s build                 # wheel + sdist of every member, each installed in a clean venv
    ./noxw -s release-build -- flashdp-v0.2.0   # one release built and checked into dist/
    ./noxw -s release-test -- flashdp           # its wheel tested outside the repository
    ./noxw -s lowest-direct-flashdp # its tests at the lowest versions its ranges allow
    ./noxw -s docs                  # the documentation site into site/ (strict)

A member declares what its sessions need in its own pyproject.toml: the `test` extra (pytest,
kernels-common for the shared markers, peers), optional `gpu`/`bench`/`reproduce` extras, and a
`[tool.monorepo]` table: `reproduce = true` when `python -m <import_name> reproduce --quick --out
DIR` exists; `apt` for the Debian packages its data needs and `no-deps` for requirements installed
without their own dependencies, each either a list (always) or a table keyed by the extra that
needs them (`[tool.monorepo.apt] fashion = ["dataset-fashion-mnist"]`), so a session installs
heavy data only when one of its packages asks for that extra.

Torch: the CPU build of torch 2.13.0. Where pip knows a local wheel folder (`pip config get
global.find-links`) it is handed to uv at run time and the pin selects the wheel found there;
elsewhere uv takes torch from the CPU index (UV_TORCH_BACKEND=cpu). The `gpu` session instead uses
the normal CUDA build from PyPI.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

import nox
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent
PYTHON = "3.11"
TORCH_VERSION = "2.13.0"
TRITON_RANGE = "triton>=3.6,<3.9"
# triton 3.6's CPU interpreter cannot take a runtime loop bound (`range(n)`) under NumPy >= 1.25;
# kernels-common's `test` extra asks for this range, and lowest-direct holds torch's pin to it
TRITON_INTERPRETER_RANGE = "triton>=3.7,<3.9"
REPORTS = ROOT / "reports"

nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")


def _load_release_module():
    """tools/release.py: what a member is and what makes it releasable (stdlib + packaging)."""
    spec = importlib.util.spec_from_file_location("workspace_release", ROOT / "tools/release.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


release = _load_release_module()
Member = release.Member


@functools.cache
def members(root: Path = ROOT) -> dict[str, Member]:
    """Workspace members by canonical name, from `[tool.uv.workspace].members` globs."""
    workspace = tomllib.loads((root / "pyproject.toml").read_text())
    found: dict[str, Member] = {}
    for pattern in workspace["tool"]["uv"]["workspace"]["members"]:
        for pyproject in sorted(root.glob(f"{pattern}/pyproject.toml")):
            data = tomllib.loads(pyproject.read_text())
            member = Member(
                pyproject.parent, data["project"], data.get("tool", {}).get("monorepo", {})
            )
            found[canonicalize_name(member.name)] = member
    return found


def closure(name: str, extras: set[str], root: Path = ROOT) -> dict[str, set[str]]:
    """The member with `extras` and every workspace member it needs, with the extras each needs."""
    table = members(root)
    needed: dict[str, set[str]] = {}
    pending = [(canonicalize_name(name), set(extras))]
    while pending:
        current, wanted = pending.pop()
        if current in needed and wanted <= needed[current]:
            continue
        needed[current] = needed.get(current, set()) | wanted
        for requirement in table[current].requirements(wanted):
            dependency = canonicalize_name(requirement.name)
            if dependency in table and (
                requirement.marker is None or requirement.marker.evaluate()
            ):
                pending.append((dependency, set(requirement.extras)))
    return needed


@functools.cache
def local_wheel_folder() -> str | None:
    """The local wheel folder pip is configured with, discovered at run time (never committed)."""
    if os.environ.get("UV_FIND_LINKS"):
        return os.environ["UV_FIND_LINKS"]
    try:
        out = subprocess.run(
            ["python3", "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        return None
    return out or None


def torch_pin(folder: str | None = None) -> str:
    """`torch==2.13.0+cpu` when the local wheel folder holds that wheel, else `torch==2.13.0`."""
    folder = (folder if folder is not None else local_wheel_folder()) or ""
    if any(any(Path(entry).glob(f"torch-{TORCH_VERSION}+cpu-*.whl")) for entry in folder.split()):
        return f"torch=={TORCH_VERSION}+cpu"
    return f"torch=={TORCH_VERSION}"


def prepare_env(session: nox.Session, *, cuda: bool = False) -> Path:
    """Point uv at the right torch and write the run's constraints; returns the constraints file."""
    pins = [] if cuda else [torch_pin()]
    if pins and pins[0].endswith("+cpu"):
        session.env["UV_FIND_LINKS"] = local_wheel_folder()
    elif not cuda:  # no local CPU wheel: the CPU wheel index, never PyPI's CUDA build
        session.env["UV_TORCH_BACKEND"] = "cpu"
    constraints = Path(session.create_tmp()) / "constraints.txt"
    constraints.write_text("\n".join([*pins, TRITON_RANGE]) + "\n")
    return constraints


# listed in a member's `apt` table instead of a package: its data reads the package index itself
# (`apt-cache dumpavail`), which images often ship empty (`rm -rf /var/lib/apt/lists/*`)
APT_INDEX = "apt-index"


def _apt_index_missing() -> bool:
    return not any(Path("/var/lib/apt/lists").glob("*_Packages*"))


def ensure_apt(session: nox.Session, packages: set[str]) -> None:
    """Install the Debian packages a member's data needs (apt-get update once per .nox folder),
    and download the package index where a member reads it (`APT_INDEX`) and it is empty."""
    need_index = APT_INDEX in packages and _apt_index_missing()
    missing = sorted(
        p
        for p in packages - {APT_INDEX}
        if subprocess.run(["dpkg", "-s", p], capture_output=True, check=False).returncode != 0
    )
    if not missing and not need_index:
        return
    # root, or passwordless sudo (CI runners); otherwise say what to install
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    can_sudo = not sudo or (
        shutil.which("sudo") is not None
        and subprocess.run([*sudo, "true"], capture_output=True, check=False).returncode == 0
    )
    if not can_sudo or not shutil.which("apt-get"):
        if not missing:
            session.error("needs the Debian package index: run `sudo apt-get update`")
        session.error(
            f"needs Debian packages {missing}: run `sudo apt-get install {' '.join(missing)}`"
        )
    stamp = ROOT / ".nox" / ".apt-updated"
    if not stamp.exists() or need_index:
        session.run(*sudo, "apt-get", "update", "-qq", external=True)
        stamp.parent.mkdir(exist_ok=True)
        stamp.touch()
    if not missing:
        return
    session.run(
        *sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing,
        external=True,
    )  # fmt: skip


def install(session: nox.Session, wanted: dict[str, set[str]], *, cuda: bool = False) -> None:
    """Install members (name -> extras) with their workspace dependencies, non-editable."""
    needed: dict[str, set[str]] = {}
    for name, extras in wanted.items():
        for dependency, dep_extras in closure(name, extras).items():
            needed[dependency] = needed.get(dependency, set()) | dep_extras
    table = members()
    ensure_apt(
        session,
        {p for name, extras in needed.items() for p in table[name].per_extra("apt", extras)},
    )
    specs = []
    for name, extras in sorted(needed.items()):
        suffix = f"[{','.join(sorted(extras))}]" if extras else ""
        specs.append(f"{table[name].path}{suffix}")
    constraints = str(prepare_env(session, cuda=cuda))
    session.install("-c", constraints, *specs)
    no_deps = sorted(
        {r for name, extras in needed.items() for r in table[name].per_extra("no-deps", extras)}
    )
    if no_deps:
        session.install("--no-deps", "-c", constraints, *no_deps)


def available(member: Member, *extras: str) -> set[str]:
    return {e for e in extras if e in member.extras}


def run_tests(session: nox.Session, member: Member) -> None:
    if "test" not in member.extras:
        session.error(f"{member.name} needs a `test` extra (pytest, kernels-common, peers)")
    install(session, {canonicalize_name(member.name): {"test"}})
    session.env["TRITON_INTERPRET"] = "1"  # Triton kernels run on the CPU interpreter here
    session.run("pytest", str(member.path / "tests"), *session.posargs)


def tests_session(member: Member):
    def session_function(session: nox.Session) -> None:
        run_tests(session, member)

    session_function.__doc__ = (
        f"{member.name}'s tests, in a venv holding only it and its dependencies."
    )
    return session_function


for _member in members().values():
    nox.session(name=f"tests-{_member.name}", python=PYTHON, tags=["tests", "ci"])(
        tests_session(_member)
    )


@nox.session(python=PYTHON, tags=["ci"])
def integration(session: nox.Session) -> None:
    """All members installed together; runs integration-tests/."""
    install(session, {name: available(m, "test") for name, m in members().items()})
    # the noxfile's own workspace logic is tested there too
    session.install(*nox.project.dependency_groups(nox.project.load_toml("pyproject.toml"), "nox"))
    session.env["TRITON_INTERPRET"] = "1"
    session.run("pytest", str(ROOT / "integration-tests"), *session.posargs)


@nox.session(python=PYTHON, tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff check + ruff format --check over the whole repository."""
    session.install(*nox.project.dependency_groups(nox.project.load_toml("pyproject.toml"), "lint"))
    session.run("ruff", "check", str(ROOT))
    session.run("ruff", "format", "--check", str(ROOT))


@nox.session(python=PYTHON, default=False)
def reproduce(session: nox.Session) -> None:
    """Every package's `reproduce --quick`, gathered into reports/index.md."""
    runners = [m for m in members().values() if m.tool.get("reproduce")]
    wanted = {canonicalize_name(m.name): available(m, "reproduce") for m in runners}
    wanted[canonicalize_name("kernels-common")] = {"report"}
    install(session, wanted)
    failed = []
    for member in runners:
        out = REPORTS / member.name
        shutil.rmtree(out, ignore_errors=True)
        try:
            session.run(
                "python", "-m", member.import_name, "reproduce", "--quick", "--out", str(out)
            )
        except nox.command.CommandFailed:
            failed.append(member.name)
    names = [m.name for m in runners]
    session.run("kernels-common", "report", str(REPORTS), "--failed", *failed, "--expected", *names)
    if failed:
        session.error(f"reproduce failed for {failed}; see {REPORTS / 'index.md'}")


def run_benchmarks(session: nox.Session, *, cuda: bool) -> None:
    scripts = {
        key: sorted((member.path / "benchmarks").glob("bench_*.py"))
        for key, member in members().items()
    }
    scripts = {key: paths for key, paths in scripts.items() if paths}
    extras = ("bench", "gpu") if cuda else ("bench",)
    install(session, {key: available(members()[key], *extras) for key in scripts}, cuda=cuda)
    device = "cuda" if cuda else "cpu"
    for key, paths in scripts.items():
        out = REPORTS / "bench" / members()[key].name
        for script in paths:
            session.run("python", str(script), "--device", device, "--out", str(out))


@nox.session(python=PYTHON, default=False)
def bench(session: nox.Session) -> None:
    """Every package's benchmarks/bench_*.py on the CPU, tables into reports/bench/."""
    run_benchmarks(session, cuda=False)


@nox.session(python=PYTHON, default=False)
def gpu(session: nox.Session) -> None:
    """On a CUDA machine: all tests with --require-gpu (gpu tests must run), then GPU benchmarks."""
    os.environ.pop("UV_TORCH_BACKEND", None)  # the CUDA build from PyPI, not a CPU index
    session.env["TRITON_INTERPRET"] = "0"  # compiled kernels, even if the caller's shell set it
    wanted = {name: available(m, "test", "gpu") for name, m in members().items()}
    install(session, wanted, cuda=True)
    test_dirs = [str(m.path / "tests") for m in members().values()]
    session.run("pytest", "--require-gpu", *test_dirs, *session.posargs)
    run_benchmarks(session, cuda=True)


def build_distributions(session: nox.Session, names: list[str], out: Path) -> None:
    """Wheel and sdist of each member into `out`, as they would be published: `--no-sources`, so
    workspace members stay version ranges (never paths) in the metadata."""
    for name in names:
        session.run(
            "uv", "build", "-q", "--no-sources", "--package", members()[name].name,
            "--out-dir", str(out), external=True,
        )  # fmt: skip


def fresh_members() -> list[str]:
    """uv options that install the workspace members' wheels as built now: uv's cache keeps a
    wheel by name and version, and would install an older build of the same version."""
    return [arg for m in members().values() for arg in ("--refresh-package", m.name)]


def find_links(*folders: Path) -> list[str]:
    """`--find-links` arguments for `folders` and the local torch wheel folder, if any."""
    links = [str(folder) for folder in folders] + (local_wheel_folder() or "").split()
    return [arg for link in links for arg in ("--find-links", link)]


@nox.session(python=PYTHON, default=False)
def build(session: nox.Session) -> None:
    """Build every member's wheel and sdist, then install each wheel alone in a clean venv."""
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    build_distributions(session, list(members()), dist)
    constraints = prepare_env(session)
    for name, member in members().items():
        wheel, _ = release.find_distributions(dist, members()[name])
        venv = Path(session.create_tmp()) / f"venv-{member.name}"
        session.run("uv", "venv", "-q", "-p", sys.executable, str(venv), external=True)
        python = str(venv / "bin" / "python")
        install_wheel = ["uv", "pip", "install", "-q", "-p", python, "-c", str(constraints)]
        session.run(*install_wheel, *fresh_members(), *find_links(dist), str(wheel), external=True)
        session.run(
            python,
            "-c",
            f"import {member.import_name} as m; print(m.__name__, m.__version__)",
            external=True,
        )


# -- releases: CONTRIBUTING.md, "Releasing"; the checks themselves are in tools/release.py -------


def release_problems(
    root: Path, dist: Path, names: list[str], *, released: bool, tag: str | None = None
) -> list[str]:
    """Everything that keeps the members `names` (built into `dist`) from being released."""
    table = members(root)
    urls = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["monorepo"]
    problems = release.check_internal_ranges(table)
    if tag is not None:
        problems += release.check_tag(release.Tag.parse(tag), table)
    for name in names:
        project = table[name]
        try:
            wheel, sdist = release.find_distributions(dist, project)
        except ValueError as error:
            problems.append(str(error))
            continue
        problems += release.check_distribution(
            wheel,
            sdist,
            project,
            repository=urls["repository"],
            documentation=urls["documentation"],
            workspace=root,
        )
        problems += release.check_changelog(project, released=released)
        problems += release.check_version_bumped(root, project)
    return problems


def twine_check(session: nox.Session, dist: Path) -> None:
    """PyPI's own rendering of every readme, and its metadata rules (`--strict`: warnings fail)."""
    session.install(
        *nox.project.dependency_groups(nox.project.load_toml("pyproject.toml"), "release")
    )
    files = sorted(str(p) for p in dist.iterdir() if p.name.endswith((".whl", ".tar.gz")))
    session.run("twine", "check", "--strict", *files)


@nox.session(name="release-check", python=PYTHON, tags=["ci"])
def release_check(session: nox.Session) -> None:
    """Every member built as it would be published and checked: metadata, readme, license, URLs,
    py.typed, internal ranges, changelog entry, version bumped since the last tag."""
    dist = Path(session.create_tmp()) / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    build_distributions(session, list(members()), dist)
    twine_check(session, dist)
    problems = release_problems(ROOT, dist, list(members()), released=False)
    if problems:
        session.error("not releasable:\n  " + "\n  ".join(problems))
    session.log(f"{len(members())} members releasable")


def release_target(session: nox.Session) -> tuple[str, str | None]:
    """The member (and tag, if given one) named by `-- <package>` or `-- <package>-v<version>`."""
    if len(session.posargs) != 1:
        session.error("name one package or release tag: -- flashdp  or  -- flashdp-v0.2.0")
    arg = session.posargs[0].removeprefix("refs/tags/")
    if canonicalize_name(arg) in members():
        return canonicalize_name(arg), None
    try:
        return release.Tag.parse(arg).package, arg
    except ValueError as error:
        session.error(f"{arg!r} is neither a workspace member nor a release tag: {error}")


RELEASE_FILE = "release.json"  # what release-build built: {"package", "version", "tag"}


@nox.session(name="release-build", python=PYTHON, default=False)
def release_build(session: nox.Session) -> None:
    """One member's wheel and sdist into dist/, checked for release (its CHANGELOG entry dated;
    given a tag, the tag's version must be the package's; given a package, its version must not
    have been released). Writes dist/release.json, which the release workflow reads."""
    name, tag = release_target(session)
    if name not in members():
        session.error(f"release tag {tag}: no workspace member is called {name}")
    project = members()[name]
    release_tag = str(release.Tag(name, project.version))
    if tag is None and release.is_repository_root(ROOT):
        tagged = subprocess.run(
            ["git", "-C", str(ROOT), "tag", "--list", release_tag],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        if tagged:
            session.error(f"{name} {project.version} is already released ({release_tag})")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    build_distributions(session, [name], dist)
    twine_check(session, dist)
    problems = release_problems(ROOT, dist, [name], released=True, tag=tag)
    if problems:
        session.error("not releasable:\n  " + "\n  ".join(problems))
    record = {"package": name, "version": str(project.version), "tag": release_tag}
    (dist / RELEASE_FILE).write_text(json.dumps(record) + "\n")
    session.log(f"{release_tag}: releasable, in {dist}")


def pytest_config(folder: Path) -> Path:
    """The workspace's pytest settings (root pyproject.toml) as a pytest.ini in `folder`, for
    running a package's tests outside the workspace."""
    workspace = tomllib.loads((ROOT / "pyproject.toml").read_text())
    options = workspace.get("tool", {}).get("pytest", {}).get("ini_options", {})
    lines = ["[pytest]"]
    for key, value in options.items():
        if isinstance(value, list):
            lines.append(f"{key} =" + "".join(f"\n    {item}" for item in value))
        else:
            lines.append(f"{key} = {str(value).lower() if isinstance(value, bool) else value}")
    config = folder / "pytest.ini"
    config.write_text("\n".join(lines) + "\n")
    return config


@nox.session(name="release-test", python=PYTHON, default=False)
def release_test(session: nox.Session) -> None:
    """A member's wheel installed in a venv outside the repository and its tests (from its sdist)
    run against it. `-- <package>` builds the wheel and the other members it needs here;
    `-- <package> --registry` tests the wheel release-build left in dist/, with the other members
    from the package index (their released versions), as the release workflow does."""
    registry = "--registry" in session.posargs
    session.posargs[:] = [arg for arg in session.posargs if arg != "--registry"]
    name, _ = release_target(session)
    member = members()[name]
    needed = closure(name, {"test"})
    outside = Path(tempfile.mkdtemp(prefix=f"release-test-{name}-"))
    try:
        if outside.resolve().is_relative_to(ROOT):
            session.error(f"the temporary folder {outside} is inside the repository")
        own, internal = (ROOT / "dist", None) if registry else (outside / "dist", outside / "dist")
        if not registry:
            build_distributions(session, sorted(needed), own)
        try:
            wheel, sdist = release.find_distributions(own, member)
        except ValueError as error:
            session.error(f"{error} (run release-build first)" if registry else str(error))
        ensure_apt(
            session, {p for n, e in needed.items() for p in members()[n].per_extra("apt", e)}
        )
        venv = outside / "venv"
        session.run("uv", "venv", "-q", "-p", sys.executable, str(venv), external=True)
        python = str(venv / "bin" / "python")
        constraints = str(prepare_env(session))
        uv_install = ["uv", "pip", "install", "-q", "-p", python, "-c", constraints]
        # the wheel by its path; the other members from wheels built here, or from the index
        links = find_links(internal) if internal else find_links()
        links += [] if registry else fresh_members()
        session.run(*uv_install, "--no-sources", *links, f"{wheel}[test]", external=True)
        no_deps = sorted(
            {r for n, e in needed.items() for r in members()[n].per_extra("no-deps", e)}
        )
        if no_deps:
            session.run(*uv_install, "--no-deps", *no_deps, external=True)
        with tarfile.open(sdist) as archive:
            archive.extractall(outside, filter="data")
        source = outside / f"{member.dist_name}-{member.version}"
        # run from outside the repository, with nothing of it on the path or in TMPDIR
        env = {"TRITON_INTERPRET": "1", "PYTHONPATH": "", "TMPDIR": str(outside)}
        session.chdir(outside)
        imported = session.run(
            python, "-c", f"import {member.import_name} as m; print(m.__file__)",
            external=True, silent=True, env=env, stderr=None,
        ).strip().splitlines()[-1]  # fmt: skip
        if not Path(imported).resolve().is_relative_to(venv.resolve()):
            session.error(f"{member.import_name} was imported from {imported}, not from {venv}")
        session.run(
            python, "-m", "pytest", "-c", str(pytest_config(outside)), "--rootdir", str(source),
            str(source / "tests"), external=True, env=env,
        )  # fmt: skip
    finally:
        session.chdir(ROOT)
        shutil.rmtree(outside, ignore_errors=True)


def lowest_direct_session(member: Member):
    def session_function(session: nox.Session) -> None:
        name = canonicalize_name(member.name)
        needed = closure(name, {"test"})
        tmp = Path(session.create_tmp())
        internal = tmp / "internal"
        shutil.rmtree(internal, ignore_errors=True)
        build_distributions(session, sorted(needed), internal)
        ensure_apt(
            session, {p for n, e in needed.items() for p in members()[n].per_extra("apt", e)}
        )
        # the CPU torch index, or the local wheel folder and PyPI; no pins: torch at its floor.
        # Where the local folder lacks the floor and the CPU index is out of reach, PyPI's build
        # of torch is the one there is: its CUDA build, which runs on the CPU
        prepare_env(session)
        # uv's lowest-direct keeps a direct dependency that others also require (torch) at its
        # highest; the floors are pinned outright, so every declared lower bound is what runs
        floors = tmp / "floors.txt"
        own = member.requirements(needed[name])  # the test extra and the extras it names
        floors.write_text("\n".join(release.lower_bounds(own, set(members()))) + "\n")
        # PyPI's torch wheels pin the triton they were built with (torch 2.10: 3.6); the CPU
        # builds do not. The tests run kernels on triton's interpreter, which needs 3.7
        overrides = tmp / "overrides.txt"
        overrides.write_text(TRITON_INTERPRETER_RANGE + "\n")
        pins = tmp / "lowest.txt"
        session.run(
            "uv", "pip", "compile", "-q", "--no-sources", "--resolution", "lowest-direct",
            "--python-version", PYTHON, *find_links(internal), "-c", str(floors),
            "--override", str(overrides), str(member.path / "pyproject.toml"), "--extra", "test",
            "-o", str(pins), external=True,
        )  # fmt: skip
        # the compiled file is the whole environment: install it as resolved (with the override)
        session.install("--no-deps", *fresh_members(), *find_links(internal), "-r", str(pins))
        wheel, _ = release.find_distributions(internal, member)
        session.install("--no-deps", str(wheel))
        no_deps = sorted(
            {r for n, e in needed.items() for r in members()[n].per_extra("no-deps", e)}
        )
        if no_deps:
            session.install("--no-deps", *no_deps)
        session.env["TRITON_INTERPRET"] = "1"
        session.run("pytest", str(member.path / "tests"), *session.posargs)

    session_function.__doc__ = (
        f"{member.name}'s tests with each of its direct dependencies at the lowest version its "
        "ranges allow (uv's lowest-direct resolution, the floors pinned)."
    )
    return session_function


for _member in members().values():
    nox.session(
        name=f"lowest-direct-{_member.name}", python=PYTHON, tags=["lowest-direct"], default=False
    )(lowest_direct_session(_member))


@nox.session(python=PYTHON, tags=["ci"])
def docs(session: nox.Session) -> None:
    """The documentation site into site/, built strictly: any warning or broken link fails."""
    session.install(*nox.project.dependency_groups(nox.project.load_toml("pyproject.toml"), "docs"))
    # the Markdown rewriting first (docs/test_build.py); the workspace's addopts load a plugin
    # of kernels-common, which this venv does not hold
    session.run("pytest", "-q", "-o", "addopts=", str(ROOT / "docs" / "test_build.py"))
    session.run("python", str(ROOT / "docs" / "build.py"), "--strict", *session.posargs)
