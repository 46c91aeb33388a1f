"""results.json schema, plots and the Markdown report behind `nox -s reproduce`."""

from __future__ import annotations

import json
import math
import struct

import pytest

from kernels_common import Claim, ReproduceResults
from kernels_common.__main__ import main
from kernels_common.plotting import plot_curves
from kernels_common.report import write_index, write_summary


def claim(**overrides) -> Claim:
    fields = {
        "name": "memory vs non-DP",
        "paper": "memory stays at the non-DP level",
        "measured": 1.1,
        "unit": "ratio",
        "direction": "at_most",
        "threshold": 1.15,
    }
    return Claim(**{**fields, **overrides})


@pytest.mark.parametrize(
    ("direction", "measured", "threshold", "tolerance", "passed"),
    [
        ("at_most", 1.15, 1.15, None, True),
        ("at_most", 1.1500001, 1.15, None, False),
        ("at_least", 0.9, 0.9, None, True),
        ("at_least", 0.89, 0.9, None, False),
        ("within", 3.25, 3.2, 0.05, True),
        ("within", 3.26, 3.2, 0.05, False),
        ("at_least", math.nan, 0.0, None, False),
    ],
)
def test_claim_pass_fail_follows_the_direction(direction, measured, threshold, tolerance, passed):
    c = claim(direction=direction, measured=measured, threshold=threshold, tolerance=tolerance)
    assert c.passed is passed


def test_claim_validation():
    with pytest.raises(ValueError, match="direction must be one of"):
        claim(direction="higher")
    with pytest.raises(ValueError, match="'within' needs a non-negative tolerance"):
        claim(direction="within")
    with pytest.raises(ValueError, match="only used with direction 'within'"):
        claim(tolerance=0.1)
    with pytest.raises(TypeError, match="measured must be a number, got str"):
        claim(measured="1.1")


def results_with_plot(directory) -> ReproduceResults:
    plot_curves(
        {"non-DP": ([0, 10, 20], [4.0, 3.1, 2.7]), "DP": ([0, 10, 20], [4.0, 3.4, 3.0])},
        directory / "loss.png",
        title="validation loss",
        xlabel="step",
        ylabel="loss",
    )
    return ReproduceResults(
        package="demo-package",
        title="DP vs non-DP",
        claims=(
            claim(),
            claim(name="throughput", measured=0.5, direction="at_least", threshold=0.9),
        ),
        figures=("loss.png",),
        summary="Trained twice on the same data.",
        settings={"steps": 20},
        elapsed_s=12.0,
    )


def png_size(path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


def test_save_load_round_trip_and_plot(tmp_path):
    results = results_with_plot(tmp_path)
    assert png_size(tmp_path / "loss.png") == (720, 480)  # 6 x 4 in at 120 dpi
    path = results.save(tmp_path)
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1
    assert [c["passed"] for c in data["claims"]] == [True, False]
    assert data["passed"] is False
    assert ReproduceResults.load(tmp_path) == results


def test_load_rejects_tampered_and_foreign_files(tmp_path):
    path = results_with_plot(tmp_path).save(tmp_path)
    data = json.loads(path.read_text())
    data["claims"][1]["passed"] = True  # typed-in pass that the values do not support
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="stored pass/fail of 'throughput' disagrees"):
        ReproduceResults.load(path)
    path.write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(ValueError, match="schema_version 99, expected 1"):
        ReproduceResults.load(path)
    with pytest.raises(FileNotFoundError, match="no results file"):
        ReproduceResults.load(tmp_path / "missing")


def test_save_refuses_missing_or_absolute_figures(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"\['curve.png'\]"):
        ReproduceResults("p", "t", (claim(),), figures=("curve.png",)).save(tmp_path)
    with pytest.raises(ValueError, match="relative to the results directory"):
        ReproduceResults("p", "t", (claim(),), figures=("/tmp/x.png",))


def test_summary_has_every_claim_its_verdict_the_plots_and_the_extra_tables(tmp_path):
    results = results_with_plot(tmp_path)
    path = write_summary(results, tmp_path, extra="| method | ppl |\n|---|---:|\n| a | 3.0 |")
    text = path.read_text()
    assert path.name == "summary.md"
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert rows["| memory vs non-DP"].endswith("| yes |")  # 1.1 <= 1.15
    assert rows["| throughput"].endswith("| **no** |")  # 0.5 < 0.9
    assert "![loss](loss.png)" in text  # relative to the folder holding summary.md
    assert text.rstrip().endswith("| a | 3.0 |")
    unmeasured = claim(name="tie", measured=math.nan, direction="at_least", threshold=0.0)
    results = ReproduceResults("p", "t", (unmeasured,))
    row = next(
        line
        for line in write_summary(results, tmp_path).read_text().splitlines()
        if "| tie" in line
    )
    assert "| no value (NaN ratio) |" in row
    assert row.endswith("| **no** |")


