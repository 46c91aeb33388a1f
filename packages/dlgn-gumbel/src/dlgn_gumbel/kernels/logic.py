"""Triton kernels for the affine logic layer ``y = c0 + c1·a + c2·b + c3·ab`` and its gradients.

``x`` is ``(B, in_dim)`` row-major float32; neuron ``n`` reads columns ``idx_a[n]``, ``idx_b[n]``.
The forward kernel tiles (batch, neuron); the backward kernel gives each program a block of
neurons, loops over the batch, reduces the 4 coefficient gradients in registers (deterministic)
and scatters the input gradients with atomic adds. No autograd here: see ``autograd.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.triton_utils import cdiv, device_guard

BLOCK_B = 32
BLOCK_N = 64


@triton.jit
def _load_inputs(x_ptr, ia, ib, offs_b, mask, in_dim):
    rows = offs_b.to(tl.int64)[:, None] * in_dim
    a = tl.load(x_ptr + rows + ia[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + rows + ib[None, :], mask=mask, other=0.0).to(tl.float32)
    return a, b


@triton.jit
def _logic_fwd_kernel(
    x_ptr,
    ia_ptr,
    ib_ptr,
    c_ptr,
    y_ptr,
    batch,
    in_dim,
    n_out,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    offs_b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_out
    mask = (offs_b < batch)[:, None] & mask_n[None, :]
    ia = tl.load(ia_ptr + offs_n, mask=mask_n, other=0)
    ib = tl.load(ib_ptr + offs_n, mask=mask_n, other=0)
    c0 = tl.load(c_ptr + offs_n * 4 + 0, mask=mask_n, other=0.0)[None, :]
    c1 = tl.load(c_ptr + offs_n * 4 + 1, mask=mask_n, other=0.0)[None, :]
    c2 = tl.load(c_ptr + offs_n * 4 + 2, mask=mask_n, other=0.0)[None, :]
    c3 = tl.load(c_ptr + offs_n * 4 + 3, mask=mask_n, other=0.0)[None, :]
    a, b = _load_inputs(x_ptr, ia, ib, offs_b, mask, in_dim)
    y = c0 + c2 * b + a * (c1 + c3 * b)
    out = offs_b.to(tl.int64)[:, None] * n_out + offs_n[None, :]
    tl.store(y_ptr + out, y, mask=mask)


@triton.jit
def _logic_bwd_kernel(
    x_ptr,
    ia_ptr,
    ib_ptr,
    c_ptr,
    g_ptr,
    gx_ptr,
    gc_ptr,
    batch,
    in_dim,
    n_out,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_out
    ia = tl.load(ia_ptr + offs_n, mask=mask_n, other=0)
    ib = tl.load(ib_ptr + offs_n, mask=mask_n, other=0)
    c1 = tl.load(c_ptr + offs_n * 4 + 1, mask=mask_n, other=0.0)[None, :]
    c2 = tl.load(c_ptr + offs_n * 4 + 2, mask=mask_n, other=0.0)[None, :]
    c3 = tl.load(c_ptr + offs_n * 4 + 3, mask=mask_n, other=0.0)[None, :]
    acc0 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, batch, BLOCK_B):
        offs_b = start + tl.arange(0, BLOCK_B)
        mask = (offs_b < batch)[:, None] & mask_n[None, :]
        a, b = _load_inputs(x_ptr, ia, ib, offs_b, mask, in_dim)
        g_rows = offs_b.to(tl.int64)[:, None] * n_out + offs_n[None, :]
        g = tl.load(g_ptr + g_rows, mask=mask, other=0.0).to(tl.float32)
        ga = g * a
        acc0 += tl.sum(g, axis=0)
        acc1 += tl.sum(ga, axis=0)
        acc2 += tl.sum(g * b, axis=0)
        acc3 += tl.sum(ga * b, axis=0)
        rows = offs_b.to(tl.int64)[:, None] * in_dim
        tl.atomic_add(gx_ptr + rows + ia[None, :], g * (c1 + c3 * b), mask=mask)
        tl.atomic_add(gx_ptr + rows + ib[None, :], g * (c2 + c3 * a), mask=mask)
    tl.store(gc_ptr + offs_n * 4 + 0, acc0, mask=mask_n)
    tl.store(gc_ptr + offs_n * 4 + 1, acc1, mask=mask_n)
    tl.store(gc_ptr + offs_n * 4 + 2, acc2, mask=mask_n)
    tl.store(gc_ptr + offs_n * 4 + 3, acc3, mask=mask_n)


def logic_fwd(
    x: torch.Tensor, idx_a: torch.Tensor, idx_b: torch.Tensor, coeffs: torch.Tensor
) -> torch.Tensor:
    """Forward of the affine logic layer for contiguous float32 ``x (B, in)``, ``coeffs (N, 4)``."""
    batch, in_dim = x.shape
    n_out = idx_a.shape[0]
    y = torch.empty((batch, n_out), device=x.device, dtype=torch.float32)
    if batch and n_out:
        grid = (cdiv(batch, BLOCK_B), cdiv(n_out, BLOCK_N))
        with device_guard(x):
            _logic_fwd_kernel[grid](
                x, idx_a, idx_b, coeffs, y, batch, in_dim, n_out, BLOCK_B=BLOCK_B, BLOCK_N=BLOCK_N
            )
    return y


def logic_bwd(
    x: torch.Tensor,
    idx_a: torch.Tensor,
    idx_b: torch.Tensor,
    coeffs: torch.Tensor,
    grad: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients for ``x (B, in)`` and ``coeffs (N, 4)`` given the output gradient ``(B, N)``."""
    batch, in_dim = x.shape
    n_out = idx_a.shape[0]
    grad_x = torch.zeros((batch, in_dim), device=x.device, dtype=torch.float32)
    grad_c = torch.empty((n_out, 4), device=x.device, dtype=torch.float32)
    if n_out:
        with device_guard(x):
            _logic_bwd_kernel[(cdiv(n_out, BLOCK_N),)](
                x,
                idx_a,
                idx_b,
                coeffs,
                grad,
                grad_x,
                grad_c,
                batch,
                in_dim,
                n_out,
                BLOCK_B=BLOCK_B,
                BLOCK_N=BLOCK_N,
            )
    return grad_x, grad_c
