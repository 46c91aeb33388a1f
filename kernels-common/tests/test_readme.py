"""The README's example runs as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels_common.testing import markdown_python_blocks

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs(capsys):
    for block in markdown_python_blocks(README):
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "grad[b]" in out
    assert "| swiglu |" in out


def test_markdown_without_python_is_an_error(tmp_path):
    empty = tmp_path / "README.md"
    empty.write_text("# nothing\n\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="has no ```python code block"):
        markdown_python_blocks(empty)
