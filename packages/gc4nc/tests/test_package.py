"""Package-level checks: README example, lean import, the CLI end to end and its refusals, the
benchmark writer, and the evaluator's reference against a hand-rolled training loop."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch

import gc4nc
from gc4nc.__main__ import main
from kernels_common.testing import import_footprint, run_markdown_python

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the example saves a condensed graph into the working folder
    run_markdown_python(README)
    assert (tmp_path / "digits-kcenter" / "graph.safetensors").is_file()


def test_import_is_lean():
    watch = ["triton", "torch_geometric", "scipy", "networkx", "benchdata"]
    footprint = import_footprint("import torch, gc4nc", watch=watch)
    assert not any(footprint[m] for m in watch)
    assert not footprint["cuda"]


def test_version_and_help():
    for command in ("methods", "condense", "evaluate", "benchmark", "reproduce"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
    assert gc4nc.__version__ == importlib.metadata.version("gc4nc")


def test_every_registered_method_has_a_family_and_defaults_are_json():
    for spec in gc4nc.METHODS.values():
        json.dumps(spec.defaults)
        assert spec.structure in ("learned", "kept", "none")


def test_cli_condense_evaluate_and_benchmark_end_to_end(tmp_path, capsys):
    folder = tmp_path / "c"
    code = main(
        [
            "condense",
            "--dataset",
            "digits-knn",
            "--method",
            "kcenter",
            "--rate",
            "0.1",
            "--set",
            "epochs=20",
            "--out",
            str(folder),
        ]
    )
    assert code == 0
    condensed = gc4nc.CondensedGraph.load(folder)
    assert condensed.num_nodes == 20
    assert condensed.metadata["dataset"] == "digits-knn"
    assert condensed.metadata["hyperparameters"]["epochs"] == 20
    capsys.readouterr()
    out = tmp_path / "e.json"
    code = main(
        [
            "evaluate",
            str(folder),
            "--dims",
            "performance,properties",
            "--runs",
            "1",
            "--epochs",
            "20",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert set(report) >= {"performance", "properties"}
    bench = tmp_path / "b"
    code = main(
        [
            "benchmark",
            "--datasets",
            "digits-knn",
            "--methods",
            "random,averaging",
            "--rates",
            "0.1",
            "--runs",
            "1",
            "--epochs",
            "10",
            "--out",
            str(bench),
        ]
    )
    assert code == 0
    assert sorted(p.name for p in bench.iterdir()) == [
        "accuracy_digits-knn.png",
        "benchmark.json",
        "benchmark.md",
        "time_digits-knn.png",
    ]
    record = json.loads((bench / "benchmark.json").read_text())
    assert {c["method"] for c in record["cells"]} == {"random", "averaging"}
    assert all(c["error"] is None for c in record["cells"])


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["condense", "--rate", "1.5"], "(0, 1)"),
        (["condense", "--method", "gcond2"], "gcond2"),
        (["condense", "--dataset", "cora"], "cora"),
        (["condense", "--set", "epochs"], "name=value"),
        (["condense", "--dataset", "digits-knn", "--method", "random", "--set", "lr=1"], "lr"),
        (["evaluate", "missing-folder"], "missing-folder"),
        (["benchmark", "--methods", "random,bogus"], "bogus"),
        (["benchmark", "--rates", "0.1,0"], "(0, 1)"),
        (["benchmark", "--methods", "random,degree", "--set", "epochs=5"], "epochs"),
        (["condense", "--dataset", "planetoid:/nonexistent:cora"], "nonexistent"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(argv, expect, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse refuses before the command runs
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert expect in err
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_evaluate_refuses_a_corrupt_condensed_graph(tmp_path, capsys):
    c = gc4nc.CondensedGraph(
        torch.randn(2, 64), None, torch.tensor([0, 1]), {"dataset": "digits-knn"}
    )
    c.save(tmp_path / "c")
    (tmp_path / "c" / "graph.safetensors").write_bytes(b"garbage")
    assert main(["evaluate", str(tmp_path / "c")]) == 2
    assert "corrupt" in capsys.readouterr().err
