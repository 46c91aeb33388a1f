"""A workspace member (`Member`, which the noxfile uses too), and what makes it releasable on
its own, checked on its built wheel and sdist.

The noxfile's `release-check`, `release-build` and `release-test` sessions call these functions;
so do the integration tests, on deliberately broken fixtures. Each check returns a list of
problems, one sentence each naming the package and what is wrong, so one run reports them all.

Rules (CONTRIBUTING.md, "Releasing"):

- a release is the tag `<package>-v<version>`; the version must equal the package's version and
  its CHANGELOG.md must have a `## <version> (<date>)` entry (`(unreleased)` until then);
- the wheel's metadata names a license (an SPDX expression and the license file), the project's
  URLs (repository, documentation, changelog, issues), renders its readme as Markdown, ships
  `py.typed` exactly when it says `Typing :: Typed`, and holds no local path;
- a range on another member admits that member's workspace version;
- a package whose shipped files (src/, pyproject.toml) changed since its last tag has a new
  version.

Only the standard library and `packaging`: the noxfile imports this module in nox's own venv.
"""

from __future__ import annotations

import email.parser
import re
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

TYPED = "Typing :: Typed"
SHIPPED = ("src", "pyproject.toml")  # what a wheel is built from: a change here needs a version
_CHANGELOG_ENTRY = re.compile(r"^## +v?(?P<version>\S+)(?: +\((?P<when>[^)]*)\))? *$", re.M)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class Tag:
    """A release tag `<package>-v<version>`, e.g. `tfla-mlstm-v0.2.0`."""

    package: str
    version: Version

    @classmethod
    def parse(cls, text: str) -> Tag:
        """The tag, written exactly as `str()` writes it back (canonical package name, normalized
        version): other spellings would be missed when the next release looks for this one."""
        written = text.removeprefix("refs/tags/")
        name, sep, version = written.rpartition("-v")
        if not sep or not name:
            raise ValueError(f"release tag {text!r} is not of the form <package>-v<version>")
        try:
            tag = cls(canonicalize_name(name), Version(version))
        except InvalidVersion:
            raise ValueError(f"release tag {text!r}: {version!r} is not a version") from None
        if str(tag) != written:
            raise ValueError(f"release tag {text!r} is not written as it should be: {tag}")
        return tag

    def __str__(self) -> str:
        return f"{self.package}-v{self.version}"


@dataclass(frozen=True)
class Member:
    """One workspace member, read from its pyproject.toml: its folder, its `[project]` table and
    its `[tool.monorepo]` table (what its sessions need; CONTRIBUTING.md)."""

    path: Path
    project: dict
    tool: dict

    @property
    def name(self) -> str:
        return self.project["name"]

    @property
    def key(self) -> str:
        """The canonical name (PEP 503), by which members are looked up."""
        return canonicalize_name(self.name)

    @property
    def import_name(self) -> str:
        return self.name.replace("-", "_")

    @property
    def dist_name(self) -> str:
        """The name in its wheel's and sdist's file names (and the sdist's top folder)."""
        return self.key.replace("-", "_")

    @property
    def version(self) -> Version:
        return Version(self.project["version"])

    @property
    def extras(self) -> dict[str, list[str]]:
        return self.project.get("optional-dependencies", {})

    def requirements(self, extras: set[str]) -> list[Requirement]:
        """Its runtime requirements and those of `extras`."""
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


# -- the distributions ---------------------------------------------------------------------------


def _wheel_metadata(wheel: Path) -> tuple[Message, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(metadata) != 1:
            raise ValueError(f"{wheel.name}: expected one .dist-info/METADATA, found {metadata}")
        text = archive.read(metadata[0]).decode()
    return email.parser.Parser().parsestr(text), names


def _sdist_metadata(sdist: Path) -> tuple[Message, list[str]]:
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        info = [n for n in names if re.fullmatch(r"[^/]+/PKG-INFO", n)]
        if len(info) != 1:
            raise ValueError(f"{sdist.name}: expected one top-level PKG-INFO, found {info}")
        member = archive.extractfile(info[0])
        assert member is not None  # a regular file, found by name above
        text = member.read().decode()
    return email.parser.Parser().parsestr(text), names


def find_distributions(dist: Path, project: Member) -> tuple[Path, Path]:
    """The one wheel and one sdist of `project` at its version in `dist`."""
    stem = f"{project.dist_name}-{project.version}"
    wheels = sorted(dist.glob(f"{stem}-*.whl"))
    sdists = sorted(dist.glob(f"{stem}.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise ValueError(
            f"{project.key}: expected one wheel and one sdist named {stem}* in {dist}, found "
            f"{[p.name for p in wheels + sdists]}"
        )
    return wheels[0], sdists[0]


def _local_paths(text: str, workspace: Path | None) -> list[str]:
    found = re.findall(r"file:/+[^\s)\]>\"']+", text)
    if workspace is not None and str(workspace) in text:
        found.append(str(workspace))
    return found


_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]^][^\]]*\]:\s*<?(\S+?)>?(?:\s|$)", re.M)


