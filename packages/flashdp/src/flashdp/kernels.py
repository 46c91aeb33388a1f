"""Triton kernels of the fused per-example clipping of a linear layer, with launch wrappers.

``x: (B, T, D_in)``, ``grad_output: (B, T, D_out)``, contiguous float32. No autograd here.

* :func:`linear_weight_norm2_triton`: one program per (example, D_out tile, D_in tile) computes
  the tile of G_bᵀX_b over the sequence in an fp32 register accumulator, squares and sums it, and
  atomically adds the result into the example's norm²: per-example gradients never leave
  registers.
* :func:`linear_weight_clipped_sum_triton`: one program per (D_out tile, D_in tile) accumulates
  Σ_{b,t} c_b G_bt ⊗ X_bt, scaling each loaded row of G by its example's coefficient.

The paper fuses both into one pass with a grid-wide barrier between them; a barrier cannot run
on Triton's sequential CPU interpreter, so the two passes are separate launches here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.triton_utils import autotune, cdiv, device_guard

_CONFIGS = [
    triton.Config({"BLOCK_O": 32, "BLOCK_I": 32, "BLOCK_T": 16}, num_warps=4),
    triton.Config({"BLOCK_O": 64, "BLOCK_I": 64, "BLOCK_T": 32}, num_warps=4),
    triton.Config({"BLOCK_O": 128, "BLOCK_I": 64, "BLOCK_T": 32}, num_warps=8),
]


@autotune(_CONFIGS, key=["T", "D_OUT", "D_IN"], reset_to_zero=["norm2_ptr"])
@triton.jit
def _norm2_kernel(
    x_ptr,
    g_ptr,
    norm2_ptr,
    T,
    D_OUT,
    D_IN,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs_o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_i = tl.program_id(2) * BLOCK_I + tl.arange(0, BLOCK_I)
    acc = tl.zeros((BLOCK_O, BLOCK_I), dtype=tl.float32)
    for t0 in range(0, T, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        rows = b * T + offs_t
        g = tl.load(
            g_ptr + rows[:, None] * D_OUT + offs_o[None, :],
            mask=(offs_t[:, None] < T) & (offs_o[None, :] < D_OUT),
            other=0.0,
        )
        x = tl.load(
            x_ptr + rows[:, None] * D_IN + offs_i[None, :],
            mask=(offs_t[:, None] < T) & (offs_i[None, :] < D_IN),
            other=0.0,
        )
        acc += tl.dot(tl.trans(g), x, input_precision="ieee")
    tl.atomic_add(norm2_ptr + b, tl.sum(acc * acc))


@autotune(_CONFIGS, key=["ROWS", "D_OUT", "D_IN"])
@triton.jit
def _clipped_sum_kernel(
    x_ptr,
    g_ptr,
    coef_ptr,
    out_ptr,
    ROWS,
    T,
    D_OUT,
    D_IN,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    offs_o = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    acc = tl.zeros((BLOCK_O, BLOCK_I), dtype=tl.float32)
    for r0 in range(0, ROWS, BLOCK_T):
        rows = (r0 + tl.arange(0, BLOCK_T)).to(tl.int64)
        valid = rows < ROWS
        coef = tl.load(coef_ptr + rows // T, mask=valid, other=0.0)
        g = tl.load(
            g_ptr + rows[:, None] * D_OUT + offs_o[None, :],
            mask=valid[:, None] & (offs_o[None, :] < D_OUT),
            other=0.0,
        )
        x = tl.load(
            x_ptr + rows[:, None] * D_IN + offs_i[None, :],
            mask=valid[:, None] & (offs_i[None, :] < D_IN),
            other=0.0,
        )
        acc += tl.dot(tl.trans(g * coef[:, None]), x, input_precision="ieee")
    tl.store(
        out_ptr + offs_o[:, None] * D_IN + offs_i[None, :],
        acc,
        mask=(offs_o[:, None] < D_OUT) & (offs_i[None, :] < D_IN),
    )


def linear_weight_norm2_triton(x: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """‖G_bᵀX_b‖²_F per example: ``(B,)`` float32."""
    x, grad_output = x.contiguous(), grad_output.contiguous()
    batch, tokens, d_in = x.shape
    d_out = grad_output.shape[-1]
    norm2 = torch.zeros(batch, device=x.device, dtype=torch.float32)
    if batch and tokens:

        def grid(meta):
            return (batch, cdiv(d_out, meta["BLOCK_O"]), cdiv(d_in, meta["BLOCK_I"]))

        with device_guard(x):
            _norm2_kernel[grid](x, grad_output, norm2, tokens, d_out, d_in)
    return norm2


def linear_weight_clipped_sum_triton(
    x: torch.Tensor, grad_output: torch.Tensor, coef: torch.Tensor
) -> torch.Tensor:
    """Σ_b c_b G_bᵀX_b: ``(D_out, D_in)`` float32."""
    x, grad_output, coef = x.contiguous(), grad_output.contiguous(), coef.contiguous()
    batch, tokens, d_in = x.shape
    d_out = grad_output.shape[-1]
    out = torch.empty(d_out, d_in, device=x.device, dtype=torch.float32)

    def grid(meta):
        return (cdiv(d_out, meta["BLOCK_O"]), cdiv(d_in, meta["BLOCK_I"]))

    with device_guard(x):
        _clipped_sum_kernel[grid](x, grad_output, coef, out, batch * tokens, tokens, d_out, d_in)
    return out
