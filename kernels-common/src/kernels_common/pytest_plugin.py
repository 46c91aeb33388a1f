"""pytest plugin shared by every package, loaded with ``-p kernels_common.pytest_plugin`` (the
repository's root ``addopts``). It is deliberately not an auto-loaded ``pytest11`` entry point:
installing kernels-common changes no one else's test runs.

Markers:

* ``gpu`` -- needs a CUDA device and Triton. Skipped where either is missing, unless the run was
  started with ``--require-gpu``: then a missing GPU is an error, so a GPU check can never pass by
  skipping everything.
* ``slow`` -- takes more than ~20 s.
* ``integration`` -- combines two or more packages.

Fixtures:

* ``triton_backend`` -- the Triton backend this run can test kernels with: the interpreter when
  ``TRITON_INTERPRET=1`` was set before the run started (the nox test sessions set it), the compiled
  kernels on a CUDA device otherwise; the test is skipped where neither is possible. Triton reads
  ``TRITON_INTERPRET`` when it is first imported, so it cannot be switched on inside a test.
* ``poison_empty`` -- fills ``torch.empty`` buffers with NaN for the duration of a test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernels_common.backend import Backend, interpreter_enabled, triton_available
from kernels_common.testing import poison_uninitialized

MARKERS = {
    "gpu": "needs a CUDA device and Triton; skipped without them unless --require-gpu is given",
    "slow": "takes more than ~20 s",
    "integration": "combines two or more packages of the workspace",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kernels-common")
    group.addoption(
        "--require-gpu",
        action="store_true",
        default=False,
        help="fail, instead of skipping, when tests marked gpu cannot run (no CUDA or no Triton)",
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")


def gpu_unavailable_reason() -> str | None:
    """Why ``gpu`` tests cannot run here, or ``None`` if they can."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device is available"
    if not triton_available():
        return "triton is not installed"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    if config.getoption("--require-gpu"):
        raise pytest.UsageError(
            f"--require-gpu was given but {reason}: {len(gpu_items)} gpu test(s) cannot run"
        )
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def triton_backend(request: pytest.FixtureRequest) -> Backend:
    """``Backend.INTERPRETER`` under ``TRITON_INTERPRET=1``, else ``Backend.TRITON`` on CUDA.

    Under ``--require-gpu`` only compiled Triton on CUDA is accepted: the test errors otherwise.
    """
    import torch

    compiled = triton_available() and torch.cuda.is_available() and not interpreter_enabled()
    if request.config.getoption("--require-gpu"):
        if not compiled:
            pytest.fail(
                "--require-gpu: compiled Triton on CUDA is not available (no CUDA device, no "
                "triton, or TRITON_INTERPRET is set)",
                pytrace=False,
            )
        return Backend.TRITON
    if not triton_available():
        pytest.skip("triton is not installed")
    if interpreter_enabled():
        return Backend.INTERPRETER
    if compiled:
        return Backend.TRITON
    pytest.skip("Triton kernel tests need TRITON_INTERPRET=1 at start-up (set by nox) or CUDA")


@pytest.fixture
def poison_empty() -> Iterator[None]:
    """Fill ``torch.empty*`` buffers with NaN while the test runs."""
    with poison_uninitialized():
        yield
