"""Triton kernels of the fake quantizers (see ``multibit_quant.reference`` for the math), with
their launch wrappers. No autograd here: see ``multibit_quant.autograd``.

Weights: one program per output channel walks its row in ``BLOCK_K`` chunks, three times (four
with ``mean_var``): row statistics (max, mean, spread), the quantized values and their statistics
(and their variance), then the bias-corrected output; the statistics the backward needs are saved
per row. The backward recomputes the quantized values from the weight and applies the
straight-through, LSQ and bias-correction gradients in two passes over the row (LSQ) or three
(DoReFa), so the fake-quantized weight and its Jacobian never round-trip through memory.

Activations: elementwise over the flattened tensor with one step; the LSQ step gradient is
reduced per program and summed on the host side of the launch.

Rounding is half to even (``torch.round``) and the LSQ division is correctly rounded
(``div_rn``), so LSQ codes agree with the reference exactly. DoReFa's ``tanh`` is written here
(libdevice's is not available to the interpreter): an odd Taylor polynomial to ``x^19`` below
0.55 (truncation under 1e-8 relative), ``(1 − e)/(1 + e)`` with ``e = exp(−2|x|)`` above, a few
ulps from torch's; a DoReFa code can differ only where its argument lies within that of a
rounding boundary, and the peak's ties can differ where ``tanh`` is within an ulp of 1
(``6 < |w| < 9``; from ``|w| ≈ 9`` both give exactly 1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.triton_utils import cdiv, device_guard, next_power_of_2

DOREFA, LSQ = 0, 1
METHODS = {"dorefa": DOREFA, "lsq": LSQ}
CORRECTIONS = {None: 0, "mean": 1, "mean_var": 2}
STATS = 9  # per row: peak, scale, mean_w, std_w, mean_q, std_q, ratio, ties, spread_q
ACT_BLOCK = 1024


@triton.jit
def _round_half_even(x):
    r = tl.floor(x)
    f = x - r  # exact: r and x share a binade, or |x| < 1
    half = r * 0.5
    odd = half != tl.floor(half)
    return tl.where((f > 0.5) | ((f == 0.5) & odd), r + 1.0, r)


@triton.jit
def _tanh(x):
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    large = (1.0 - e) / (1.0 + e)
    z = a * a  # Taylor coefficients of tanh: 1, -1/3, 2/15, -17/315, 62/2835, ...
    p = -0.00023912911424355248  # -443861162/1856156927625 (the x^19 term)
    p = p * z + 0.0005900274409455859
    p = p * z - 0.0014558343870513183
    p = p * z + 0.0035921280365724810
    p = p * z - 0.0088632355299021966
    p = p * z + 0.0218694885361552029
    p = p * z - 0.0539682539682539683
    p = p * z + 0.1333333333333333333
    p = p * z - 0.3333333333333333333
    small = a + a * z * p
    t = tl.where(a < 0.55, small, large)
    return tl.where(x < 0, -t, t)


@triton.jit
def _quantize(w, step, peak, scale, levels, two_over_levels, q_n, q_p, METHOD: tl.constexpr):
    """Quantized values of a chunk; ``v`` (LSQ's w/s, clamped) and ``t`` (DoReFa's tanh) too."""
    if METHOD == 0:
        t = _tanh(w)
        code = _round_half_even((tl.math.div_rn(t, peak) + 1.0) * 0.5 * levels)
        q = scale * (code * two_over_levels - 1.0)
        v = t
    else:
        v = tl.minimum(tl.maximum(tl.math.div_rn(w, step), -q_n), q_p)
        code = _round_half_even(v)
        q = code * step
        t = v
    return q, code, t


@triton.jit
def _quantized_grad(
    g, q, mean_g, mean_q, std_q, ratio, mean_ga, spread_q, CORRECTION: tl.constexpr
):
    """The gradient reaching the quantized values from the corrected output's gradient ``g``."""
    if CORRECTION == 0:
        gq = g
    elif CORRECTION == 1:
        gq = g - mean_g
    else:
        gq = tl.where(spread_q, ratio * (g - mean_g - (q - mean_q) / std_q * mean_ga), g - mean_g)
    return gq


