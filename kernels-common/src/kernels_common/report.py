"""Markdown reports of ``reproduce`` runs: one section per package, gathered in ``index.md``.

The ``reproduce`` nox session runs every package's ``reproduce --quick --out reports/<package>``
and then :func:`write_index` (``kernels-common report reports``), which reads each
``reports/<package>/results.json`` and writes ``reports/index.md`` with the claims table and the
plots of every package.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kernels_common.results import RESULTS_FILE, ReproduceResults

INDEX_FILE = "index.md"


def _format(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
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


def write_index(
    reports_dir: str | Path, failures: Sequence[str] = (), *, expected: Sequence[str] = ()
) -> Path:
    """Gather ``<reports_dir>/*/results.json`` into ``<reports_dir>/index.md``.

    Args:
        reports_dir: folder holding one sub-folder per package.
        failures: packages whose ``reproduce`` command failed (listed in the report).
        expected: packages that should have results; one without a ``results.json`` (and not in
            ``failures``) is reported as missing.

    Returns:
        The path of ``index.md``.
    """
    reports_dir = Path(reports_dir)
    reports_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, ReproduceResults] = {}
    malformed: list[str] = []
    for path in sorted(reports_dir.glob(f"*/{RESULTS_FILE}")):
        try:
            found[path.parent.name] = ReproduceResults.load(path)
        except ValueError as error:  # one bad file must not hide the other packages' results
            malformed.append(f"`{path.parent.name}` ({error})")
    sections = [render_results(results, f"{name}/") for name, results in found.items()]
    missing = [
        name
        for name in expected
        if name not in found
        and name not in failures
        and not any(f"`{name}`" in m for m in malformed)
    ]

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
        lines += ["Unreadable results: " + "; ".join(malformed), ""]
    index = reports_dir / INDEX_FILE
    index.write_text("\n".join(lines + sections).rstrip() + "\n")
    return index
