"""Markdown reports of ``reproduce`` runs: one section per package, gathered in ``index.md``.

The ``reproduce`` nox session runs every package's ``reproduce --quick --out reports/<package>``
and then :func:`write_index` (``kernels-common report reports``), which reads each
``reports/<package>/results.json`` and writes ``reports/index.md`` with the claims table and the
plots of every package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kernels_common.cli import atomic_file
from kernels_common.results import RESULTS_FILE, ReproduceResults

INDEX_FILE = "index.md"


def _format(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if math.isnan(value):  # a diverged run, or a claim the run could not measure
        return f"no value (NaN {unit})".replace(" )", ")")
    text = f"{value:.4g}"
    return f"{text} {unit}".strip()


def render_results(results: ReproduceResults, figure_prefix: str = "") -> str:
    """Markdown for one package's results; figure links are prefixed with ``figure_prefix``."""
    mode = "quick" if results.quick else "full"
    lines = [f"## {results.package}: {results.title}", ""]
    if results.summary:
        lines += [results.summary.strip(), ""]
    lines += [
        "| claim | paper says | paper's value | measured | expected | agrees |",
        "|---|---|---:|---:|---|:---:|",
    ]
    for claim in results.claims:
        lines.append(
            f"| {claim.name} | {claim.paper} | {_format(claim.paper_value)} "
            f"| {_format(claim.measured, claim.unit)} | {claim.expectation} "
            f"| {'yes' if claim.passed else '**no**'} |"
        )
    elapsed = "" if results.elapsed_s is None else f", {results.elapsed_s:.0f} s"
    lines += ["", f"_{mode} run, {results.created}{elapsed}_", ""]
    for figure in results.figures:
        lines += [f"![{Path(figure).stem}]({figure_prefix}{figure})", ""]
    return "\n".join(lines)


SUMMARY_FILE = "summary.md"


def write_summary(results: ReproduceResults, directory: str | Path, extra: str = "") -> Path:
    """Write ``<directory>/summary.md``: :func:`render_results` of one run, then ``extra``.

    ``extra`` is Markdown appended as is (a package's own tables: curves, per-method rows). The
    figure links are relative to ``directory``, where ``results.save`` put the plots.
    """
    path = Path(directory) / SUMMARY_FILE
    text = render_results(results)
    if extra.strip():
        text = text.rstrip() + "\n\n" + extra.strip()
    with atomic_file(path) as temporary:
        temporary.write_text(text.rstrip() + "\n")
    return path


@dataclass(frozen=True)
class IndexSummary:
    """What :func:`write_index` wrote and what it could not report."""

    path: Path
    reported: tuple[str, ...]
    unreadable: tuple[str, ...]
    missing: tuple[str, ...]

    @property
    def complete(self) -> bool:
        """Every expected package reported readable results."""
        return not self.unreadable and not self.missing


def write_index(
    reports_dir: str | Path, failures: Sequence[str] = (), *, expected: Sequence[str] = ()
) -> IndexSummary:
    """Gather ``<reports_dir>/*/results.json`` into ``<reports_dir>/index.md``.

    Args:
        reports_dir: folder holding one sub-folder per package.
        failures: packages whose ``reproduce`` command failed (listed in the report).
        expected: packages that should have results; one without a ``results.json`` (and not in
            ``failures``) is reported as missing.

    Returns:
        An :class:`IndexSummary`: the path of ``index.md`` and the packages reported, unreadable
        (a ``results.json`` that does not load) and missing.
    """
    reports_dir = Path(reports_dir)
    reports_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, ReproduceResults] = {}
    malformed: dict[str, str] = {}
    for path in sorted(reports_dir.glob(f"*/{RESULTS_FILE}")):
        try:
            found[path.parent.name] = ReproduceResults.load(path)
        except ValueError as error:  # one bad file must not hide the other packages' results
            malformed[path.parent.name] = str(error)
    sections = [render_results(results, f"{name}/") for name, results in found.items()]
    missing = [n for n in expected if n not in found and n not in failures and n not in malformed]

    lines = ["# Reproduce report", ""]
    if not found and not failures and not missing and not malformed:
        lines += ["No package provides a `reproduce` command yet.", ""]
    else:
        all_claims = [c for results in found.values() for c in results.claims]
        agreed = sum(c.passed for c in all_claims)
        lines += [
            f"{len(found)} package(s) reported; {agreed} of {len(all_claims)} claims agree.",
            "",
        ]
    if failures:
        lines += ["Failed to run: " + ", ".join(f"`{name}`" for name in failures), ""]
    if missing:
        lines += ["Ran but wrote no results: " + ", ".join(f"`{name}`" for name in missing), ""]
    if malformed:
        lines += [
            "Unreadable results: " + "; ".join(f"`{n}` ({e})" for n, e in malformed.items()),
            "",
        ]
    index = reports_dir / INDEX_FILE
    with atomic_file(index) as temporary:
        temporary.write_text("\n".join(lines + sections).rstrip() + "\n")
    return IndexSummary(index, tuple(found), tuple(malformed), tuple(missing))
