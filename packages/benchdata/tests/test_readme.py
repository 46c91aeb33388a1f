"""The README's example runs as written, and its table names every public loader."""

from __future__ import annotations

from pathlib import Path

import benchdata
from kernels_common.testing import run_markdown_python

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs():
    run_markdown_python(README)


def test_readme_install_table_covers_every_loader_and_command():
    text = README.read_text()
    for loader in ("fashion_mnist", "mnist_5k", "digits", "fortunes_corpus", "smollm2_135m"):
        assert f"`{loader}(" in text
    for command in benchdata.INSTALL.values():
        for part in command.split(" && "):
            assert part in text, part
