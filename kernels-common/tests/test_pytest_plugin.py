"""The shared pytest plugin, run in a throw-away pytest session (pytester)."""

from __future__ import annotations

import pytest
import torch

# The inner sessions load the plugin explicitly, as the repository's addopts do.
LOAD = ["-p", "kernels_common.pytest_plugin"]

GPU_TEST = """
import pytest

@pytest.mark.gpu
def test_on_gpu():
    pass

@pytest.mark.slow
@pytest.mark.integration
def test_other_markers_are_registered():
    pass
"""


@pytest.fixture(autouse=True)
def isolated_config(pytester: pytest.Pytester) -> None:
    """The inner sessions get their own empty configuration: temporary folders may lie inside
    this repository (nox puts TMPDIR under .nox/), whose pyproject.toml loads the plugin."""
    pytester.makeini("[pytest]\n")


needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")


@needs_no_cuda
def test_gpu_tests_are_skipped_without_cuda(pytester: pytest.Pytester):
    pytester.makepyfile(GPU_TEST)
    result = pytester.runpytest(*LOAD, "--strict-markers", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*gpu test: no CUDA device is available*"])


@needs_no_cuda
def test_require_gpu_turns_the_skip_into_an_error(pytester: pytest.Pytester):
    pytester.makepyfile(GPU_TEST)
    result = pytester.runpytest(*LOAD, "--require-gpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--require-gpu was given but no CUDA device is available*1 gpu test*"]
    )


def test_require_gpu_without_gpu_tests_runs_normally(pytester: pytest.Pytester):
    pytester.makepyfile("def test_cpu():\n    pass\n")
    result = pytester.runpytest(*LOAD, "--require-gpu")
    result.assert_outcomes(passed=1)


def test_unknown_markers_still_fail_under_strict_markers(pytester: pytest.Pytester):
    pytester.makepyfile("import pytest\n\n@pytest.mark.gpuu\ndef test_typo():\n    pass\n")
    result = pytester.runpytest(*LOAD, "--strict-markers")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*'gpuu' not found in `markers`*"])


def test_plugin_is_not_auto_loaded(pytester: pytest.Pytester):
    pytester.makepyfile("import pytest\n\n@pytest.mark.gpu\ndef test_marked():\n    pass\n")
    result = pytester.runpytest_subprocess("--strict-markers")  # a fresh process, no -p
    assert result.ret == pytest.ExitCode.INTERRUPTED  # 'gpu' is unknown without the plugin
    result.stdout.fnmatch_lines(["*'gpu' not found in `markers`*"])


@needs_no_cuda
def test_triton_backend_fixture_fails_under_require_gpu(pytester: pytest.Pytester):
    pytester.makepyfile("def test_kernel(triton_backend):\n    pass\n")
    result = pytester.runpytest(*LOAD, "--require-gpu")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--require-gpu: compiled Triton on CUDA is not available*"])


def test_poison_empty_fixture(poison_empty):
    assert torch.empty(5).isnan().all()