@triton.jit
def _weight_fwd_kernel(
    w_ptr, step_ptr, out_ptr, stats_ptr, K, levels, two_over_levels, q_n, q_p,
    METHOD: tl.constexpr, CORRECTION: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = row * K
    cols = tl.arange(0, BLOCK_K)
    tiny = 1.1754943508222875e-38
    k_f = K * 1.0
    # pass 1: mean, spread and (DoReFa) peak |tanh| and mean |w| of the row
    total = tl.zeros([BLOCK_K], tl.float32)
    total_abs = tl.zeros([BLOCK_K], tl.float32)
    peak_acc = tl.zeros([BLOCK_K], tl.float32)
    w_max = tl.full([BLOCK_K], float("-inf"), tl.float32)
    w_min = tl.full([BLOCK_K], float("inf"), tl.float32)
    for start in range(0, K, BLOCK_K):
        mask = start + cols < K
        w = tl.load(w_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        total += w
        if METHOD == 0:
            total_abs += tl.abs(w)
            peak_acc = tl.maximum(peak_acc, tl.where(mask, tl.abs(_tanh(w)), 0.0))
        w_max = tl.maximum(w_max, tl.where(mask, w, float("-inf")))
        w_min = tl.minimum(w_min, tl.where(mask, w, float("inf")))
    mean_w = tl.sum(total, axis=0) / k_f
    scale = tl.sum(total_abs, axis=0) / k_f
    peak = tl.maximum(tl.max(peak_acc, axis=0), tiny)
    spread_w = tl.max(w_max, axis=0) > tl.min(w_min, axis=0)
    step = tl.load(step_ptr + row).to(tl.float32) if METHOD == 1 else 1.0
    # pass 2: variance of w, mean and spread of q, ties at the peak
    var_acc = tl.zeros([BLOCK_K], tl.float32)
    q_total = tl.zeros([BLOCK_K], tl.float32)
    q_max = tl.full([BLOCK_K], float("-inf"), tl.float32)
    q_min = tl.full([BLOCK_K], float("inf"), tl.float32)
    ties = tl.zeros([BLOCK_K], tl.float32)
    for start in range(0, K, BLOCK_K):
        mask = start + cols < K
        w = tl.load(w_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        q, _code, t = _quantize(w, step, peak, scale, levels, two_over_levels, q_n, q_p, METHOD)
        d = tl.where(mask, w - mean_w, 0.0)
        var_acc += d * d
        q_total += tl.where(mask, q, 0.0)
        q_max = tl.maximum(q_max, tl.where(mask, q, float("-inf")))
        q_min = tl.minimum(q_min, tl.where(mask, q, float("inf")))
        if METHOD == 0:
            ties += tl.where(mask & (tl.abs(t) == peak), 1.0, 0.0)
    var_w = tl.sum(var_acc, axis=0) / k_f
    mean_q = tl.sum(q_total, axis=0) / k_f
    spread_q = tl.max(q_max, axis=0) > tl.min(q_min, axis=0)
    std_w = tl.where(spread_w, tl.sqrt(var_w), 0.0)
    std_q = 1.0
    ratio = 1.0
    if CORRECTION == 2:  # pass 3: variance of q
        var_q_acc = tl.zeros([BLOCK_K], tl.float32)
        for start in range(0, K, BLOCK_K):
            mask = start + cols < K
            w = tl.load(w_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
            q, _code, _t = _quantize(
                w, step, peak, scale, levels, two_over_levels, q_n, q_p, METHOD
            )
            dq = tl.where(mask, q - mean_q, 0.0)
            var_q_acc += dq * dq
        var_q = tl.sum(var_q_acc, axis=0) / k_f
        std_q = tl.where(spread_q, tl.sqrt(var_q), 1.0)
        ratio = tl.where(spread_q, std_w / std_q, 1.0)
    # pass 4: the output
    for start in range(0, K, BLOCK_K):
        mask = start + cols < K
        w = tl.load(w_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        q, _code, t = _quantize(w, step, peak, scale, levels, two_over_levels, q_n, q_p, METHOD)
        if CORRECTION == 1:
            q = q - mean_q + mean_w
        elif CORRECTION == 2:
            q = (q - mean_q) * ratio + mean_w
        tl.store(out_ptr + base + start + cols, q.to(out_ptr.dtype.element_ty), mask=mask)
    stats = stats_ptr + row * 9
    tl.store(stats + 0, peak)
    tl.store(stats + 1, scale)
    tl.store(stats + 2, mean_w)
    tl.store(stats + 3, std_w)
    tl.store(stats + 4, mean_q)
    tl.store(stats + 5, std_q)
    tl.store(stats + 6, ratio)
    tl.store(stats + 7, tl.sum(ties, axis=0))
    tl.store(stats + 8, tl.where(spread_q, 1.0, 0.0))


@triton.jit
def _weight_bwd_kernel(
    w_ptr, step_ptr, grad_ptr, stats_ptr, dw_ptr, dstep_ptr, K, levels, two_over_levels, q_n,
    q_p, METHOD: tl.constexpr, CORRECTION: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = row * K
    cols = tl.arange(0, BLOCK_K)
    k_f = K * 1.0
    stats = stats_ptr + row * 9
    peak = tl.load(stats + 0)
    scale = tl.load(stats + 1)
    mean_w = tl.load(stats + 2)
    std_w = tl.load(stats + 3)
    mean_q = tl.load(stats + 4)
    std_q = tl.load(stats + 5)
    ratio = tl.load(stats + 6)
    ties = tl.load(stats + 7)
    spread_q = tl.load(stats + 8) != 0.0
    step = tl.load(step_ptr + row).to(tl.float32) if METHOD == 1 else 1.0
    # pass 1: mean(G) and mean(G·â), â = (q − mean_q)/std_q
    g_total = tl.zeros([BLOCK_K], tl.float32)
    ga_total = tl.zeros([BLOCK_K], tl.float32)
    for start in range(0, K, BLOCK_K):
        mask = start + cols < K
        g = tl.load(grad_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        g_total += g
        if CORRECTION == 2:
            w = tl.load(w_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
            q, code, t = _quantize(w, step, peak, scale, levels, two_over_levels, q_n, q_p, METHOD)
            ga_total += tl.where(mask, g * (q - mean_q) / std_q, 0.0)
    mean_g = tl.sum(g_total, axis=0) / k_f
    mean_ga = tl.sum(ga_total, axis=0) / k_f
    # the direct gradients of mean(W) and, when both rows spread, of std(W)
    mean_term = 0.0
    sigma_term = 0.0
    if CORRECTION != 0:
        mean_term = mean_g
    if CORRECTION == 2:
        safe_std = tl.where(std_w > 0, std_w, 1.0)
        sigma_term = tl.where((std_w > 0) & spread_q, mean_ga / safe_std, 0.0)
    # pass 2 (DoReFa): Σ gQ·t for the peak's gradient; (LSQ): the step gradient
    side = tl.zeros([BLOCK_K], tl.float32)
    for start in range(0, K, BLOCK_K):
        mask = start + cols < K
        w = tl.load(w_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(grad_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        q, code, t = _quantize(w, step, peak, scale, levels, two_over_levels, q_n, q_p, METHOD)
        gq = _quantized_grad(g, q, mean_g, mean_q, std_q, ratio, mean_ga, spread_q, CORRECTION)
        gq = tl.where(mask, gq, 0.0)
        if METHOD == 0:
            side += gq * t
        else:
            raw = tl.math.div_rn(w, step)
            inside = (raw >= -q_n) & (raw <= q_p)
            side += gq * tl.where(inside, code - t, t)
            dw = tl.where(inside, gq, 0.0) + mean_term + sigma_term * (w - mean_w)
            tl.store(dw_ptr + base + start + cols, dw.to(dw_ptr.dtype.element_ty), mask=mask)
    if METHOD == 1:
        tl.store(dstep_ptr + row, tl.sum(side, axis=0))
    else:  # pass 3 (DoReFa): write dW, the peak's share going to its ties
        peak_grad = -scale / (peak * peak) * tl.sum(side, axis=0) / ties
        for start in range(0, K, BLOCK_K):
            mask = start + cols < K
            w = tl.load(w_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(grad_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
            q, code, t = _quantize(w, step, peak, scale, levels, two_over_levels, q_n, q_p, METHOD)
            gq = _quantized_grad(g, q, mean_g, mean_q, std_q, ratio, mean_ga, spread_q, CORRECTION)
            dtanh = 1.0 - t * t
            at_peak = tl.abs(t) == peak
            sign = tl.where(t < 0, -1.0, 1.0)
            dw = gq * scale * dtanh / peak + tl.where(at_peak, peak_grad * dtanh * sign, 0.0)
            dw += mean_term + sigma_term * (w - mean_w)
            tl.store(dw_ptr + base + start + cols, dw.to(dw_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _act_fwd_kernel(
    x_ptr, step_ptr, out_ptr, n_elements, low, levels, q_n, q_p,
    METHOD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if METHOD == 0:  # clamp
        y = _round_half_even(tl.minimum(tl.maximum(x, low), 1.0) * levels) / levels
    else:
        step = tl.load(step_ptr).to(tl.float32)
        y = _round_half_even(tl.minimum(tl.maximum(tl.math.div_rn(x, step), -q_n), q_p)) * step
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _act_bwd_kernel(
    x_ptr, step_ptr, grad_ptr, dx_ptr, partial_ptr, n_elements, low, q_n, q_p,
    METHOD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if METHOD == 0:
        inside = (x >= low) & (x <= 1.0)
    else:
        step = tl.load(step_ptr).to(tl.float32)
        raw = tl.math.div_rn(x, step)
        inside = (raw >= -q_n) & (raw <= q_p)
        v = tl.minimum(tl.maximum(raw, -q_n), q_p)
        share = tl.where(inside, _round_half_even(v) - v, v)
        tl.store(partial_ptr + pid, tl.sum(tl.where(mask, g * share, 0.0), axis=0))
    tl.store(dx_ptr + offsets, tl.where(inside, g, 0.0).to(dx_ptr.dtype.element_ty), mask=mask)


def _weight_args(bits: int, method: str, k: int) -> tuple[float, float, float, float, int]:
    levels = float(2**bits - 1)
    q_n, q_p = float(2 ** (bits - 1)), float(2 ** (bits - 1) - 1)
    return levels, 2.0 / levels, q_n, q_p, min(next_power_of_2(k), 1024)


def weight_fwd(
    weight: torch.Tensor, bits: int, method: str, step: torch.Tensor | None, correction
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fake-quantized contiguous ``(C, K)`` weight and the ``(C, 9)`` float32 row statistics."""
    rows, k = weight.shape
    out = torch.empty_like(weight)
    stats = torch.empty(rows, STATS, device=weight.device, dtype=torch.float32)
    levels, two_over, q_n, q_p, block = _weight_args(bits, method, k)
    step_arg = step if step is not None else stats
    if rows and k:
        with device_guard(weight):
            _weight_fwd_kernel[(rows,)](
                weight, step_arg, out, stats, k, levels, two_over, q_n, q_p,
                METHOD=METHODS[method], CORRECTION=CORRECTIONS[correction], BLOCK_K=block,
            )  # fmt: skip
    return out, stats


def weight_bwd(
    weight: torch.Tensor,
    bits: int,
    method: str,
    step: torch.Tensor | None,
    correction,
    stats: torch.Tensor,
    grad: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of the weight and (LSQ) of the steps, before the step's gradient scale."""
    rows, k = weight.shape
    dw = torch.empty_like(weight)
    dstep = (
        torch.empty(rows, device=weight.device, dtype=torch.float32) if step is not None else None
    )
    levels, two_over, q_n, q_p, block = _weight_args(bits, method, k)
    if rows and k:
        with device_guard(weight):
            _weight_bwd_kernel[(rows,)](
                weight, step if step is not None else stats, grad, stats, dw,
                dstep if dstep is not None else stats, k, levels, two_over, q_n, q_p,
                METHOD=METHODS[method], CORRECTION=CORRECTIONS[correction], BLOCK_K=block,
            )  # fmt: skip
    return dw, dstep


def _act_args(bits: int, signed: bool) -> tuple[float, float, float, float]:
    low, levels = (-1.0, float(2 ** (bits - 1) - 1)) if signed else (0.0, float(2**bits - 1))
    q_n, q_p = (float(2 ** (bits - 1)), float(2 ** (bits - 1) - 1)) if signed else (0.0, levels)
    return low, levels, q_n, q_p


def activation_fwd(
    x: torch.Tensor, bits: int, method: str, step: torch.Tensor | None, signed: bool
) -> torch.Tensor:
    """Fake-quantized contiguous activation."""
    out = torch.empty_like(x)
    n = x.numel()
    low, levels, q_n, q_p = _act_args(bits, signed)
    if n:
        with device_guard(x):
            _act_fwd_kernel[(cdiv(n, ACT_BLOCK),)](
                x, step if step is not None else x, out, n, low, levels, q_n, q_p,
                METHOD=0 if method == "clamp" else 1, BLOCK=ACT_BLOCK,
            )  # fmt: skip
    return out


def activation_bwd(
    x: torch.Tensor, bits: int, method: str, step: torch.Tensor | None, signed: bool, grad
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradient of the activation and (LSQ) the step's, before its gradient scale."""
    dx = torch.empty_like(x)
    n = x.numel()
    blocks = cdiv(n, ACT_BLOCK)
    partial = torch.zeros(blocks, device=x.device, dtype=torch.float32)
    low, _levels, q_n, q_p = _act_args(bits, signed)
    if n:
        with device_guard(x):
            _act_bwd_kernel[(blocks,)](
                x, step if step is not None else x, grad, dx, partial, n, low, q_n, q_p,
                METHOD=0 if method == "clamp" else 1, BLOCK=ACT_BLOCK,
            )  # fmt: skip
    dstep = partial.sum().reshape(1) if method == "lsq" else None
    return dx, dstep