def test_index_without_packages_says_so(tmp_path):
    summary = write_index(tmp_path)
    assert summary.complete
    assert "No package provides a `reproduce` command yet." in summary.path.read_text()


def test_index_gathers_packages_failures_and_missing(tmp_path):
    results_with_plot(tmp_path / "demo-package").save(tmp_path / "demo-package")
    summary = write_index(
        tmp_path, failures=["broken"], expected=["demo-package", "silent", "broken"]
    )
    assert summary.reported == ("demo-package",)
    assert summary.missing == ("silent",)
    assert not summary.complete
    text = summary.path.read_text()
    assert "1 package(s) reported; 1 of 2 claims agree." in text
    assert "Failed to run: `broken`" in text
    assert "Ran but wrote no results: `silent`" in text
    assert (
        "| memory vs non-DP | memory stays at the non-DP level | - | 1.1 ratio | <= 1.15 | yes |"
        in text
    )
    assert "| **no** |" in text
    assert "![loss](demo-package/loss.png)" in text


def test_cli_report_command(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--failed", "x"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "index.md")
    assert "Failed to run: `x`" in (tmp_path / "index.md").read_text()


def test_cli_report_fails_on_unreadable_results(tmp_path, capsys):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{not json")
    assert main(["report", str(tmp_path), "--expected", "bad"]) == 1
    assert "unreadable results: bad" in capsys.readouterr().err
    assert (tmp_path / "index.md").exists()


def test_cli_backend_command(capsys):
    assert main(["backend"]) == 0
    assert "CPU inputs ->" in capsys.readouterr().out


def test_plot_curves_validates_input(tmp_path):
    with pytest.raises(ValueError, match="3 x values but 2 y values"):
        plot_curves({"a": ([1, 2, 3], [1, 2])}, tmp_path / "a.png", title="", xlabel="", ylabel="")
    with pytest.raises(ValueError, match="saved as PNG"):
        plot_curves({"a": ([1], [1])}, tmp_path / "a.pdf", title="", xlabel="", ylabel="")


@pytest.mark.parametrize(("value", "encoded"), [(math.nan, '"nan"'), (math.inf, '"inf"')])
def test_non_finite_measurements_round_trip(tmp_path, value, encoded):
    results = ReproduceResults("p", "t", (claim(measured=value, direction="at_least"),))
    path = results.save(tmp_path)
    text = path.read_text()
    assert f'"measured": {encoded}' in text
    json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name}"))  # strict JSON
    measured = ReproduceResults.load(path).claims[0].measured
    assert measured == value or (math.isnan(measured) and math.isnan(value))
    assert ReproduceResults.load(path).passed is results.passed


def test_non_finite_bounds_and_settings_are_refused():
    with pytest.raises(ValueError, match="threshold must be finite"):
        claim(threshold=math.inf)
    with pytest.raises(ValueError, match="settings must be plain JSON"):
        ReproduceResults("p", "t", (claim(),), settings={"lr": math.nan})


def test_missing_measured_field_is_malformed(tmp_path):
    path = ReproduceResults("p", "t", (claim(),)).save(tmp_path)
    data = json.loads(path.read_text())
    del data["claims"][0]["measured"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="malformed results"):
        ReproduceResults.load(path)


def test_duplicate_claim_names_are_refused():
    with pytest.raises(ValueError, match=r"repeated: \['memory vs non-DP'\]"):
        ReproduceResults("p", "t", (claim(), claim(measured=1.0)))


def test_tampered_overall_pass_and_malformed_files(tmp_path):
    path = results_with_plot(tmp_path).save(tmp_path)
    data = json.loads(path.read_text())
    data["passed"] = True
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="overall pass/fail disagrees"):
        ReproduceResults.load(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="malformed results"):
        ReproduceResults.load(path)


def test_one_unreadable_results_file_does_not_hide_the_others(tmp_path):
    results_with_plot(tmp_path / "good").save(tmp_path / "good")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{not json")
    summary = write_index(tmp_path, expected=["good", "bad"])
    assert summary.unreadable == ("bad",)
    text = summary.path.read_text()
    assert "1 package(s) reported" in text
    assert "Unreadable results: `bad`" in text
    assert "Ran but wrote no results" not in text
