"""Backend choice: every automatic path, every override, every refusal, and a real dispatch."""

from __future__ import annotations

import types

import pytest
import torch

from kernels_common import Backend, BackendUnavailableError, KernelOp, resolve_backend
from kernels_common import backend as backend_module


def fake_tensor(device: str) -> object:
    """An object with a tensor's ``.device`` (a CUDA tensor cannot be made on a CPU machine)."""
    return types.SimpleNamespace(device=torch.device(device))


@pytest.fixture
def triton_installed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(backend_module, "triton_available", lambda: True)


@pytest.fixture
def triton_missing(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(backend_module, "triton_available", lambda: False)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("KERNELS_COMMON_BACKEND", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.usefixtures("triton_installed")
def test_auto_cpu_tensors_use_reference():
    assert resolve_backend(None, [torch.ones(2)]) is Backend.REFERENCE
    assert resolve_backend("auto", [torch.ones(2)]) is Backend.REFERENCE


@pytest.mark.usefixtures("triton_installed")
def test_auto_cuda_tensors_use_triton():
    assert resolve_backend(None, [fake_tensor("cuda")]) is Backend.TRITON


@pytest.mark.usefixtures("triton_missing")
def test_auto_cuda_without_triton_falls_back_to_reference():
    assert resolve_backend(None, [fake_tensor("cuda")]) is Backend.REFERENCE


@pytest.mark.usefixtures("triton_installed")
def test_auto_with_interpret_env_uses_interpreter(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend(None, [torch.ones(2)]) is Backend.INTERPRETER
    # Under the interpreter every @triton.jit function is interpreted, CUDA inputs included.
    assert resolve_backend("triton", [fake_tensor("cuda")]) is Backend.INTERPRETER


@pytest.mark.usefixtures("triton_installed")
def test_env_var_overrides_auto_and_argument_overrides_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "reference")
    assert resolve_backend(None, [fake_tensor("cuda")]) is Backend.REFERENCE
    assert resolve_backend("triton", [fake_tensor("cuda")]) is Backend.TRITON
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "Auto")
    assert resolve_backend(None, [fake_tensor("cuda")]) is Backend.TRITON


def test_unknown_backend_names_are_rejected(monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(ValueError, match=r"unknown backend 'cuda' from the backend argument"):
        resolve_backend("cuda")
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "fast")
    with pytest.raises(ValueError, match=r"from \$KERNELS_COMMON_BACKEND"):
        resolve_backend(None)


@pytest.mark.usefixtures("triton_missing")
@pytest.mark.parametrize("name", ["triton", "interpreter"])
def test_explicit_triton_without_triton_names_the_install(name: str):
    with pytest.raises(BackendUnavailableError, match=r"pip install 'triton"):
        resolve_backend(name, [torch.ones(1)])


@pytest.mark.usefixtures("triton_installed")
def test_explicit_triton_on_cpu_tensors_explains_the_interpreter():
    with pytest.raises(
        BackendUnavailableError, match=r"needs CUDA tensors, got cpu.*TRITON_INTERPRET=1"
    ):
        resolve_backend("triton", [torch.ones(1)])


@pytest.mark.usefixtures("triton_installed")
def test_explicit_interpreter_needs_the_env_var():
    with pytest.raises(BackendUnavailableError, match=r"TRITON_INTERPRET=1"):
        resolve_backend("interpreter", [torch.ones(1)])


def test_mixed_devices_are_rejected():
    with pytest.raises(ValueError, match=r"different device types \['cpu', 'meta'\]"):
        resolve_backend(None, [torch.ones(1), torch.empty(1, device="meta")])


def test_kernel_op_dispatches_and_loads_triton_lazily(monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []
    op = KernelOp(
        "double",
        reference=lambda x, *, scale=2: calls.append("reference") or scale * x,
        triton="kernels_common.no_such_module:double",
    )
    out = op(torch.ones(2), scale=3)
    assert calls == ["reference"]
    torch.testing.assert_close(out, torch.full((2,), 3.0))
    # The Triton target is only imported once a Triton backend is chosen.
    monkeypatch.setattr(backend_module, "triton_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ModuleNotFoundError, match=r"kernels_common\.no_such_module"):
        op(torch.ones(2))


def test_kernel_op_rejects_malformed_lazy_target(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(backend_module, "triton_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    op = KernelOp("bad", reference=lambda x: x, triton="kernels_common.swiglu")
    with pytest.raises(ValueError, match=r"'package\.module:function'"):
        op(torch.ones(1))


def test_tensors_inside_containers_are_seen():
    op = KernelOp("first", reference=lambda *args, **kwargs: "reference", triton=lambda *a, **k: "")
    cpu, meta = torch.ones(1), torch.empty(1, device="meta")
    assert op((cpu, cpu), state={"C": cpu}) == "reference"
    with pytest.raises(ValueError, match="different device types"):
        op((cpu, meta))
    with pytest.raises(ValueError, match="different device types"):
        op(cpu, state={"C": meta})


@pytest.mark.usefixtures("triton_installed")
@pytest.mark.parametrize(
    ("value", "interpreted"), [("1", True), ("True", True), ("on", True), ("0", False), ("", False)]
)
def test_interpret_env_values_follow_triton(monkeypatch: pytest.MonkeyPatch, value, interpreted):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    expected = Backend.INTERPRETER if interpreted else Backend.REFERENCE
    assert resolve_backend(None, [torch.ones(1)]) is expected


def test_cpu_scalars_count_as_cpu_tensors():
    # a Triton kernel cannot read a CPU scalar tensor: the caller passes a number instead
    with pytest.raises(ValueError, match="different device types"):
        resolve_backend(None, [torch.empty(2, device="meta"), torch.tensor(0.5)])
