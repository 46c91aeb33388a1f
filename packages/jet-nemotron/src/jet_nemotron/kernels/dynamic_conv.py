"""Dynamic causal convolution kernels: forward, backward and the fused decode step.

Every token ``t`` has its own depthwise causal kernel ``K_t (D, W)``:
``y_t[d] = Σ_w x_{t-W+1+w}[d] · K_t[d, w]``, where positions before the sequence come from the
convolution state (its last ``W - 1`` columns; column ``j`` holds ``x_{j-W}``) or are zero.

All tensors are contiguous: x, y ``(B, T, D)``, kernels ``(B, T, D, W)``, states ``(B, D, W)``.
One program covers a ``(BLOCK_T, BLOCK_D)`` tile of one sequence and holds the ``W`` taps of
every element as a third axis of ``BLOCK_W = next_power_of_2(W)`` lanes. Loads take the
tensors' dtype; products and sums are computed in ``ACC`` (float32, or float64 for float64
inputs) and stored in the output's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.triton_utils import cdiv, device_guard, next_power_of_2, triton_dtype

# taps held by one program along (T, W); 64 keeps a float32 (BLOCK_T, BLOCK_D, BLOCK_W) tile at
# 32 registers a thread with four warps
TILE_TW = 64
MAX_BLOCK_D = 64


@triton.jit
def _load_btd(ptr, b, times, offs_d, T, D):
    """``ptr[b, times, d]`` of a ``(B, T, D)`` tensor, 0 outside ``[0, T) x [0, D)``; ``times``
    broadcasts against ``offs_d[None, :, None]``."""
    d = offs_d[None, :, None]
    mask = (times >= 0) & (times < T) & (d < D)
    return tl.load(ptr + (b * T + times) * D + d, mask=mask, other=0.0)


@triton.jit
def _load_taps(k_ptr, b, times, offs_d, offs_w, T, D, W: tl.constexpr):
    """``kernels[b, times, d, w]`` as a ``(.., BLOCK_D, BLOCK_W)`` tile, 0 where out of range."""
    d = offs_d[None, :, None]
    w = offs_w[None, None, :]
    mask = (times >= 0) & (times < T) & (d < D) & (w < W)
    return tl.load(k_ptr + ((b * T + times) * D + d) * W + w, mask=mask, other=0.0)


@triton.jit
def _windows(x_ptr, state_ptr, b, offs_t, offs_d, offs_w, T, D, W: tl.constexpr, HAS_STATE):
    """The inputs seen by each output: ``[i, j, w] = x_{t_i - W + 1 + w}[d_j]``, read from the
    state's column ``W + s`` for a position ``s < 0`` (0 without a state) and 0 for ``t_i >= T``."""
    src = offs_t[:, None, None] - W + 1 + offs_w[None, None, :]
    d = offs_d[None, :, None]
    live = (offs_t < T)[:, None, None] & (d < D) & (offs_w < W)[None, None, :]
    window = tl.load(x_ptr + (b * T + src) * D + d, mask=live & (src >= 0), other=0.0)
    if HAS_STATE:
        past = tl.load(state_ptr + (b * D + d) * W + W + src, mask=live & (src < 0), other=0.0)
        window += past
    return window


@triton.jit
def _input_gradient(dy_ptr, k_ptr, b, positions, offs_d, offs_w, T, D, W: tl.constexpr, ACC):
    """``Σ_w dy_u[d] · K_u[d, w]`` with ``u = s + W - 1 - w`` for every position ``s`` of
    ``positions`` (negative ones are state columns): a ``(len(positions), BLOCK_D)`` tile."""
    times = positions[:, None, None] + W - 1 - offs_w[None, None, :]
    dy = _load_btd(dy_ptr, b, times, offs_d, T, D).to(ACC)
    taps = _load_taps(k_ptr, b, times, offs_d, offs_w, T, D, W).to(ACC)
    return tl.sum(dy * taps, axis=2)


