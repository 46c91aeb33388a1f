"""The fused logic-layer op: validation, then the backend chosen per call."""

from __future__ import annotations

import torch

from dlgn_gumbel.reference import logic_layer_affine
from kernels_common.backend import Backend, KernelOp

__all__ = ["check_index_range", "logic_layer", "logic_layer_op"]

logic_layer_op = KernelOp(
    name="dlgn_logic_layer",
    reference=logic_layer_affine,
    triton="dlgn_gumbel.autograd:logic_layer_triton",
)


def logic_layer(
    x: torch.Tensor,
    idx_a: torch.Tensor,
    idx_b: torch.Tensor,
    coeffs: torch.Tensor,
    *,
    backend: str | Backend | None = None,
    check_indices: bool = True,
) -> torch.Tensor:
    """Affine logic layer ``y[n] = c0 + c1·a + c2·b + c3·ab`` (``a = x[idx_a[n]]``, ...).

    Activations are feature-major (one row per feature, one column per sample).

    Args:
        x: ``(in_dim, B)`` float32 inputs.
        idx_a: ``(N,)`` int64 indices in ``[0, in_dim)``: each neuron's first input.
        idx_b: ``(N,)`` int64 indices in ``[0, in_dim)``: each neuron's second input.
        coeffs: ``(N, 4)`` float32 coefficients (``gate_coefficients(weights)``), or
            ``(N, 4, B)`` for per-example gates (each example its own coefficients).
        backend: ``None``/``"auto"``, ``"triton"``, ``"interpreter"`` or ``"reference"`` (the
            vectorized PyTorch path; see :func:`kernels_common.resolve_backend`).
        check_indices: check that the indices lie in ``[0, in_dim)`` (their minimum and maximum:
            a device synchronisation on a GPU). :class:`~dlgn_gumbel.LogicLayer` checks its own
            once, when they are built or loaded, and passes ``False``.

    Returns:
        ``(N, B)`` float32, differentiable in ``x`` and ``coeffs``.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (in_dim, batch), got shape {tuple(x.shape)}")
    if x.dtype != torch.float32 or coeffs.dtype != torch.float32:
        raise TypeError(f"x and coeffs must be float32, got {x.dtype} and {coeffs.dtype}")
    n_out = idx_a.shape[0]
    if (
        idx_a.shape != (n_out,)
        or idx_b.shape != (n_out,)
        or coeffs.shape not in ((n_out, 4), (n_out, 4, x.shape[1]))
    ):
        raise ValueError(
            f"idx_a, idx_b must be (N,) and coeffs (N, 4) or (N, 4, batch={x.shape[1]}); got "
            f"{tuple(idx_a.shape)}, {tuple(idx_b.shape)}, {tuple(coeffs.shape)}"
        )
    for name, idx in (("idx_a", idx_a), ("idx_b", idx_b)):
        if idx.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {idx.dtype}")
        if check_indices:
            check_index_range(name, idx, x.shape[0])
    return logic_layer_op(x, idx_a, idx_b, coeffs, backend=backend)


def check_index_range(name: str, idx: torch.Tensor, size: int) -> None:
    """Raise ``ValueError`` unless every entry of ``idx`` lies in ``[0, size)``."""
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= size):
        raise ValueError(f"{name} must index rows of x, i.e. lie in [0, {size})")