def relative_links(markdown: str) -> list[str]:
    """Links and images of `markdown` that are relative paths: on PyPI they lead nowhere."""
    without_code = re.sub(r"```.*?```|`[^`\n]*`", "", markdown, flags=re.S)
    targets = _LINK.findall(without_code) + _REFERENCE.findall(without_code)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:|#", t, re.I)]


def expected_urls(project: Member, folder: str, repository: str, documentation: str) -> dict:
    """The `[project.urls]` of a member in folder `folder` of the repository."""
    return {
        "Homepage": f"{documentation}{project.key}/",
        "Documentation": f"{documentation}{project.key}/",
        "Repository": f"{repository}/tree/main/{folder}",
        "Changelog": f"{repository}/blob/main/{folder}/CHANGELOG.md",
        "Issues": f"{repository}/issues",
    }


def check_distribution(
    wheel: Path,
    sdist: Path,
    project: Member,
    *,
    repository: str,
    documentation: str,
    workspace: Path,
) -> list[str]:
    """Problems with the built `wheel` and `sdist` of `project`, a member of the repository at
    `workspace` (empty when releasable)."""
    who = f"{project.key} {project.version}"
    problems: list[str] = []
    meta, files = _wheel_metadata(wheel)
    sdist_meta, sdist_files = _sdist_metadata(sdist)

    for label, value in (("wheel", meta), ("sdist", sdist_meta)):
        name, version = value.get("Name", ""), value.get("Version", "")
        if canonicalize_name(name) != project.key or version != str(project.version):
            problems.append(f"{who}: the {label} says it is {name} {version}")

    if not meta.get("License-Expression"):
        problems.append(f'{who}: no License-Expression (set `license = "<SPDX>"`)')
    license_files = meta.get_all("License-File") or []
    if not license_files:
        problems.append(f"{who}: no license file in the wheel (add LICENSE next to pyproject.toml)")
    for entry in license_files:
        if not any(n.endswith(f".dist-info/licenses/{entry}") for n in files):
            problems.append(f"{who}: License-File {entry} is not in the wheel")

    urls = {}
    for entry in meta.get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        urls[label.strip()] = url.strip()
    folder = project.path.resolve().relative_to(workspace.resolve()).as_posix()
    for label, url in expected_urls(project, folder, repository, documentation).items():
        if label not in urls:
            problems.append(f"{who}: no `{label}` in [project.urls] (it is {url})")
        elif urls[label] != url:
            problems.append(f"{who}: [project.urls] {label} = {urls[label]}, not {url}")

    if meta.get("Description-Content-Type", "").split(";")[0].strip() != "text/markdown":
        problems.append(f'{who}: the readme is not declared as Markdown (readme = "README.md")')
    readme = meta.get_payload() or ""
    if len(readme) < 200:
        problems.append(f"{who}: the long description (README) is missing or nearly empty")
    for link in relative_links(readme):
        problems.append(f"{who}: the README links to {link!r}, a relative path PyPI cannot follow")

    classifiers = meta.get_all("Classifier") or []
    typed_marker = f"{project.import_name}/py.typed"
    if (TYPED in classifiers) != (typed_marker in files):
        problems.append(
            f"{who}: the classifier {TYPED!r} and {typed_marker} in the wheel must go together "
            f"(classifier: {TYPED in classifiers}, file: {typed_marker in files})"
        )

    for spec in meta.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(spec)
        except InvalidRequirement:
            problems.append(f"{who}: Requires-Dist {spec!r} is not a valid requirement")
            continue
        if requirement.url:
            problems.append(
                f"{who}: Requires-Dist {spec!r} points at a URL or path; build with --no-sources"
            )
    for label, value in (("wheel", meta), ("sdist", sdist_meta)):
        text = "\n".join(f"{k}: {v}" for k, v in value.items()) + (value.get_payload() or "")
        for path in _local_paths(text, workspace):
            problems.append(f"{who}: the {label}'s metadata holds a local path {path}")

    root = f"{project.dist_name}-{project.version}"
    for needed in ("pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE", "tests/"):
        path = f"{root}/{needed}"  # a folder ends in "/": any file under it
        if not any(n == path or (path.endswith("/") and n.startswith(path)) for n in sdist_files):
            problems.append(f"{who}: the sdist has no {needed}")
    return problems


