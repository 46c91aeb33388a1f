"""Package-level checks: README and docstring examples, lean import, the CLI end to end and its
refusals, a tiny reproduce run."""

from __future__ import annotations

import doctest
import importlib
import importlib.metadata
import json
from pathlib import Path

import pytest
import torch

import cads
from cads.__main__ import main
from kernels_common.results import ReproduceResults
from kernels_common.testing import assert_refused, import_footprint, run_markdown_python

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs():
    run_markdown_python(README)


@pytest.mark.parametrize("module", ["api", "bilevel", "budget", "estimator", "projection"])
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(f"cads.{module}"))
    assert result.attempted > 0
    assert result.failed == 0


def test_import_is_lean():
    footprint = import_footprint(
        "import torch, cads", watch=["triton", "benchdata", "scipy", "matplotlib"]
    )
    assert not any(footprint.values()), footprint


def test_version():
    assert cads.__version__ == importlib.metadata.version("cads")


def test_cli_select_saves_a_loadable_selection(tmp_path, capsys):
    out = tmp_path / "sel"
    code = main(
        [
            "select",
            "--task",
            "toy",
            "--per-source",
            "24",
            "--method",
            "cads-s",
            "--budget",
            "6",
            "--outer-steps",
            "3",
            "--samples",
            "2",
            "--batch-size",
            "8",
            "--evaluate",
            "--out",
            str(out),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(report["ratios"]) == {"clean", "random-labels"}
    assert report["steps"] == 6
    assert 0 <= report["test_accuracy"] <= 1
    selection = cads.Selection.load(out)
    assert selection.method == "cads-s"
    assert len(selection) == report["size"]


def test_cli_compare_writes_rows(tmp_path, capsys):
    out = tmp_path / "rows.json"
    code = main(
        [
            "compare",
            "--task",
            "toy",
            "--per-source",
            "24",
            "--methods",
            "random,full",
            "--budgets",
            "4,8",
            "--batch-size",
            "8",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())
    assert [(r["method"], r["budget"]) for r in rows] == [
        ("random", 4.0),
        ("full", 4.0),
        ("random", 8.0),
        ("full", 8.0),
    ]
    assert json.loads(capsys.readouterr().out) == rows
    for row in rows:  # the examples per source add up to the selection
        assert sum(row["composition"]) == row["size"]
    assert rows[1]["composition"] == [24, 24]  # the full pool


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["select", "--budget", "0", "--out", "{tmp}/s"], "'0'"),
        (["select", "--task", "toy", "--budget", "2.5", "--out", "{tmp}/s"], "whole number"),
        (["select", "--budget", "nan", "--out", "{tmp}/s"], "'nan'"),
        (["select", "--budget", "5", "--method", "magic", "--out", "{tmp}/s"], "magic"),
        (["compare", "--budgets", "100,-3"], "positive numbers"),
        (["compare", "--budgets", "ten"], "numbers like"),
        (["compare", "--methods", "cads-e,oracle"], "oracle"),
        (["select", "--budget", "5", "--samples", "0", "--out", "{tmp}/s"], "'0'"),
        (["reproduce", "--out", "/proc/forbidden"], "cannot write"),
    ],
)
def test_cli_refuses_bad_input_with_one_line(argv, message, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert_refused(main, argv, capsys, "cads", message, unchanged=tmp_path)


def test_cli_refuses_a_bad_combination(tmp_path, capsys):
    argv = [
        "select",
        "--task",
        "toy",
        "--data-path",
        str(tmp_path),
        "--budget",
        "5",
        "--out",
        str(tmp_path / "s"),
    ]
    assert_refused(main, argv, capsys, "cads", "--data-path is for --task fashion-mnist")


def test_cli_refuses_a_flop_budget_too_small_for_one_step(tmp_path, capsys):
    argv = [
        "select",
        "--task",
        "toy",
        "--per-source",
        "16",
        "--unit",
        "flops",
        "--budget",
        "10",
        "--method",
        "random",
        "--evaluate",
        "--batch-size",
        "8",
        "--out",
        str(tmp_path / "s"),
    ]
    assert_refused(main, argv, capsys, "cads", "buys no step")


def test_tiny_reproduce_writes_valid_results(tmp_path):
    from cads.reproduce import ReproduceSettings, reproduce

    settings = ReproduceSettings(
        image_per_source=20,
        text_per_source=20,
        budgets=(3, 6),
        outer_steps=2,
        samples=2,
        fractions=(0.3, 1.0),
        speed_budgets=(2, 4),
        speed_outer_steps=1,
        image_batch=16,
        text_batch=8,
    )
    results = reproduce(tmp_path, settings=settings)
    loaded = ReproduceResults.load(tmp_path)
    assert [c.name for c in loaded.claims] == [c.name for c in results.claims]
    assert len(loaded.claims) == 10
    assert (tmp_path / "summary.md").is_file()
    assert all((tmp_path / figure).is_file() for figure in loaded.figures)
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert {r["method"] for r in rows["vision"]["rows"]} == {
        "cads-s",
        "cads-e",
        "random",
        "full",
        "best-source",
        "loss",
        "el2n",
        "grand",
        "forgetting",
    }
    assert torch.get_num_threads() >= 1
