"""Build the documentation site: `python docs/build.py [--strict] [--serve]`.

The Markdown sources are generated into `build/docs/` (never committed) from what the repository
already holds, then `mkdocs.yml` is built into `site/`:

* the front page from the root README.md;
* for every workspace member (`[tool.uv.workspace].members`), a section with its README, an API
  reference rendered by mkdocstrings from the docstrings of `src/` (static analysis: nothing is
  imported, so no torch is needed), its CHANGELOG, and, where the package has them, a Reproduce
  page (`reports/<name>/`, written by `./noxw -s reproduce`) and a Benchmarks page
  (`reports/bench/<name>/`, written by `./noxw -s bench`); a page whose reports this build does
  not have says so and gives the command that makes them;
* a Reproduce report page gathering every package's claims.

Links inside the READMEs and changelogs are rewritten: to another package's pages where they
point at a package, to the repository on GitHub where they point at a file that is not a page
(`[tool.monorepo] repository` in the root pyproject.toml; `documentation` is the site's URL). A
link to a file git does not track is reported as broken. With `--strict` every warning (a broken
link or anchor, an unresolved cross-reference, a docstring griffe cannot parse) fails the build.

The class `DocstringRoles` below is a griffe extension (named in mkdocs.yml): it turns the reST
roles of the docstrings (:func:`name`, :class:`~pkg.mod.Name`) into links to the API reference
where the target is rendered there, and into code otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import posixpath
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

try:
    import griffe
    from mkdocs.commands.build import build as mkdocs_build
    from mkdocs.commands.serve import serve as mkdocs_serve
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort
except ImportError as _error:  # pragma: no cover - a plain interpreter without the docs group
    raise SystemExit(
        f"docs/build.py needs the `docs` dependency group ({_error.name} is missing): "
        "run `./noxw -s docs`, or install the group's pins from pyproject.toml"
    ) from _error

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "mkdocs.yml"
SOURCES = ROOT / "build" / "docs"  # docs_dir in mkdocs.yml
REPORTS = ROOT / "reports"
BRANCH = "main"  # the branch GitHub links point at

log = logging.getLogger("docs.build")


# --- the workspace -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One workspace member, as the docs see it."""

    name: str
    path: Path
    reproduce: bool
    benchmarks: tuple[Path, ...]

    @property
    def import_name(self) -> str:
        return self.name.replace("-", "_")

    @property
    def folder(self) -> str:
        """The member's folder, relative to the repository root."""
        return self.path.relative_to(ROOT).as_posix()


@dataclass(frozen=True)
class Project:
    repository: str
    documentation: str
    members: tuple[Member, ...]


def read_project(root: Path = ROOT) -> Project:
    """The repository and docs URLs and the workspace members, from the pyproject.toml files."""
    data = tomllib.loads((root / "pyproject.toml").read_text())
    table = data.get("tool", {}).get("monorepo", {})
    missing = [key for key in ("repository", "documentation") if not table.get(key)]
    if missing:
        raise SystemExit(f"pyproject.toml: [tool.monorepo] needs {' and '.join(missing)}")
    members = []
    for pattern in data["tool"]["uv"]["workspace"]["members"]:
        for pyproject in sorted(root.glob(f"{pattern}/pyproject.toml")):
            member = tomllib.loads(pyproject.read_text())
            folder = pyproject.parent
            members.append(
                Member(
                    name=member["project"]["name"],
                    path=folder,
                    reproduce=bool(member.get("tool", {}).get("monorepo", {}).get("reproduce")),
                    benchmarks=tuple(sorted((folder / "benchmarks").glob("bench_*.py"))),
                )
            )
    return Project(table["repository"].rstrip("/"), table["documentation"], tuple(members))


def tracked_files(root: Path = ROOT) -> set[str] | None:
    """Paths git tracks (and files staged for it), or None outside a usable git work tree."""
    try:
        result = subprocess.run(
            ["git", "ls-files", "-z", "--cached"],
            cwd=root,
            capture_output=True,
            check=False,
        )
    except OSError:
        return None
    if result.returncode != 0:
        return None
    return {path for path in result.stdout.decode().split("\0") if path}


