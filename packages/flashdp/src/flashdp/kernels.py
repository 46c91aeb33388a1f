"""Triton kernels of the per-example clipping of a linear layer's weight, with launch wrappers.

``x: (B, T, D_in)`` and ``grad_output: (B, T, D_out)`` of one float dtype, any strides; the
per-example gradient of the weight is P_b = G_bᵀX_b. Every product runs in ``tl.dot`` with an
fp32 accumulator: 16-bit inputs on tensor cores, fp32 inputs in IEEE fp32 (so the CPU
interpreter and fp32 GPUs match the reference to fp32 rounding). No autograd here.

One GEMM per layer (per-layer clipping, ``store``):

* :func:`_store_kernel` (kernel A): one program per (example of a chunk, D_out tile, D_in tile)
  computes its tile of P_b, writes it to an fp32 workspace and its squared sum to a per-tile
  partial norm (no atomics: deterministic), and, in the programs of the first D_in tile, the
  example's bias gradient Σ_t G_bt.
* :func:`_weighted_sum_kernel` (kernel B): one program per (D_out tile, D_in tile) adds
  Σ_b c_b P_b over the chunk to the persistent fp32 sum, so what is released is exactly the
  clipped gradients whose norms were measured.

Two GEMMs (flat clipping, or a workspace too small for one example, ``recompute``):

* :func:`_norm2_kernel`: each tile of P_b is computed over T in registers, squared, summed and
  atomically added to the example's norm²: per-example gradients never leave registers.
* :func:`_clipped_sum_kernel`: Σ_b c_b P_b, with P_b accumulated per example and scaled by its
  fp32 coefficient before it joins the sum (the 16-bit inputs are never rescaled).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.backend import interpreter_enabled
from kernels_common.triton_utils import autotune, cdiv, device_guard

_CONFIGS = [
    triton.Config({"BLOCK_O": 32, "BLOCK_I": 32, "BLOCK_T": 16}, num_warps=4),
    triton.Config({"BLOCK_O": 64, "BLOCK_I": 64, "BLOCK_T": 32}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_O": 128, "BLOCK_I": 64, "BLOCK_T": 32}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_O": 128, "BLOCK_I": 128, "BLOCK_T": 32}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_O": 64, "BLOCK_I": 128, "BLOCK_T": 64}, num_warps=4, num_stages=4),
]
# the clipped sum holds two fp32 tiles (one example's and the running sum): with the 64×128 tile,
# 64-step loads and 4 stages at 4 warps it spilled registers at GPT-2's block layers (the tiles
# alone take 2·64·128/128 = 128 registers per thread); at 8 warps it does not (test_compile_sm90)
_CLIPPED_SUM_CONFIGS = [
    *_CONFIGS[:-1],
    triton.Config(_CONFIGS[-1].kwargs, num_warps=8, num_stages=4),
]
_SUM_CONFIGS = [
    triton.Config({"BLOCK_O": 32, "BLOCK_I": 32}, num_warps=4),
    triton.Config({"BLOCK_O": 64, "BLOCK_I": 64}, num_warps=4),
    triton.Config({"BLOCK_O": 64, "BLOCK_I": 128}, num_warps=8),
]


@triton.jit
def _example_tile(
    x_ptr,
    g_ptr,
    b,
    offs_o,
    offs_i,
    T,
    D_OUT,
    D_IN,
    stride_xb,
    stride_xt,
    stride_xd,
    stride_gb,
    stride_gt,
    stride_gd,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_T: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    WITH_BIAS: tl.constexpr,
):
    """The (BLOCK_O, BLOCK_I) tile of G_bᵀX_b in fp32 and, with ``WITH_BIAS``, Σ_t G_bt over
    the tile's outputs (else zeros)."""
    acc = tl.zeros((BLOCK_O, BLOCK_I), dtype=tl.float32)
    bias = tl.zeros((BLOCK_O,), dtype=tl.float32)
    for t0 in range(0, T, BLOCK_T):
        offs_t = (t0 + tl.arange(0, BLOCK_T)).to(tl.int64)  # T·stride may pass 2³¹
        g = tl.load(
            g_ptr + b * stride_gb + offs_t[:, None] * stride_gt + offs_o[None, :] * stride_gd,
            mask=(offs_t[:, None] < T) & (offs_o[None, :] < D_OUT),
            other=0.0,
        )
        x = tl.load(
            x_ptr + b * stride_xb + offs_t[:, None] * stride_xt + offs_i[None, :] * stride_xd,
            mask=(offs_t[:, None] < T) & (offs_i[None, :] < D_IN),
            other=0.0,
        )
        if IEEE:
            acc += tl.dot(tl.trans(g), x, input_precision="ieee")
        elif UPCAST:  # the interpreter's dot has no 16-bit path; 16-bit products are exact in fp32
            acc += tl.dot(tl.trans(g.to(tl.float32)), x.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(tl.trans(g), x)
        if WITH_BIAS:
            bias += tl.sum(g.to(tl.float32), axis=0)
    return acc, bias


@autotune(_CONFIGS, key=["T", "D_OUT", "D_IN", "IEEE"], reset_to_zero=["norm2_ptr"])
@triton.jit
def _norm2_kernel(
    x_ptr,
    g_ptr,
    norm2_ptr,
    T,
    D_OUT,
    D_IN,
    stride_xb,
    stride_xt,
    stride_xd,
    stride_gb,
    stride_gt,
    stride_gd,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs_o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_i = tl.program_id(2) * BLOCK_I + tl.arange(0, BLOCK_I)
    acc, _ = _example_tile(
        x_ptr, g_ptr, b, offs_o, offs_i, T, D_OUT, D_IN,
        stride_xb, stride_xt, stride_xd, stride_gb, stride_gt, stride_gd,
        BLOCK_O, BLOCK_I, BLOCK_T, IEEE, UPCAST, False,
    )  # fmt: skip
    tl.atomic_add(norm2_ptr + b, tl.sum(acc * acc))


@autotune(_CLIPPED_SUM_CONFIGS, key=["T", "D_OUT", "D_IN", "IEEE"])  # not B: Poisson batches vary
@triton.jit
def _clipped_sum_kernel(
    x_ptr,
    g_ptr,
    coef_ptr,
    out_ptr,
    B,
    T,
    D_OUT,
    D_IN,
    stride_xb,
    stride_xt,
    stride_xd,
    stride_gb,
    stride_gt,
    stride_gd,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    offs_o = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    acc = tl.zeros((BLOCK_O, BLOCK_I), dtype=tl.float32)
    for b in range(B):
        tile, _ = _example_tile(
            x_ptr, g_ptr, tl.cast(b, tl.int64), offs_o, offs_i, T, D_OUT, D_IN,
            stride_xb, stride_xt, stride_xd, stride_gb, stride_gt, stride_gd,
            BLOCK_O, BLOCK_I, BLOCK_T, IEEE, UPCAST, False,
        )  # fmt: skip
        acc += tl.load(coef_ptr + b) * tile
    tl.store(
        out_ptr + offs_o.to(tl.int64)[:, None] * D_IN + offs_i[None, :],
        acc,
        mask=(offs_o[:, None] < D_OUT) & (offs_i[None, :] < D_IN),
    )


@autotune(_CONFIGS, key=["T", "D_OUT", "D_IN", "IEEE", "WITH_BIAS"], reset_to_zero=["partial_ptr"])
@triton.jit
def _store_kernel(
    x_ptr,
    g_ptr,
    work_ptr,
    partial_ptr,
    bias_ptr,
    first,
    partial_stride,
    T,
    D_OUT,
    D_IN,
    stride_xb,
    stride_xt,
    stride_xd,
    stride_gb,
    stride_gt,
    stride_gd,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    WITH_BIAS: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    j = tl.program_id(0).to(tl.int64)  # example first + j, slot j of the workspace
    tile_o, tile_i = tl.program_id(1), tl.program_id(2)
    offs_o = tile_o * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_i = tile_i * BLOCK_I + tl.arange(0, BLOCK_I)
    acc, bias = _example_tile(
        x_ptr, g_ptr, first + j, offs_o, offs_i, T, D_OUT, D_IN,
        stride_xb, stride_xt, stride_xd, stride_gb, stride_gt, stride_gd,
        BLOCK_O, BLOCK_I, BLOCK_T, IEEE, UPCAST, WITH_BIAS,
    )  # fmt: skip
    inside = (offs_o[:, None] < D_OUT) & (offs_i[None, :] < D_IN)
    tile = offs_o.to(tl.int64)[:, None] * D_IN + offs_i[None, :]
    tl.store(work_ptr + j * D_OUT * D_IN + tile, acc, mask=inside)
    # row j of the partial norms holds this config's tiles; its stride is the allocation's
    tl.store(
        partial_ptr + j * partial_stride + tile_o * tl.num_programs(2) + tile_i,
        tl.sum(acc * acc),
    )
    if WITH_BIAS:
        tl.store(bias_ptr + j * D_OUT + offs_o, bias, mask=(offs_o < D_OUT) & (tile_i == 0))


# each timing run of the autotuner adds to the sum: restore it between them
@autotune(_SUM_CONFIGS, key=["D_OUT", "D_IN"], restore_value=["out_ptr"])
@triton.jit
def _weighted_sum_kernel(
    work_ptr,
    coef_ptr,
    out_ptr,
    CHUNK,
    D_OUT,
    D_IN,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
):
    offs_o = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    inside = (offs_o[:, None] < D_OUT) & (offs_i[None, :] < D_IN)
    tile = offs_o.to(tl.int64)[:, None] * D_IN + offs_i[None, :]
    acc = tl.load(out_ptr + tile, mask=inside, other=0.0)
    for j in range(CHUNK):
        work = tl.load(
            work_ptr + tl.cast(j, tl.int64) * D_OUT * D_IN + tile, mask=inside, other=0.0
        )
        acc += tl.load(coef_ptr + j) * work
    tl.store(out_ptr + tile, acc, mask=inside)


def _max_tiles(d_out: int, d_in: int) -> int:
    """Output tiles of a D_out × D_in weight under the config with the smallest tiles."""
    return max(cdiv(d_out, c.kwargs["BLOCK_O"]) * cdiv(d_in, c.kwargs["BLOCK_I"]) for c in _CONFIGS)


def _common(x: torch.Tensor, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both operands in one float dtype. Under autocast the output gradient has the dtype the
    forward's matmul ran in (16-bit) while the saved input may be fp32: the input is cast to
    it, as that matmul did (and as autograd's own weight gradient does)."""
    if x.dtype == grad_output.dtype:
        return x, grad_output
    if grad_output.dtype in (torch.float16, torch.bfloat16):
        return x.to(grad_output.dtype), grad_output
    dtype = torch.promote_types(x.dtype, grad_output.dtype)
    return x.to(dtype), grad_output.to(dtype)


def _precision(x: torch.Tensor) -> dict[str, bool]:
    """fp32 operands: IEEE fp32 dots; 16-bit: tensor cores (upcast under the interpreter)."""
    ieee = x.dtype == torch.float32
    return {"IEEE": ieee, "UPCAST": not ieee and interpreter_enabled()}


def _strides(x: torch.Tensor, grad_output: torch.Tensor) -> tuple[int, ...]:
    return (*x.stride(), *grad_output.stride())


def linear_weight_norm2_triton(x: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """‖G_bᵀX_b‖²_F per example: ``(B,)`` float32."""
    x, grad_output = _common(x, grad_output)
    batch, tokens, d_in = x.shape
    d_out = grad_output.shape[-1]
    norm2 = torch.zeros(batch, device=x.device, dtype=torch.float32)
    if batch and tokens:

        def grid(meta):
            return (batch, cdiv(d_out, meta["BLOCK_O"]), cdiv(d_in, meta["BLOCK_I"]))

        with device_guard(x):
            _norm2_kernel[grid](
                x, grad_output, norm2, tokens, d_out, d_in, *_strides(x, grad_output),
                **_precision(x),
            )  # fmt: skip
    return norm2


def linear_weight_clipped_sum_triton(
    x: torch.Tensor, grad_output: torch.Tensor, coef: torch.Tensor
) -> torch.Tensor:
    """Σ_b c_b G_bᵀX_b: ``(D_out, D_in)`` float32, for float32 coefficients ``coef: (B,)``."""
    x, grad_output = _common(x, grad_output)
    coef = coef.float().contiguous()
    batch, tokens, d_in = x.shape
    d_out = grad_output.shape[-1]
    out = torch.empty(d_out, d_in, device=x.device, dtype=torch.float32)

    def grid(meta):
        return (cdiv(d_out, meta["BLOCK_O"]), cdiv(d_in, meta["BLOCK_I"]))

    with device_guard(x):
        _clipped_sum_kernel[grid](
            x, grad_output, coef, out, batch, tokens, d_out, d_in, *_strides(x, grad_output),
            **_precision(x),
        )  # fmt: skip
    return out


def linear_weight_store_clip_triton(
    x: torch.Tensor,
    grad_output: torch.Tensor,
    coefficients,
    chunk: int,
    with_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-layer clipping of a linear weight in one GEMM: see
    :func:`flashdp.reference.linear_weight_store_clip` for the contract."""
    x, grad_output = _common(x, grad_output)
    batch, tokens, d_in = x.shape
    d_out = grad_output.shape[-1]
    device = x.device
    out = torch.zeros(d_out, d_in, device=device, dtype=torch.float32)
    norm2 = torch.zeros(batch, device=device, dtype=torch.float32)
    bias = torch.zeros(batch, d_out, device=device, dtype=torch.float32) if with_bias else None
    if not batch:
        return norm2, out, bias
    width = min(chunk, batch)
    work = torch.empty(width, d_out, d_in, device=device, dtype=torch.float32)
    strides = _strides(x, grad_output)
    with device_guard(x):
        for first in range(0, batch, width):
            size = min(width, batch - first)
            # one partial norm per output tile, room for the smallest tiles of any config
            partial = torch.zeros(size, _max_tiles(d_out, d_in), device=device)
            bias_chunk = bias[first : first + size] if with_bias else norm2

            def grid(meta, size=size):
                return (size, cdiv(d_out, meta["BLOCK_O"]), cdiv(d_in, meta["BLOCK_I"]))

            _store_kernel[grid](
                x, grad_output, work, partial, bias_chunk, first, partial.stride(0), tokens, d_out,
                d_in, *strides,
                **_precision(x), WITH_BIAS=with_bias,
            )  # fmt: skip
            chunk_norm2 = partial.sum(1)
            norm2[first : first + size] = chunk_norm2
            coef = coefficients(chunk_norm2).float().contiguous()

            def sum_grid(meta):
                return (cdiv(d_out, meta["BLOCK_O"]), cdiv(d_in, meta["BLOCK_I"]))

            _weighted_sum_kernel[sum_grid](work, coef, out, size, d_out, d_in)
    return norm2, out, bias
