"""docs/build.py's Markdown rewriting, run by the `docs` session before it builds the site."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@pytest.fixture(scope="module")
def build():
    spec = importlib.util.spec_from_file_location("docs_build", HERE / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture
def site(build):
    project = build.read_project()
    site = build.Site(project, build.tracked_files())
    site.targets = {"packages/flashdp": "flashdp/index.md"}  # as build_site maps each package
    return site


def test_a_list_right_after_a_paragraph_line_gets_the_blank_line_markdown_needs(build):
    text = "Intro line:\n- one\n- two\n\nWrapped in\n2025. Not a list.\n```\nx\n- in code\n```\n"
    assert build.github_compatible(text) == (
        "Intro line:\n\n- one\n- two\n\nWrapped in\n2025. Not a list.\n```\nx\n- in code\n```\n"
    )
    assert build.github_compatible("Steps:\n1. first\n") == "Steps:\n\n1. first\n"


def test_headings_shift_to_the_level_asked_and_code_is_left_alone(build):
    text = "## Title\n\n```\n# a comment in code\n```\n\n### Part\n"
    assert build.shift_headings(text, 1) == "# Title\n\n```\n# a comment in code\n```\n\n## Part\n"


def test_links_go_to_pages_to_github_or_are_reported(build, site, caplog):
    source = ROOT / "README.md"
    repository = site.project.repository
    text = (
        "[flashdp](packages/flashdp/) [its bench](packages/flashdp/benchmarks/bench_flashdp.py#L1) "
        "[web](https://example.com) [here](#install) `[code](not/a/link)`\n"
        "[ref]: CONTRIBUTING.md\n"
        "[^1]: A footnote, not a link.\n"
    )
    with caplog.at_level(logging.WARNING, logger="docs.build"):
        out = site.rewrite_links(text, source, "index.md")
    assert out == (
        f"[flashdp](flashdp/index.md) [its bench]({repository}/blob/main/packages/flashdp/"
        "benchmarks/bench_flashdp.py#L1) [web](https://example.com) [here](#install) "
        "`[code](not/a/link)`\n"
        f"[ref]: {repository}/blob/main/CONTRIBUTING.md\n"
        "[^1]: A footnote, not a link.\n"
    )
    assert not caplog.records

    with caplog.at_level(logging.WARNING, logger="docs.build"):
        site.rewrite_links("[gone](no/such/file.md) [out](../../elsewhere.md)\n", source, "x.md")
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        "README.md: broken link 'no/such/file.md' (no no/such/file.md)",
        "README.md: link '../../elsewhere.md' leaves the repository",
    ]
