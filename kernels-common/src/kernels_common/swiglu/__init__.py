"""SwiGLU's gate ``silu(a) * b``: the worked example of an op built on kernels-common.

It shows the pattern every package follows: a PyTorch reference (``reference.py``), Triton
kernels with their launch wrappers and nothing else (``kernels.py``), one autograd Function
(``autograd.py``), and a :class:`~kernels_common.KernelOp` that picks the backend per call.
"""

from __future__ import annotations

import torch

from kernels_common.backend import Backend, KernelOp
from kernels_common.swiglu.reference import swiglu_reference

__all__ = ["swiglu", "swiglu_op", "swiglu_reference"]

swiglu_op = KernelOp(
    name="swiglu",
    reference=swiglu_reference,
    triton="kernels_common.swiglu.autograd:swiglu_triton",
)


def swiglu(
    a: torch.Tensor, b: torch.Tensor, *, backend: str | Backend | None = None
) -> torch.Tensor:
    """SwiGLU gate ``silu(a) * b`` (the elementwise half of a SwiGLU MLP).

    Args:
        a: gate pre-activation, shape ``(...)``, float32/float16/bfloat16.
        b: value, same shape, dtype and device as ``a``.
        backend: ``None``/``"auto"``, ``"triton"``, ``"interpreter"`` or ``"reference"``
            (see :func:`kernels_common.resolve_backend`).

    Returns:
        ``silu(a) * b`` with the shape and dtype of ``a``; differentiable in ``a`` and ``b``.

    Example:
        >>> import torch
        >>> a, b = torch.zeros(3), torch.ones(3)
        >>> swiglu(a, b, backend="reference")
        tensor([0., 0., 0.])
    """
    for name, tensor in (("a", a), ("b", b)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"{name} must be float32, float16 or bfloat16, got {tensor.dtype}")
    if a.shape != b.shape:
        raise ValueError(
            f"a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"a and b must be on the same device, got {a.device} and {b.device}")
    return swiglu_op(a, b, backend=backend)
