"""Package-level checks: README example, lean import, the CLI end to end and its refusals."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

import freeze_thaw_bo as ftbo
from freeze_thaw_bo.__main__ import alpha_value, main
from kernels_common.testing import import_footprint, run_markdown_python

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs():
    run_markdown_python(README)


def test_import_is_lean():
    footprint = import_footprint(
        "import torch, freeze_thaw_bo", watch=["triton", "scipy", "optuna", "ray", "syne_tune"]
    )
    assert not any(footprint[m] for m in ("triton", "scipy", "optuna", "ray", "syne_tune"))
    assert not footprint["cuda"]


def test_cli_help_and_version():
    for command in ("run", "compare", "fit-utility", "train-surrogate", "reproduce"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
    assert ftbo.__version__ == importlib.metadata.version("freeze-thaw-bo")


def test_alpha_accepts_powers_of_two():
    assert alpha_value("2**-4") == 2**-4
    assert alpha_value("2^-2") == 0.25
    assert alpha_value("0.125") == 0.125


def test_cli_run_and_compare_end_to_end(tmp_path):
    out = tmp_path / "run.json"
    args = ["--max-configs", "12", "--budget", "20", "--num-samples", "32"]
    assert main(["run", "--method", "cfbo", "--alpha", "2**-4", *args, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["method"] == "cfbo"
    assert record["alpha"] == 2**-4
    assert len(record["regrets"]) == 20  # the whole budget, one epoch per step
    folder = tmp_path / "cmp"
    code = main(
        ["compare", "--methods", "random,sh", "--alphas", "0,2**-2", *args, "--out", str(folder)]
    )
    assert code == 0
    assert sorted(p.suffix for p in folder.iterdir()) == [".json", ".md", ".png", ".png"]


def test_cli_fit_utility(tmp_path, capsys):
    prefs = tmp_path / "prefs.json"
    prefs.write_text(json.dumps([[[10, 0.8], [200, 0.8]]] * 5))
    assert main(["fit-utility", str(prefs), "--budget", "300"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["alpha"] > 0


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["run", "--alpha", "-1"], "alpha"),
        (["run", "--method", "bohb"], "bohb"),
        (["run", "--benchmark", "mnist", "--out", "x.json"], "unknown benchmark"),
        (["compare", "--methods", "cfbo,bohb"], "bohb"),
        (["compare", "--alphas", ""], "alphas"),
        (["run", "--budget", "0"], "0"),
        (["fit-utility", "missing.json", "--budget", "10"], "missing.json"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(argv, expect, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)  # a refusal of the library's: one line, exit code 2
    except SystemExit as exit_info:  # a refusal of argparse's
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert expect in err
    assert len(err.splitlines()) == 1
