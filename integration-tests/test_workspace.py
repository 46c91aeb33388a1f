"""Every member installs beside the others, imports, and keeps its import lean."""

from __future__ import annotations

import importlib
import importlib.metadata

from kernels_common.testing import import_footprint


def test_workspace_has_kernels_common(import_names):
    assert "kernels_common" in import_names


def test_member_is_installed_with_its_declared_version_and_public_api(project):
    module = importlib.import_module(project["name"].replace("-", "_"))
    assert importlib.metadata.version(project["name"]) == project["version"]
    assert module.__version__ == project["version"]
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{project['name']}.__all__ names missing attributes {missing}"


def test_importing_every_member_together_neither_imports_triton_nor_touches_cuda(import_names):
    code = "import torch\n" + "".join(f"import {name}\n" for name in import_names)
    assert import_footprint(code, watch=["triton"]) == {"triton": False, "cuda": False}


def test_shared_pytest_plugin_is_active(pytestconfig):
    markers = "\n".join(pytestconfig.getini("markers"))
    for marker in ("gpu:", "slow:", "integration:"):
        assert marker in markers
