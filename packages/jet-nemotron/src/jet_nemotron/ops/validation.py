"""Checks of the gated delta rule's inputs, with messages that say what was wrong."""

from __future__ import annotations

import math

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CHUNK_SIZES = (16, 32, 64)
MAX_KERNEL_HEAD_DIM = 256  # the key dimension the Triton kernels hold in one tile


def _shape(name: str, x: torch.Tensor, expected: tuple[int, ...], meaning: str) -> None:
    if tuple(x.shape) != expected:
        raise ValueError(f"{name} must have shape {meaning} = {expected}, got {tuple(x.shape)}")


def check_gated_delta_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> tuple[int, int, int, int, int, int]:
    """Validate FLA's calling convention and return ``(B, T, H, HV, K, V)``.

    q, k ``(B, T, H, K)``; v ``(B, T, HV, V)`` with ``HV`` a multiple of ``H`` (grouped value
    heads); g, beta ``(B, T, HV)``; initial_state ``(B, HV, K, V)``. All floating point, of one
    device; q, k, v of one dtype.
    """
    named = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float32, float16, bfloat16 or float64, got {x.dtype}")
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k must be (B, T, H, K) and v (B, T, HV, V); got q {tuple(q.shape)}, "
            f"v {tuple(v.shape)}"
        )
    B, T, H, K = q.shape
    _shape("k", k, (B, T, H, K), "(B, T, H, K) like q")
    if v.shape[:2] != (B, T):
        raise ValueError(f"v must be (B, T, HV, V) with (B, T) = {(B, T)}, got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if H == 0 or HV % H:
        raise ValueError(
            f"the value heads HV={HV} must be a multiple of the query/key heads H={H} "
            "(grouped value attention)"
        )
    _shape("g", g, (B, T, HV), "(B, T, HV)")
    _shape("beta", beta, (B, T, HV), "(B, T, HV)")
    if len({q.dtype, k.dtype, v.dtype}) != 1:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or not initial_state.is_floating_point():
            raise TypeError("initial_state must be a floating-point torch.Tensor (B, HV, K, V)")
        _shape("initial_state", initial_state, (B, HV, K, V), "(B, HV, K, V)")
    tensors = [*named.values()] + ([initial_state] if initial_state is not None else [])
    devices = {x.device for x in tensors}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    if min(K, V) < 1:
        raise ValueError(f"head dimensions must be positive, got K={K}, V={V}")
    if T < 1:
        raise ValueError("the sequence must hold at least one token (T >= 1), got T=0")
    return B, T, H, HV, K, V


def check_scale(scale: float | None, head_dim: int) -> float:
    """``None`` -> ``head_dim ** -0.5``; otherwise a positive finite number."""
    if scale is None:
        return head_dim**-0.5
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    return float(scale)


def check_chunk_size(chunk_size: int) -> None:
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}, got {chunk_size!r}")


def check_kernel_head_dim(K: int) -> None:
    """The Triton kernels keep a whole key row in one tile (as FLA's do)."""
    if K > MAX_KERNEL_HEAD_DIM:
        raise ValueError(
            f"the Triton gated delta rule kernels support key head dims up to "
            f"{MAX_KERNEL_HEAD_DIM}, got K={K}; use backend='reference' or smaller heads"
        )


def check_float64_backend(dtype: torch.dtype, triton: bool) -> None:
    if triton and dtype == torch.float64:
        raise TypeError("the Triton kernels take float32, float16 or bfloat16, got float64")