@triton.jit
def _dynamic_conv_fwd_kernel(
    x_ptr, k_ptr, state_ptr, y_ptr,
    T, D,
    W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_W: tl.constexpr,
    HAS_STATE: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """One program per (T block, D block, batch): ``y = Σ_w window · K``."""
    b = tl.program_id(2).to(tl.int64)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_w = tl.arange(0, BLOCK_W)
    window = _windows(x_ptr, state_ptr, b, offs_t, offs_d, offs_w, T, D, W, HAS_STATE)
    taps = _load_taps(k_ptr, b, offs_t[:, None, None], offs_d, offs_w, T, D, W)
    y = tl.sum(window.to(ACC) * taps.to(ACC), axis=2)
    mask = (offs_t < T)[:, None] & (offs_d < D)[None, :]
    y_ptrs = y_ptr + (b * T + offs_t[:, None]) * D + offs_d[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dynamic_conv_bwd_kernel(
    dy_ptr, x_ptr, k_ptr, state_ptr, dx_ptr, dk_ptr, dstate_ptr,
    T, D,
    W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_W: tl.constexpr,
    HAS_STATE: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """One program per (T block, D block, batch): ``dK_t = dy_t ⊗ window_t`` for the block's
    outputs and ``dx_s`` for the block's inputs (each input feeds the next ``W`` outputs); the
    first T block also writes the state's gradient (its column 0 feeds no output: 0)."""
    pid_t = tl.program_id(0)
    b = tl.program_id(2).to(tl.int64)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_w = tl.arange(0, BLOCK_W)
    d_live = offs_d < D

    dy = _load_btd(dy_ptr, b, offs_t[:, None, None], offs_d, T, D).to(ACC)
    window = _windows(x_ptr, state_ptr, b, offs_t, offs_d, offs_w, T, D, W, HAS_STATE)
    dk = dy * window.to(ACC)
    t3 = offs_t[:, None, None]
    d3 = offs_d[None, :, None]
    w3 = offs_w[None, None, :]
    dk_ptrs = dk_ptr + ((b * T + t3) * D + d3) * W + w3
    tl.store(dk_ptrs, dk.to(dk_ptr.dtype.element_ty), mask=(t3 < T) & (d3 < D) & (w3 < W))

    dx = _input_gradient(dy_ptr, k_ptr, b, offs_t, offs_d, offs_w, T, D, W, ACC)
    dx_ptrs = dx_ptr + (b * T + offs_t[:, None]) * D + offs_d[None, :]
    tl.store(dx_ptrs, dx.to(dx_ptr.dtype.element_ty), mask=(offs_t < T)[:, None] & d_live[None, :])

    if HAS_STATE and pid_t == 0:
        columns = tl.arange(0, BLOCK_W)
        ds = _input_gradient(dy_ptr, k_ptr, b, columns - W, offs_d, offs_w, T, D, W, ACC)
        ds_ptrs = dstate_ptr + (b * D + offs_d[None, :]) * W + columns[:, None]
        mask = (columns < W)[:, None] & d_live[None, :]
        tl.store(ds_ptrs, ds.to(dstate_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dynamic_conv_step_kernel(
    x_ptr, k_ptr, state_ptr, y_ptr, new_state_ptr,
    D,
    W: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_W: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """One program per (D block, batch): shift the state left, append ``x``, store it and
    ``y = Σ_w new_state · K``."""
    b = tl.program_id(1).to(tl.int64)
    offs_d = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_w = tl.arange(0, BLOCK_W)
    d_live = offs_d < D
    tile = (b * D + offs_d[:, None]) * W + offs_w[None, :]
    live = d_live[:, None] & (offs_w < W)[None, :]
    kept = tl.load(state_ptr + tile + 1, mask=live & (offs_w < W - 1)[None, :], other=0.0)
    x = tl.load(x_ptr + b * D + offs_d, mask=d_live, other=0.0)
    new_state = tl.where(offs_w[None, :] == W - 1, x[:, None], kept)
    tl.store(new_state_ptr + tile, new_state, mask=live)
    taps = tl.load(k_ptr + tile, mask=live, other=0.0)
    y = tl.sum(new_state.to(ACC) * taps.to(ACC), axis=1)
    tl.store(y_ptr + b * D + offs_d, y.to(y_ptr.dtype.element_ty), mask=d_live)


def _tiles(T: int, D: int, W: int) -> tuple[int, int, int]:
    """``(BLOCK_T, BLOCK_D, BLOCK_W)`` for a sequence of ``T`` steps and ``D`` channels."""
    block_w = next_power_of_2(W)
    block_t = min(TILE_TW // block_w, next_power_of_2(T))
    return block_t, min(MAX_BLOCK_D, next_power_of_2(D)), block_w


def _accumulator(dtype: torch.dtype):
    return triton_dtype(torch.float64 if dtype == torch.float64 else torch.float32)


def dynamic_conv_forward(
    x: torch.Tensor, kernels: torch.Tensor, conv_state: torch.Tensor | None
) -> torch.Tensor:
    """``y (B, T, D)`` in ``x``'s dtype from contiguous x ``(B, T, D)``, kernels
    ``(B, T, D, W)`` and an optional state ``(B, D, W)``, all of one dtype."""
    B, T, D, W = kernels.shape
    y = torch.empty_like(x)
    block_t, block_d, block_w = _tiles(T, D, W)
    grid = (cdiv(T, block_t), cdiv(D, block_d), B)
    with device_guard(x):
        _dynamic_conv_fwd_kernel[grid](
            x, kernels, x if conv_state is None else conv_state, y, T, D,
            W=W, BLOCK_T=block_t, BLOCK_D=block_d, BLOCK_W=block_w,
            HAS_STATE=conv_state is not None, ACC=_accumulator(x.dtype),
        )  # fmt: skip
    return y


def dynamic_conv_backward(
    dy: torch.Tensor, x: torch.Tensor, kernels: torch.Tensor, conv_state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients ``dx (B, T, D)``, ``dkernels (B, T, D, W)`` and ``dconv_state (B, D, W)``
    (``None`` without a state) of :func:`dynamic_conv_forward` for a contiguous ``dy``."""
    B, T, D, W = kernels.shape
    dx = torch.empty_like(x)
    dk = torch.empty_like(kernels)
    dstate = None if conv_state is None else torch.empty_like(conv_state)
    block_t, block_d, block_w = _tiles(T, D, W)
    grid = (cdiv(T, block_t), cdiv(D, block_d), B)
    with device_guard(x):
        _dynamic_conv_bwd_kernel[grid](
            dy, x, kernels, x if conv_state is None else conv_state,
            dx, dk, dx if dstate is None else dstate, T, D,
            W=W, BLOCK_T=block_t, BLOCK_D=block_d, BLOCK_W=block_w,
            HAS_STATE=conv_state is not None, ACC=_accumulator(x.dtype),
        )  # fmt: skip
    return dx, dk, dstate


def dynamic_conv_step(
    x: torch.Tensor, kernels: torch.Tensor, conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step from contiguous x ``(B, D)``, kernels and state ``(B, D, W)``: ``y (B, D)``
    and the new state ``(B, D, W)`` (a new tensor; ``conv_state`` is left as it was)."""
    B, D, W = kernels.shape
    y = torch.empty_like(x)
    new_state = torch.empty_like(conv_state)
    _, block_d, block_w = _tiles(1, D, W)
    with device_guard(x):
        _dynamic_conv_step_kernel[(cdiv(D, block_d), B)](
            x, kernels, conv_state, y, new_state, D,
            W=W, BLOCK_D=block_d, BLOCK_W=block_w, ACC=_accumulator(x.dtype),
        )  # fmt: skip
    return y, new_state
