"""Backend dispatch: which implementation of an op runs for a given call.

Three backends exist for every op:

* ``"triton"`` -- the compiled Triton kernel; needs CUDA tensors and an installed ``triton``.
* ``"interpreter"`` -- the same Triton kernel run by Triton's interpreter on the CPU; active only
  when the environment variable ``TRITON_INTERPRET=1`` was set before Triton was first imported
  (Triton reads it when ``@triton.jit`` decorates a function, its own library functions included).
* ``"reference"`` -- the plain PyTorch implementation; runs anywhere and is the oracle of every
  kernel test.

With no explicit choice the backend follows the inputs: the interpreter when ``TRITON_INTERPRET=1``
and Triton is installed, Triton when the tensors live on a CUDA device and Triton is installed, the
reference otherwise. A ``backend=`` argument, or else the ``KERNELS_COMMON_BACKEND`` environment
variable, overrides the choice; asking for a backend that cannot run raises
:class:`BackendUnavailableError` with the reason and the fix.

Nothing here imports Triton or touches CUDA: the implementations are imported lazily, on the first
call that needs them.
"""

from __future__ import annotations

import enum
import functools
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

BACKEND_ENV_VAR = "KERNELS_COMMON_BACKEND"
INTERPRET_ENV_VAR = "TRITON_INTERPRET"
TRITON_INSTALL_HINT = "pip install 'triton>=3.6,<3.9' (or the package's [gpu] extra)"


class Backend(enum.StrEnum):
    """The implementations an op can run with."""

    TRITON = "triton"
    INTERPRETER = "interpreter"
    REFERENCE = "reference"


class BackendUnavailableError(RuntimeError):
    """A backend was asked for explicitly but cannot run here."""


@functools.cache
def triton_available() -> bool:
    """Whether ``triton`` can be imported, found without importing it."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """Whether ``TRITON_INTERPRET`` is set (to 1/true/on/yes, as Triton reads it), i.e. Triton
    kernels run on the CPU interpreter."""
    return os.environ.get(INTERPRET_ENV_VAR, "").strip().lower() in ("1", "true", "on", "yes")


def _parse(name: str | Backend, source: str) -> Backend | None:
    if isinstance(name, Backend):
        return name
    value = name.strip().lower()
    if value == "auto":
        return None
    try:
        return Backend(value)
    except ValueError:
        allowed = ", ".join(repr(b.value) for b in Backend)
        raise ValueError(
            f"unknown backend {name!r} from {source}; allowed: 'auto', {allowed}"
        ) from None


def iter_tensors(values: Iterable[Any]) -> Iterator[torch.Tensor]:
    """Yield every tensor in ``values``, looking into (nested) tuples, lists and dicts."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, tuple | list):
            yield from iter_tensors(value)
        elif isinstance(value, Mapping):
            yield from iter_tensors(value.values())


def _device_type(tensors: Iterable[torch.Tensor]) -> str | None:
    # Strict, 0-dim CPU scalars included: a kernel cannot read a CPU tensor from the GPU, so
    # scalars are passed as Python numbers or as tensors on the inputs' device.
    types = {t.device.type for t in tensors}
    if len(types) > 1:
        raise ValueError(f"inputs live on different device types {sorted(types)}; move them to one")
    return types.pop() if types else None


def resolve_backend(
    backend: str | Backend | None = None, tensors: Iterable[torch.Tensor] = ()
) -> Backend:
    """Choose the backend for a call on ``tensors``.

    Args:
        backend: ``"auto"``/``None`` to follow the inputs, or one of ``"triton"``,
            ``"interpreter"``, ``"reference"``. ``None`` falls back to the environment variable
            ``KERNELS_COMMON_BACKEND`` before choosing automatically.
        tensors: the call's tensor inputs; they must share one device type.

    Returns:
        The backend that will run.

    Raises:
        ValueError: unknown backend name, or inputs on different device types.
        BackendUnavailableError: an explicitly requested backend cannot run here.

    Example:
        >>> import torch
        >>> resolve_backend("reference", [torch.ones(2)])
        <Backend.REFERENCE: 'reference'>
    """
    device_type = _device_type(tensors)
    if backend is None:
        env_value = os.environ.get(BACKEND_ENV_VAR, "")
        requested = _parse(env_value, f"${BACKEND_ENV_VAR}") if env_value else None
    else:
        requested = _parse(backend, "the backend argument")

    interpret = interpreter_enabled()
    if requested is None:
        if triton_available() and interpret:
            return Backend.INTERPRETER
        if triton_available() and device_type == "cuda":
            return Backend.TRITON
        return Backend.REFERENCE
    if requested is Backend.REFERENCE:
        return Backend.REFERENCE

    if not triton_available():
        raise BackendUnavailableError(
            f"backend {requested.value!r} needs Triton, which is not installed: "
            + TRITON_INSTALL_HINT
        )
    if requested is Backend.INTERPRETER:
        if not interpret:
            raise BackendUnavailableError(
                f"backend 'interpreter' needs {INTERPRET_ENV_VAR}=1 before Triton is first "
                "imported (Triton reads it when @triton.jit decorates a function)"
            )
        return Backend.INTERPRETER
    # Backend.TRITON
    if interpret:
        # Every @triton.jit function is interpreted in this process: say so instead of pretending.
        return Backend.INTERPRETER
    if device_type not in (None, "cuda"):
        raise BackendUnavailableError(
            f"backend 'triton' needs CUDA tensors, got {device_type} tensors; set "
            f"{INTERPRET_ENV_VAR}=1 to run the Triton kernels on the CPU interpreter, or use "
            "backend='reference'"
        )
    return Backend.TRITON


def _load(target: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(target):
        return target
    module_name, sep, attribute = target.partition(":")
    if not sep or not attribute:
        raise ValueError(f"lazy target {target!r} must look like 'package.module:function'")
    return getattr(importlib.import_module(module_name), attribute)


@dataclass
class KernelOp:
    """One op with a PyTorch reference and a Triton implementation, dispatched per call.

    ``triton`` is either a callable or a lazy ``"package.module:function"`` path, so that building
    the op imports nothing heavy; both implementations take the same arguments.

    Example:
        >>> import torch
        >>> double = KernelOp("double", reference=lambda x: 2 * x, triton="my_pkg.kernels:double")
        >>> double(torch.ones(2), backend="reference")
        tensor([2., 2.])
    """

    name: str
    reference: Callable[..., Any]
    triton: str | Callable[..., Any]
    _triton_impl: Callable[..., Any] | None = field(default=None, init=False, repr=False)

    def implementation(self, backend: Backend) -> Callable[..., Any]:
        """The callable that runs for ``backend`` (importing the Triton module on first use)."""
        if backend is Backend.REFERENCE:
            return self.reference
        if self._triton_impl is None:
            self._triton_impl = _load(self.triton)
        return self._triton_impl

    def __call__(self, *args: Any, backend: str | Backend | None = None, **kwargs: Any) -> Any:
        chosen = resolve_backend(backend, iter_tensors((*args, *kwargs.values())))
        return self.implementation(chosen)(*args, **kwargs)