# -- the workspace -------------------------------------------------------------------------------


def check_internal_ranges(projects: dict[str, Member]) -> list[str]:
    """Each range one member puts on another admits the other's workspace version."""
    problems = []
    for project in projects.values():
        for requirement in project.requirements(set(project.extras)):
            other = projects.get(canonicalize_name(requirement.name))
            if other is not None and not requirement.specifier.contains(
                other.version, prereleases=True
            ):
                problems.append(
                    f"{project.key}: requires {requirement}, which excludes the workspace's "
                    f"{other.key} {other.version}"
                )
    return problems


def changelog_entry(changelog: Path, version: Version) -> str | None:
    """The parenthesised note of `version`'s heading ('' when bare), or None without one."""
    if not changelog.is_file():
        return None
    for match in _CHANGELOG_ENTRY.finditer(changelog.read_text()):
        try:
            if Version(match["version"]) == version:
                return match["when"] or ""
        except InvalidVersion:
            continue
    return None


def check_changelog(project: Member, *, released: bool) -> list[str]:
    """The package's CHANGELOG.md has an entry for its version; dated when `released`."""
    who = f"{project.key} {project.version}"
    when = changelog_entry(project.path / "CHANGELOG.md", project.version)
    if when is None:
        return [f"{who}: CHANGELOG.md has no `## {project.version}` entry"]
    if released and not _DATE.fullmatch(when):
        return [
            f"{who}: the CHANGELOG.md entry is {f'`({when})`' if when else 'undated'}; a release "
            f"dates it, `## {project.version} (YYYY-MM-DD)`"
        ]
    return []


def check_tag(tag: Tag, projects: dict[str, Member]) -> list[str]:
    """A release tag names a member at its version (its changelog: `check_changelog`)."""
    project = projects.get(tag.package)
    if project is None:
        return [f"release tag {tag}: no workspace member is called {tag.package}"]
    if project.version != tag.version:
        return [f"release tag {tag}: {project.key}'s version is {project.version}"]
    return []


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout


def is_repository_root(root: Path) -> bool:
    """Whether `root` is the top of a git work tree (not a folder inside another repository)."""
    top = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
        check=False,
    )
    return top.returncode == 0 and Path(top.stdout.strip()).resolve() == root.resolve()


def last_release(root: Path, project: Member) -> tuple[Version, str] | None:
    """The version and name of the newest `<package>-v*` tag of the repository at `root` (None
    where `root` is not a repository's top, e.g. an unpacked sdist: nothing to compare with)."""
    if not is_repository_root(root):
        return None
    tags = []
    for line in _git(root, "tag", "--list", f"{project.key}-v*").split():
        try:
            tag = Tag.parse(line)
        except ValueError:
            continue
        if tag.package == project.key:
            tags.append((tag.version, line))
    return max(tags) if tags else None


def check_version_bumped(root: Path, project: Member) -> list[str]:
    """After a release, changing what the wheel is built from needs a higher version."""
    last = last_release(root, project)
    if last is None:
        return []  # never released: any version is the first
    released, tag = last
    who = f"{project.key} {project.version}"
    if project.version < released:
        return [f"{who}: lower than the last release {tag}"]
    if project.version > released:
        return []
    folder = project.path.resolve().relative_to(root.resolve())
    shipped = [str(folder / part) for part in SHIPPED]
    changed = _git(root, "diff", "--name-only", tag, "--", *shipped).split()
    changed += _git(root, "ls-files", "--others", "--exclude-standard", "--", *shipped).split()
    if changed:
        return [
            f"{who}: {len(changed)} shipped file(s) changed since {tag} ({', '.join(changed[:3])}"
            f"{', ...' if len(changed) > 3 else ''}) but the version was not bumped"
        ]
    return []


def lower_bounds(requirements: list[Requirement], skip: set[str] = frozenset()) -> list[str]:
    """`name==floor` for each requirement with a lower bound (`>=`, `~=`, `==`) whose marker
    applies here, except the names in `skip`: a package's direct dependencies at their floors."""
    pins: dict[str, Version] = {}
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        if name in skip or (requirement.marker is not None and not requirement.marker.evaluate()):
            continue
        floors = [
            Version(spec.version)
            for spec in requirement.specifier
            if spec.operator in (">=", "~=", "==") and "*" not in spec.version
        ]
        if floors:
            pins[name] = max([*floors, *([pins[name]] if name in pins else [])])
    return [f"{name}=={version}" for name, version in sorted(pins.items())]
