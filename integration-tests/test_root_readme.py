"""The root README's examples of combined packages run as written."""

from __future__ import annotations

from pathlib import Path

from kernels_common.testing import markdown_python_blocks, run_markdown_python

README = Path(__file__).resolve().parent.parent / "README.md"


def test_root_readme_examples_run():
    # the examples print their results; running them checks that every documented call exists
    # and that each combination works end to end on a CPU
    assert len(markdown_python_blocks(README)) >= 4
    namespace = run_markdown_python(README)
    assert namespace["law"].C > 0
    assert namespace["error"].mean() < 0.05  # the law's prediction of the WSD run, 100 steps
    assert namespace["losses"][-1] < namespace["losses"][0]  # DiLoCo on the xLSTM learns
