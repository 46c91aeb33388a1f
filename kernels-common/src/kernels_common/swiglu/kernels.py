"""Triton kernels for ``silu(a) * b`` and its gradient, with their launch wrappers.

Elementwise over the flattened (contiguous) inputs; arithmetic in float32, stores in the inputs'
dtype. No autograd here: see ``autograd.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.triton_utils import autotune, cdiv, device_guard

_CONFIGS = [
    triton.Config({"BLOCK_SIZE": 1024}, num_warps=4),
    triton.Config({"BLOCK_SIZE": 2048}, num_warps=8),
    triton.Config({"BLOCK_SIZE": 4096}, num_warps=8),
]


@autotune(_CONFIGS, key=["n_elements"])
@triton.jit
def _swiglu_fwd_kernel(a_ptr, b_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    out = a * tl.sigmoid(a) * b
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@autotune(_CONFIGS, key=["n_elements"])
@triton.jit
def _swiglu_bwd_kernel(
    a_ptr, b_ptr, grad_ptr, grad_a_ptr, grad_b_ptr, n_elements, BLOCK_SIZE: tl.constexpr
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    grad = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    # d/da [a * sigmoid(a)] = sigmoid(a) * (1 + a * (1 - sigmoid(a)))
    grad_a = grad * b * sig * (1.0 + a * (1.0 - sig))
    grad_b = grad * a * sig
    tl.store(grad_a_ptr + offsets, grad_a.to(grad_a_ptr.dtype.element_ty), mask=mask)
    tl.store(grad_b_ptr + offsets, grad_b.to(grad_b_ptr.dtype.element_ty), mask=mask)


def _grid(n_elements: int):
    return lambda meta: (cdiv(n_elements, meta["BLOCK_SIZE"]),)


def swiglu_fwd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` for contiguous ``a``, ``b`` of one shape and dtype."""
    out = torch.empty_like(a)
    n_elements = a.numel()
    if n_elements:
        with device_guard(a):
            _swiglu_fwd_kernel[_grid(n_elements)](a, b, out, n_elements)
    return out


def swiglu_bwd(
    a: torch.Tensor, b: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``silu(a) * b`` with respect to ``a`` and ``b`` given the output gradient."""
    grad_a = torch.empty_like(a)
    grad_b = torch.empty_like(b)
    n_elements = a.numel()
    if n_elements:
        with device_guard(a):
            _swiglu_bwd_kernel[_grid(n_elements)](a, b, grad, grad_a, grad_b, n_elements)
    return grad_a, grad_b
