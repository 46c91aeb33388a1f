"""The command line: help, a tiny benchmark, and the README example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels_common.testing import run_markdown_python
from tfla_mlstm.__main__ import main

README = Path(__file__).resolve().parent.parent / "README.md"


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "bench" in out
    assert "reproduce" in out


# mlstm-kernels imports its Triton chunkwise modules with its registry; they use torch.jit
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_bench_writes_a_table_with_ratios_against_the_peer(tmp_path, capsys):
    pytest.importorskip("mlstm_kernels")
    assert main(["bench", "--out", str(tmp_path), "--seq-lens", "128", "--repeat", "1"]) == 0
    table = json.loads((tmp_path / "chunkwise_cpu_S128_fwd+bwd.json").read_text())
    assert table["baseline"].startswith("mlstm-kernels chunkwise")
    names = [row["name"] for row in table["rows"]]
    assert any(name.startswith("tfla-mlstm chunkwise") for name in names)
    assert all(row["time_ratio"] > 0 for row in table["rows"])


def test_readme_example_runs(capsys):
    run_markdown_python(README)
    assert "max |chunkwise - parallel|" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["bench", "--device", "nosuch"], "'nosuch'"),  # not a torch device at all
        (["bench", "--seq-lens", "-64"], "'-64'"),  # a sequence length must be positive
        (["bench", "--repeat", "0"], "'0'"),  # zero repeats measure nothing
        (["bench", "--out", "table.md"], "table.md"),  # the folder for the tables is a file
    ],
)
def test_bad_arguments_are_refused_in_one_line_before_any_work(argv, named, tmp_path, capsys):
    (tmp_path / "table.md").write_text("a file")
    argv = [str(tmp_path / a) if a == "table.md" else a for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("tfla-mlstm bench: error: argument")
    assert named in err
    assert [p.name for p in tmp_path.iterdir()] == ["table.md"]  # nothing written
