"""The README's example runs as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels_common.testing import markdown_python_blocks, run_markdown_python

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs(capsys):
    run_markdown_python(README)
    out = capsys.readouterr().out
    assert "grad[b]" in out
    assert "| swiglu |" in out


def test_markdown_without_python_is_an_error(tmp_path):
    empty = tmp_path / "README.md"
    empty.write_text("# nothing\n\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="has no ```python code block"):
        markdown_python_blocks(empty)


def test_blocks_run_in_order_in_one_namespace(tmp_path):
    page = tmp_path / "README.md"
    blocks = ["```python\nx = 2\n```", "text", "```bash\nexit 1\n```", "```python\ny = x * 21\n```"]
    page.write_text("\n".join(blocks) + "\n")
    assert run_markdown_python(page)["y"] == 42
    page.write_text("```python\nraise KeyError('from the page')\n```\n")
    with pytest.raises(KeyError, match="from the page"):
        run_markdown_python(page)
