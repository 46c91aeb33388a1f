"""Every task a person or CI runs. Sessions are discovered from the uv workspace members.

    ./noxw -l                       # list the sessions
    ./noxw -t ci                    # what CI runs: every package's tests, integration, lint
    ./noxw -s tests-kernels-common  # one package, in a venv holding only it and its dependencies
    ./noxw -s reproduce             # every package's `reproduce --quick` -> reports/index.md
    ./noxw -s bench                 # every package's benchmarks/bench_*.py -> reports/bench/
    ./noxw -s gpu                   # on a CUDA machine: gpu tests (--require-gpu) + GPU benchmarks
    ./noxw -s build                 # wheel + sdist of every member, each installed in a clean venv

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
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import nox
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent
PYTHON = "3.11"
TORCH_VERSION = "2.13.0"
TRITON_RANGE = "triton>=3.6,<3.9"
REPORTS = ROOT / "reports"

nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")


@dataclass(frozen=True)
class Member:
    """One workspace member, read from its pyproject.toml."""

    path: Path
    project: dict
    tool: dict

    @property
    def name(self) -> str:
        return self.project["name"]

    @property
    def import_name(self) -> str:
        return self.name.replace("-", "_")

    @property
    def extras(self) -> dict[str, list[str]]:
        return self.project.get("optional-dependencies", {})

    def requirements(self, extras: set[str]) -> list[Requirement]:
        unknown = extras - set(self.extras)
        if unknown:
            raise ValueError(
                f"{self.name} has no extra(s) {sorted(unknown)}; it has {sorted(self.extras)}"
            )
        specs = list(self.project.get("dependencies", []))
        for extra in sorted(extras):
            specs += self.extras[extra]
        return [Requirement(spec) for spec in specs]

    def per_extra(self, key: str, extras: set[str]) -> set[str]:
        """`[tool.monorepo].<key>` entries that apply when installed with `extras`."""
        value = self.tool.get(key, [])
        if isinstance(value, list):
            return set(value)
        unknown = set(value) - set(self.extras)
        if unknown:
            raise ValueError(f"{self.name}: [tool.monorepo.{key}] names unknown extras {unknown}")
        return {entry for extra in extras & set(value) for entry in value[extra]}


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


def ensure_apt(session: nox.Session, packages: set[str]) -> None:
    """Install the Debian packages a member's data needs (apt-get update once per .nox folder)."""
    missing = sorted(
        p
        for p in packages
        if subprocess.run(["dpkg", "-s", p], capture_output=True, check=False).returncode != 0
    )
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        session.error(
            f"needs Debian packages {missing}: run `sudo apt-get install {' '.join(missing)}`"
        )
    stamp = ROOT / ".nox" / ".apt-updated"
    if not stamp.exists():
        session.run("apt-get", "update", "-qq", external=True)
        stamp.parent.mkdir(exist_ok=True)
        stamp.touch()
    session.run(
        "apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, external=True
    )


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


@nox.session(python=PYTHON, default=False)
def build(session: nox.Session) -> None:
    """Build every member's wheel and sdist, then install each wheel alone in a clean venv."""
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for member in members().values():
        session.run("uv", "build", "--package", member.name, "--out-dir", str(dist), external=True)
    constraints = prepare_env(session)
    for member in members().values():
        pattern = re.escape(member.import_name) + r"-[^-]+-py3-none-any\.whl"
        wheels = [w for w in dist.iterdir() if re.fullmatch(pattern, w.name)]
        if len(wheels) != 1 or not list(dist.glob(f"{member.import_name}-*.tar.gz")):
            session.error(f"expected one wheel and one sdist for {member.name} in {dist}")
        venv = Path(session.create_tmp()) / f"venv-{member.name}"
        session.run("uv", "venv", "-q", "-p", sys.executable, str(venv), external=True)
        python = str(venv / "bin" / "python")
        # dist/ for the other members' wheels; the local torch folder, if any, for torch
        links = [str(dist), *(local_wheel_folder() or "").split()]
        find_links = [arg for link in links for arg in ("--find-links", link)]
        install_wheel = ["uv", "pip", "install", "-q", "-p", python, "-c", str(constraints)]
        session.run(*install_wheel, *find_links, str(wheels[0]), external=True)
        session.run(
            python,
            "-c",
            f"import {member.import_name} as m; print(m.__name__, m.__version__)",
            external=True,
        )
