"""Triton kernels for the affine logic layer ``y = c0 + c1·a + c2·b + c3·ab`` and its gradients.

Activations are feature-major: ``x`` is ``(in_dim, B)`` row-major float32 and neuron ``n`` reads
rows ``idx_a[n]``, ``idx_b[n]`` (loads along the batch are contiguous). The forward kernel tiles
(neuron, batch); the backward kernel gives each program a block of neurons, loops over the batch,
reduces the 4 coefficient gradients in registers (deterministic) and scatters the input gradients
with atomic adds. With per-example coefficients (``(N, 4, B)``, ``PER_EXAMPLE``) each output
element has its own four coefficients and their gradients are stored, not reduced. No autograd
here: see ``autograd.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.triton_utils import cdiv, device_guard

BLOCK_N = 32
BLOCK_B = 64


@triton.jit
def _load_coeff(c_ptr, offs_n, mask_n, k: tl.constexpr):
    return tl.load(c_ptr + offs_n * 4 + k, mask=mask_n, other=0.0)[:, None]


@triton.jit
def _load_coeff_tile(c_ptr, tile, mask, batch, k: tl.constexpr):
    """Coefficient ``k`` of a (neuron, example) tile of per-example ``(N, 4, B)`` coefficients;
    ``tile`` holds ``n·4·B + b``."""
    return tl.load(c_ptr + tile + k * batch, mask=mask, other=0.0)


@triton.jit
def _logic_fwd_kernel(
    x_ptr, ia_ptr, ib_ptr, c_ptr, y_ptr, batch, n_out,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, PER_EXAMPLE: tl.constexpr,
):  # fmt: skip
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    mask_n = offs_n < n_out
    mask = mask_n[:, None] & (offs_b < batch)[None, :]
    ia = tl.load(ia_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
    ib = tl.load(ib_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
    a = tl.load(x_ptr + ia[:, None] * batch + offs_b[None, :], mask=mask, other=0.0)
    b = tl.load(x_ptr + ib[:, None] * batch + offs_b[None, :], mask=mask, other=0.0)
    if PER_EXAMPLE:
        tile = offs_n.to(tl.int64)[:, None] * (4 * batch) + offs_b[None, :]
        c0 = _load_coeff_tile(c_ptr, tile, mask, batch, 0)
        c1 = _load_coeff_tile(c_ptr, tile, mask, batch, 1)
        c2 = _load_coeff_tile(c_ptr, tile, mask, batch, 2)
        c3 = _load_coeff_tile(c_ptr, tile, mask, batch, 3)
    else:
        c0 = _load_coeff(c_ptr, offs_n, mask_n, 0)
        c1 = _load_coeff(c_ptr, offs_n, mask_n, 1)
        c2 = _load_coeff(c_ptr, offs_n, mask_n, 2)
        c3 = _load_coeff(c_ptr, offs_n, mask_n, 3)
    y = c0 + c2 * b + a * (c1 + c3 * b)
    rows = offs_n.to(tl.int64)[:, None] * batch
    tl.store(y_ptr + rows + offs_b[None, :], y, mask=mask)


@triton.jit
def _logic_bwd_kernel(
    x_ptr, ia_ptr, ib_ptr, c_ptr, g_ptr, gx_ptr, gc_ptr, batch, n_out,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, PER_EXAMPLE: tl.constexpr,
):  # fmt: skip
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_out
    ia = tl.load(ia_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
    ib = tl.load(ib_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
    c1 = _load_coeff(c_ptr, offs_n, mask_n, 1)
    c2 = _load_coeff(c_ptr, offs_n, mask_n, 2)
    c3 = _load_coeff(c_ptr, offs_n, mask_n, 3)
    rows = offs_n.to(tl.int64)[:, None] * batch
    acc0 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, batch, BLOCK_B):
        offs_b = start + tl.arange(0, BLOCK_B)
        mask = mask_n[:, None] & (offs_b < batch)[None, :]
        pa = ia[:, None] * batch + offs_b[None, :]
        pb = ib[:, None] * batch + offs_b[None, :]
        a = tl.load(x_ptr + pa, mask=mask, other=0.0)
        b = tl.load(x_ptr + pb, mask=mask, other=0.0)
        g = tl.load(g_ptr + rows + offs_b[None, :], mask=mask, other=0.0)
        ga = g * a
        if PER_EXAMPLE:
            tile = offs_n.to(tl.int64)[:, None] * (4 * batch) + offs_b[None, :]
            e1 = _load_coeff_tile(c_ptr, tile, mask, batch, 1)
            e2 = _load_coeff_tile(c_ptr, tile, mask, batch, 2)
            e3 = _load_coeff_tile(c_ptr, tile, mask, batch, 3)
            tl.store(gc_ptr + tile, g, mask=mask)
            tl.store(gc_ptr + tile + batch, ga, mask=mask)
            tl.store(gc_ptr + tile + 2 * batch, g * b, mask=mask)
            tl.store(gc_ptr + tile + 3 * batch, ga * b, mask=mask)
            tl.atomic_add(gx_ptr + pa, g * (e1 + e3 * b), mask=mask)
            tl.atomic_add(gx_ptr + pb, g * (e2 + e3 * a), mask=mask)
        else:
            acc0 += tl.sum(g, axis=1)
            acc1 += tl.sum(ga, axis=1)
            acc2 += tl.sum(g * b, axis=1)
            acc3 += tl.sum(ga * b, axis=1)
            tl.atomic_add(gx_ptr + pa, g * (c1 + c3 * b), mask=mask)
            tl.atomic_add(gx_ptr + pb, g * (c2 + c3 * a), mask=mask)
    if not PER_EXAMPLE:
        tl.store(gc_ptr + offs_n * 4 + 0, acc0, mask=mask_n)
        tl.store(gc_ptr + offs_n * 4 + 1, acc1, mask=mask_n)
        tl.store(gc_ptr + offs_n * 4 + 2, acc2, mask=mask_n)
        tl.store(gc_ptr + offs_n * 4 + 3, acc3, mask=mask_n)


def logic_fwd(
    x: torch.Tensor, idx_a: torch.Tensor, idx_b: torch.Tensor, coeffs: torch.Tensor
) -> torch.Tensor:
    """Forward for contiguous float32 ``x (in_dim, B)`` and ``coeffs (N, 4)`` or
    ``(N, 4, B)``: ``(N, B)``."""
    batch = x.shape[1]
    n_out = idx_a.shape[0]
    y = torch.empty((n_out, batch), device=x.device, dtype=torch.float32)
    if batch and n_out:
        grid = (cdiv(n_out, BLOCK_N), cdiv(batch, BLOCK_B))
        with device_guard(x):
            _logic_fwd_kernel[grid](
                x, idx_a, idx_b, coeffs, y, batch, n_out,
                BLOCK_N=BLOCK_N, BLOCK_B=BLOCK_B, PER_EXAMPLE=coeffs.dim() == 3,
            )  # fmt: skip
    return y


def logic_bwd(
    x: torch.Tensor,
    idx_a: torch.Tensor,
    idx_b: torch.Tensor,
    coeffs: torch.Tensor,
    grad: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients for ``x (in_dim, B)`` and ``coeffs`` (``(N, 4)`` or ``(N, 4, B)``, as given)
    from the output gradient ``(N, B)``."""
    batch = x.shape[1]
    n_out = idx_a.shape[0]
    grad_x = torch.zeros_like(x, dtype=torch.float32)
    # shared coefficients: every row is stored; per example: an empty batch stores nothing
    alloc = torch.zeros if coeffs.dim() == 3 else torch.empty
    grad_c = alloc(coeffs.shape, device=x.device, dtype=torch.float32)
    if n_out:
        with device_guard(x):
            _logic_bwd_kernel[(cdiv(n_out, BLOCK_N),)](
                x, idx_a, idx_b, coeffs, grad, grad_x, grad_c, batch, n_out,
                BLOCK_N=BLOCK_N, BLOCK_B=BLOCK_B, PER_EXAMPLE=coeffs.dim() == 3,
            )  # fmt: skip
    return grad_x, grad_c