# --- Markdown helpers ----------------------------------------------------------------------------

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})")
LIST_ITEM = re.compile(r"^\s{0,3}([-*+]|\d+[.)])\s+\S")
# what may start a list right after a paragraph line on GitHub: a bullet, or an ordered list
# from 1 ("2025. It ..." wrapped onto a new line stays part of the paragraph)
INTERRUPTING_ITEM = re.compile(r"^\s{0,3}([-*+]|1[.)])\s+\S")
HEADING = re.compile(r"^(#{1,6})(\s+.*)$")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
LINK = re.compile(
    r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target><[^>]*>|[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)"
)
# a link reference definition; `[^1]: ...` is a footnote, not a link
REFERENCE = re.compile(r"^(?P<lead>\s{0,3}\[(?!\^)[^\]]+\]:\s*)(?P<target>\S+)(?P<rest>.*)$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def blocks(text: str) -> Iterator[tuple[bool, str]]:
    """The lines of `text`, each with whether it lies inside a fenced code block."""
    fence: str | None = None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(2)
            yield True, line
        elif fence is not None:
            if (
                match
                and match.group(2).startswith(fence[0] * len(fence))
                and not line.strip("`~ \t")
            ):
                fence = None
            yield True, line
        else:
            yield False, line


def outside_code(line: str, transform: Callable[[str], str]) -> str:
    """Apply `transform` to the parts of one line that are not inline code."""
    parts, last = [], 0
    for match in CODE_SPAN.finditer(line):
        parts += [transform(line[last : match.start()]), match.group(0)]
        last = match.end()
    parts.append(transform(line[last:]))
    return "".join(parts)


def github_compatible(text: str) -> str:
    """Blank lines where GitHub's Markdown needs none but Python-Markdown does.

    A list that starts right after a paragraph line is a list on GitHub and plain text in
    Python-Markdown; a blank line before it makes both agree.
    """
    out: list[str] = []
    previous_code, previous = False, ""
    for code, line in blocks(text):
        if (
            not code
            and not previous_code
            and INTERRUPTING_ITEM.match(line)
            and previous.strip()
            and not LIST_ITEM.match(previous)
            and not previous.startswith((" ", "\t"))
            and not HEADING.match(previous)
        ):
            out.append("")
        out.append(line)
        previous_code, previous = code, line
    return "\n".join(out) + "\n"


def shift_headings(text: str, top: int) -> str:
    """Shift every heading so that the highest one is at level `top`."""
    levels = [
        len(match.group(1))
        for code, line in blocks(text)
        if not code and (match := HEADING.match(line))
    ]
    if not levels:
        return text
    delta = top - min(levels)
    out = []
    for code, line in blocks(text):
        match = None if code else HEADING.match(line)
        if match:
            level = min(6, max(1, len(match.group(1)) + delta))
            line = "#" * level + match.group(2)
        out.append(line)
    return "\n".join(out) + "\n"


def drop_title(text: str) -> tuple[str, str]:
    """The first level-1 heading's text and the Markdown without it."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("# "):
            return line[2:].strip(), "\n".join(lines[:index] + lines[index + 1 :]).lstrip() + "\n"
        if line.strip():
            break
    return "", text


# --- the site ------------------------------------------------------------------------------------


@dataclass
class Site:
    """The generated sources: pages and copied files, keyed by their path under `SOURCES`."""

    project: Project
    tracked: set[str] | None
    pages: dict[str, str] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)  # repository path -> page
    nav: list = field(default_factory=list)

    def link(self, target: str, source: Path, page: str, *, image: bool) -> str:
        """Where a link written in `source` (a file on disk) goes from `page` in the site."""
        if target.startswith("<") and target.endswith(">"):
            target = target[1:-1]
        if not target or target.startswith("#") or SCHEME.match(target):
            return target
        path, hash_, fragment = target.partition("#")
        path = path.split("?", 1)[0]
        base = ROOT if path.startswith("/") else source.parent
        resolved = Path(os.path.normpath(base / path.lstrip("/")))
        suffix = f"{hash_}{fragment}"
        if resolved.is_relative_to(REPORTS):  # a figure or table of this build's reports
            if not resolved.is_file():
                log.warning("%s: broken link %r", display(source), target)
                return target
            copied = f"reports/{resolved.relative_to(REPORTS).as_posix()}"
            self.files[copied] = resolved
            return self.relative(page, copied) + suffix
        try:
            relative = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            log.warning("%s: link %r leaves the repository", display(source), target)
            return target
        relative = "" if relative == "." else relative
        if relative in self.targets:
            return self.relative(page, self.targets[relative]) + suffix
        if not resolved.exists():
            log.warning("%s: broken link %r (no %s)", display(source), target, relative)
            return target
        if image:  # shown in the page: copied into the site
            copied = f"repository/{relative}"
            self.files[copied] = resolved
            return self.relative(page, copied) + suffix
        if self.tracked is not None and not self.is_tracked(relative):
            log.warning("%s: link %r to a file git does not track", display(source), target)
        return self.github(relative) + suffix

    def github(self, relative: str) -> str:
        """The repository file or folder `relative` (to the root) on GitHub."""
        kind = "tree" if (ROOT / relative).is_dir() else "blob"
        return f"{self.project.repository}/{kind}/{BRANCH}/{relative}"

    def is_tracked(self, relative: str) -> bool:
        assert self.tracked is not None
        return (
            relative == ""
            or relative in self.tracked
            or any(path.startswith(relative + "/") for path in self.tracked)
        )

    @staticmethod
    def relative(page: str, target: str) -> str:
        return posixpath.relpath(target, posixpath.dirname(page) or ".")

    def rewrite_links(self, text: str, source: Path, page: str) -> str:
        """Every Markdown link and image of `text` (read from `source`) as seen from `page`."""

        def inline(part: str) -> str:
            def replace(match: re.Match[str]) -> str:
                image = bool(match.group("bang"))
                target = self.link(match.group("target"), source, page, image=image)
                title = match.group("title") or ""
                return f"{match.group('bang')}[{match.group('text')}]({target}{title})"

            return LINK.sub(replace, part)

        out = []
        for code, line in blocks(text):
            if not code:
                reference = REFERENCE.match(line)
                if reference:
                    target = self.link(reference.group("target"), source, page, image=False)
                    line = f"{reference.group('lead')}{target}{reference.group('rest')}"
                else:
                    line = outside_code(line, inline)
            out.append(line)
        return "\n".join(out) + "\n"

    def add_markdown(self, page: str, source: Path, *, title: str | None = None) -> None:
        """Add a page made from a Markdown file of the repository (its H1 replaced by `title`)."""
        text = source.read_text()
        if title is not None:
            _, text = drop_title(text)
            text = f"# {title}\n\n{text}"
        self.pages[page] = self.rewrite_links(github_compatible(text), source, page)

    def write(self, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        for name, text in self.pages.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        for name, source in self.files.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, path)
        for asset in (ROOT / "docs" / "assets").glob("*"):
            (folder / "assets").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(asset, folder / "assets" / asset.name)


def display(path: Path) -> str:
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


# --- reports -------------------------------------------------------------------------------------


def when(created: str | None) -> str:
    """An ISO timestamp of a results.json as `2026-12-01 17:14 UTC`."""
    try:
        moment = dt.datetime.fromisoformat(created or "")
    except ValueError:
        return created or "an unknown date"
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M") + (" UTC" if moment.tzinfo else "")


def reproduce_command(member: Member) -> str:
    return f"python -m {member.import_name} reproduce --quick --out reports/{member.name}"


def failed_reproduce() -> set[str]:
    """Packages reports/index.md lists as failed (the reproduce session's `--failed`)."""
    index = REPORTS / "index.md"
    if not index.exists():
        return set()
    for line in index.read_text().splitlines():
        if line.startswith("Failed to run:"):
            return set(re.findall(r"`([^`]+)`", line))
    return set()


def load_results(member: Member) -> dict | None:
    path = REPORTS / member.name / "results.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        log.warning("%s: not readable JSON (%s)", display(path), error)
        return None


def claims_table(results: dict) -> str:
    """The claims of a results.json as a table (for a run that wrote no summary.md)."""

    def number(value: object, unit: str = "") -> str:
        if value is None:
            return "-"
        if isinstance(value, str):  # "nan", "inf": a diverged run or a claim it could not measure
            return f"no value ({value})"
        return f"{value:.4g} {unit}".strip()

    lines = [
        f"## {results['package']}: {results['title']}",
        "",
        results.get("summary", "").strip(),
        "",
        "| claim | paper says | paper's value | measured | expected | agrees |",
        "|---|---|---:|---:|---|:---:|",
    ]
    for claim in results["claims"]:
        if claim["direction"] == "at_least":
            expected = f">= {claim['threshold']:g}"
        elif claim["direction"] == "at_most":
            expected = f"<= {claim['threshold']:g}"
        else:
            expected = f"{claim['threshold']:g} ± {claim['tolerance']:g}"
        lines.append(
            f"| {claim['name']} | {claim['paper']} | {number(claim.get('paper_value'))} "
            f"| {number(claim['measured'], claim['unit'])} | {expected} "
            f"| {'yes' if claim.get('passed') else '**no**'} |"
        )
    lines.append("")
    lines += [f"![{Path(figure).stem}]({figure})\n" for figure in results.get("figures", [])]
    return "\n".join(lines)


def reproduce_page(site: Site, member: Member, failed: set[str]) -> str:
    page = f"{member.name}/reproduce.md"
    folder = REPORTS / member.name
    results = load_results(member)
    lines = [f"# {member.name}: reproduce", ""]
    if results is None:
        if member.name in failed:
            lines += [
                f"The reproduce run of this build **failed** for {member.name}: it wrote no "
                "results. Run it yourself to see why:",
            ]
        else:
            lines += [
                f"This build did not run {member.name}'s `reproduce --quick`, so there are no "
                "results to show here. To make them, run every package's with",
            ]
        lines += [
            "",
            "```bash",
            "./noxw -s reproduce",
            "```",
            "",
            "or this package's alone (with the package installed):",
            "",
            "```bash",
            reproduce_command(member),
            "```",
            "",
            "then build the docs again. The package's README quotes the results of a recorded "
            "run: see [its overview](index.md).",
        ]
        site.pages[page] = "\n".join(lines) + "\n"
        return page
    mode = "quick" if results.get("quick", True) else "full"
    elapsed = results.get("elapsed_s")
    took = "" if elapsed is None else f", {elapsed:.0f} s"
    claims = results.get("claims", [])
    agreed = sum(bool(claim.get("passed")) for claim in claims)
    lines += [
        f"What `{reproduce_command(member)}` measured in this build's run ({mode} run, "
        f"{when(results.get('created'))}{took}): {agreed} of {len(claims)} claims of the paper "
        "agree.",
        "",
    ]
    if member.name in failed:
        lines += [
            "!!! warning",
            "    This build's reproduce run failed for this package; the results below are "
            "those an earlier run left.",
            "",
        ]
    summary = folder / "summary.md"
    body = summary.read_text() if summary.exists() else claims_table(results)
    unshown = [f for f in results.get("figures", []) if f"({f})" not in body]
    body += "".join(f"\n![{Path(figure).stem}]({figure})\n" for figure in unshown)
    body = site.rewrite_links(shift_headings(github_compatible(body), 2), summary, page)
    settings = results.get("settings")
    if settings:
        body += (
            "\n## Settings\n\n```json\n"
            + json.dumps(settings, indent=2, sort_keys=True)
            + "\n```\n"
        )
    site.pages[page] = "\n".join(lines) + "\n" + body
    return page


def main_benchmark(member: Member) -> Path:
    """`benchmarks/bench_<import name>.py` where there is one, else the first script."""
    named = member.path / "benchmarks" / f"bench_{member.import_name}.py"
    return named if named in member.benchmarks else member.benchmarks[0]


def benchmarks_page(site: Site, member: Member) -> str:
    page = f"{member.name}/benchmarks.md"
    folder = REPORTS / "bench" / member.name
    tables = sorted(folder.glob("*.md")) if folder.is_dir() else []
    scripts = ", ".join(
        f"[`{script.name}`]({site.github(display(script))})" for script in member.benchmarks
    )
    lines = [f"# {member.name}: benchmarks", ""]
    if not tables:
        lines += [
            f"This build did not run {member.name}'s benchmarks ({scripts}), so there are no "
            "tables to show here. To make them, run every package's benchmarks on the CPU with",
            "",
            "```bash",
            "./noxw -s bench",
            "```",
            "",
            "or one script (with the package's `bench` extra installed):",
            "",
            "```bash",
            f"python {display(main_benchmark(member))} --device cpu "
            f"--out reports/bench/{member.name}",
            "```",
            "",
            "then build the docs again. Numbers measured on a recorded machine, GPU runs "
            "included, are in [the package's overview](index.md).",
        ]
        site.pages[page] = "\n".join(lines) + "\n"
        return page
    lines += [
        f"The tables the benchmark scripts ({scripts}) wrote into `reports/bench/{member.name}/` "
        "for this build (`./noxw -s bench`), on the machine that built the docs: each table names "
        "its hardware. Absolute times on shared machines are noisy: compare the ratios measured "
        "in one run.",
        "",
    ]
    for table in tables:
        text = site.rewrite_links(
            shift_headings(github_compatible(table.read_text()), 2), table, page
        )
        lines += [text.rstrip(), ""]
    referenced = "\n".join(lines)
    for image in sorted(p for p in folder.iterdir() if p.suffix in {".png", ".svg"}):
        if image.name not in referenced:
            lines += [site.rewrite_links(f"![{image.stem}]({image.name})", image, page), ""]
    site.pages[page] = "\n".join(lines) + "\n"
    return page


def report_page(site: Site, runners: list[Member], failed: set[str]) -> str:
    page = "reproduce.md"
    index = REPORTS / "index.md"
    lines = [
        "# Reproduce report",
        "",
        "Every package with a `reproduce` command runs it at small scale on real data, on a CPU, "
        "and checks the paper's headline claims against what it measured; `./noxw -s reproduce` "
        "runs them all and writes `reports/`.",
        "",
    ]
    if not index.exists() and not any(load_results(m) for m in runners):
        lines += [
            "This build did not run them, so there are no results to show here. To make them, run",
            "",
            "```bash",
            "./noxw -s reproduce",
            "```",
            "",
            "then build the docs again.",
        ]
        site.pages[page] = "\n".join(lines) + "\n"
        return page
    if index.exists():
        preamble = []
        for line in index.read_text().splitlines()[1:]:
            if line.startswith("## "):
                break
            preamble.append(line)
        for line in preamble:  # the counts and what failed, one paragraph each
            if line.strip():
                lines += [line, ""]
    lines += [
        "| package | experiment | claims agreeing | run |",
        "|---|---|:---:|---|",
    ]
    for member in runners:
        results = load_results(member)
        link = f"[{member.name}]({member.name}/reproduce.md)"
        if results is None:
            state = "failed" if member.name in failed else "not run in this build"
            lines.append(f"| {link} | - | - | {state} |")
            continue
        claims = results.get("claims", [])
        agreed = sum(bool(claim.get("passed")) for claim in claims)
        created = when(results.get("created"))
        lines.append(
            f"| {link} | {results.get('title', '')} | {agreed} of {len(claims)} | {created} |"
        )
    site.pages[page] = "\n".join(lines) + "\n"
    return page


# --- pages ---------------------------------------------------------------------------------------


def api_page(site: Site, member: Member) -> str:
    page = f"{member.name}/api.md"
    package = member.import_name
    lines = [
        f"# {member.name}: API reference",
        "",
        f"The public API of `{package}`: what `import {package}` exports (its `__all__`), from "
        f"the docstrings of [`{member.folder}/src/{package}`]"
        f"({site.github(f'{member.folder}/src/{package}')}).",
        "",
    ]
    loaded = griffe.load(package, search_paths=[str(member.path / "src")], allow_inspection=False)
    for section in api_sections(loaded):
        lines.append(f"::: {section.path}")
        if section.heading:
            lines += [
                "    options:",
                "      show_root_heading: true",
                f"      show_root_full_path: {str(section.full_path).lower()}",
            ]
            if section.members is not None:
                listed = f"[{', '.join(section.members)}]" if section.members else "false"
                lines.append(f"      members: {listed}")
        lines.append("")
    site.pages[page] = "\n".join(lines)
    return page


def generate(project: Project) -> Site:
    site = Site(project, tracked_files())
    if site.tracked is None:
        log.info("not a git work tree: links to files git does not track are not detected")
    site.targets[""] = "index.md"
    site.targets["README.md"] = "index.md"
    for member in project.members:
        site.targets[member.folder] = f"{member.name}/index.md"
        site.targets[f"{member.folder}/README.md"] = f"{member.name}/index.md"
        site.targets[f"{member.folder}/CHANGELOG.md"] = f"{member.name}/changelog.md"

    site.add_markdown("index.md", ROOT / "README.md")
    failed = failed_reproduce()
    packages = []
    for member in project.members:
        overview = f"{member.name}/index.md"
        site.add_markdown(overview, member.path / "README.md")
        section: list = [overview, {"API reference": api_page(site, member)}]
        if member.reproduce:
            section.append({"Reproduce": reproduce_page(site, member, failed)})
        if member.benchmarks:
            section.append({"Benchmarks": benchmarks_page(site, member)})
        changelog = f"{member.name}/changelog.md"
        site.add_markdown(
            changelog, member.path / "CHANGELOG.md", title=f"{member.name}: changelog"
        )
        section.append({"Changelog": changelog})
        packages.append({member.name: section})
    runners = [member for member in project.members if member.reproduce]
    report = report_page(site, runners, failed)
    for single in ("index.md", report):  # a tab of one page: no navigation sidebar
        site.pages[single] = "---\nhide:\n  - navigation\n---\n\n" + site.pages[single]
    site.nav = [{"Home": "index.md"}, {"Packages": packages}, {"Reproduce report": report}]
    return site


# --- docstrings (griffe extension) ---------------------------------------------------------------

ROLE = re.compile(
    r":(?:py:)?(?P<role>func|class|meth|mod|data|attr|obj|exc|const):`(?P<target>[^`]+)`"
)
EXAMPLE_HEADER = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


# Modules whose public members a package author imports by their path, beside the package's
# `__all__` (CONTRIBUTING.md: the command-line contract, reports, the test helpers).
API_MODULES = {"kernels_common": ("cli", "report", "plotting", "testing", "swiglu")}


@dataclass(frozen=True)
class ApiSection:
    """One `::: path` block of an API page."""

    path: str
    heading: bool = False  # False: the package itself, whose page title is the heading
    full_path: bool = True
    members: tuple[str, ...] | None = None  # None: mkdocstrings' choice (the `__all__`)


def canonical(obj: griffe.Object | griffe.Alias) -> str:
    return obj.target_path if obj.is_alias else obj.path


def api_sections(pkg: griffe.Module) -> list[ApiSection]:
    """What the API page of `pkg` renders: the package, then the sections griffe would miss.

    griffe sees an exported name that is also a submodule's name as the submodule: a module in
    `__all__` gets a section of its own (with the members the package does not export already),
    and an object imported from the submodule of its name (`from pkg.train import train`) is
    rendered from that submodule.
    """
    sections = [ApiSection(pkg.path)]
    exported = {str(name) for name in pkg.exports or ()} & set(pkg.members)
    at_root = {canonical(pkg.members[name]) for name in exported}
    modules = []
    for name in sorted(exported, key=[str(n) for n in pkg.exports or ()].index):
        member = pkg.members[name]
        if member.is_alias or not member.is_module:
            continue
        if pkg.imports.get(name) == f"{member.path}.{name}" and name in member.members:
            sections.append(ApiSection(f"{member.path}.{name}", heading=True, full_path=False))
        else:
            modules.append(member)
    modules += [pkg.members[name] for name in API_MODULES.get(pkg.path, ())]
    for module in modules:
        names = (
            [str(name) for name in module.exports]
            if module.exports is not None
            else [name for name, obj in module.members.items() if not obj.is_alias]
        )
        members = []
        for name in names:
            obj = module.members.get(name)
            if obj is None or name.startswith("_") or canonical(obj) in at_root:
                continue
            try:
                if obj.is_module or obj.docstring is None:
                    continue
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            members.append(name)
        sections.append(ApiSection(module.path, heading=True, members=tuple(members)))
    return sections


def link_targets(pkg: griffe.Module) -> dict[str, tuple[str, bool]]:
    """Rendered anchors by the paths that lead to them: path -> (anchor, whether it is a module).

    A class's anchor also leads to its members' (`DPController.accumulate`); a module's does not,
    since a module section renders only the members it lists.
    """
    targets: dict[str, tuple[str, bool]] = {}
    for section in api_sections(pkg):
        if not section.heading:  # the package: its exports
            for name in [str(n) for n in pkg.exports or ()]:
                member = pkg.members.get(name)
                if member is None or (not member.is_alias and member.is_module):
                    continue
                anchor = f"{pkg.path}.{name}"
                targets[anchor] = (anchor, False)
                targets.setdefault(canonical(member), (anchor, False))
        elif section.members is None:  # an object rendered from its submodule
            targets[section.path] = (section.path, False)
        else:
            targets[section.path] = (section.path, True)
            module = pkg.get_member(section.path.split(".", 1)[1])
            for name in section.members:
                anchor = f"{section.path}.{name}"
                targets[anchor] = (anchor, False)
                targets.setdefault(canonical(module.members[name]), (anchor, False))
    return targets


class DocstringRoles(griffe.Extension):
    """reST roles in docstrings become API-reference links where the target is rendered there.

    A target is linked when it resolves (in the scope of the documented object) to something the
    API page renders (see `api_sections`), or a documented public member of such a class;
    anything else (private modules, other packages, undocumented members) becomes inline code,
    so no link can break. An `Example:` section becomes `Examples:`, which griffe renders as
    code (doctest blocks) rather than as an admonition of Markdown text.
    """

    def on_package(self, *, pkg: griffe.Module, **kwargs: object) -> None:
        targets = link_targets(pkg)
        for obj in self._walk(pkg):
            if obj.docstring is None:
                continue
            value = EXAMPLE_HEADER.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = ROLE.sub(
                lambda match, obj=obj: self._replace(match, obj, pkg, targets), value
            )

    def _walk(self, obj: griffe.Object) -> Iterator[griffe.Object]:
        yield obj
        for member in obj.members.values():
            if not member.is_alias:
                yield from self._walk(member)

    def _replace(
        self, match: re.Match[str], obj: griffe.Object, pkg: griffe.Module, targets: dict
    ) -> str:
        written = match.group("target").strip()
        short = written.startswith("~")
        written = written.lstrip("~.").removesuffix("()")
        label = written.rsplit(".", 1)[-1] if short else written
        target = self._anchor(written, obj, targets)
        if target is None or not self._documented(pkg, target, module=match["role"] == "mod"):
            return f"`{label}`"
        return f"[`{label}`][{target}]"

    @staticmethod
    def _anchor(written: str, obj: griffe.Object, targets: dict) -> str | None:
        first, _, rest = written.partition(".")
        try:
            full = obj.resolve(first)
        except griffe.NameResolutionError:
            full = first
        parts = (f"{full}.{rest}" if rest else full).split(".")
        for cut in range(len(parts), 0, -1):
            found = targets.get(".".join(parts[:cut]))
            if found is not None:
                anchor, is_module = found
                if is_module and cut < len(parts):
                    return None
                return ".".join([anchor, *parts[cut:]])
        return None

    @staticmethod
    def _documented(pkg: griffe.Module, path: str, *, module: bool) -> bool:
        """Whether `path` exists with a docstring, as a module if `module` (the role said so)."""
        current: griffe.Object | griffe.Alias = pkg
        try:
            for name in path.split(".")[1:]:
                if name.startswith("_") and not name.startswith("__"):
                    return False
                current = current.members[name]
                if current.docstring is None:
                    return False
            return current.is_module == module
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return False


# --- building ------------------------------------------------------------------------------------


class WarningCounter(logging.Handler):
    """Counts warnings from every logger (mkdocs' own strict mode counts only its own)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def configure_logging(verbose: bool) -> WarningCounter:
    logging.captureWarnings(True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)-7s - %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("markdown", "MARKDOWN", "watchdog", "PIL", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    counter = WarningCounter()
    root.addHandler(counter)
    return counter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="fail on any warning")
    parser.add_argument("--serve", action="store_true", help="preview on http://127.0.0.1:8000")
    parser.add_argument("--site-dir", type=Path, default=ROOT / "site", help="default: site/")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    counter = configure_logging(args.verbose)
    start = time.monotonic()
    os.chdir(ROOT)  # mkdocs.yml names paths (src folders, the griffe extension) from the root

    project = read_project()
    site = generate(project)
    site.write(SOURCES)
    log.info("generated %d pages and %d files into %s", len(site.pages), len(site.files), SOURCES)
    if counter.count and args.strict:
        log.error("%d warning(s) while generating the sources; strict build aborted", counter.count)
        return 1
    options = {
        "site_url": project.documentation,
        "repo_url": project.repository,
        "repo_name": project.repository.removeprefix("https://github.com/"),
        "nav": site.nav,
        "strict": args.strict,
    }
    if args.serve:
        mkdocs_serve(str(CONFIG), **options)
        return 0
    try:
        mkdocs_build(load_config(str(CONFIG), site_dir=str(args.site_dir.resolve()), **options))
    except Abort as error:
        log.error("%s", error)
        return 1
    if counter.count and args.strict:
        log.error("%d warning(s); strict build failed", counter.count)
        return 1
    log.info("site in %s (%.1f s)", display(args.site_dir.resolve()), time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
