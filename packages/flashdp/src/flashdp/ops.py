"""The fused per-example clipping of linear weights, dispatched between Triton and the reference.

The ops take ``x: (B, T, D_in)`` and ``grad_output: (B, T, D_out)`` of a float dtype; the Triton
implementations (``flashdp.kernels``) are imported only when a Triton backend runs.
"""

from __future__ import annotations

from flashdp.reference import (
    linear_weight_clipped_sum,
    linear_weight_norm2,
    linear_weight_store_clip,
)
from kernels_common import KernelOp

linear_weight_norm2_op = KernelOp(
    name="linear_weight_norm2",
    reference=linear_weight_norm2,
    triton="flashdp.kernels:linear_weight_norm2_triton",
)
"""‖G_bᵀX_b‖²_F per example, ``(B,)``: per-example gradient tiles are squared and summed where
they are computed (registers on the GPU), never stored."""

linear_weight_clipped_sum_op = KernelOp(
    name="linear_weight_clipped_sum",
    reference=linear_weight_clipped_sum,
    triton="flashdp.kernels:linear_weight_clipped_sum_triton",
)
"""Σ_b c_b G_bᵀX_b, ``(D_out, D_in)``: the clipping coefficient applied as G is loaded."""

linear_weight_store_clip_op = KernelOp(
    name="linear_weight_store_clip",
    reference=linear_weight_store_clip,
    triton="flashdp.kernels:linear_weight_store_clip_triton",
)
"""Per-layer clipping in one GEMM: per-example gradients of a chunk of examples go to a bounded
workspace with their norms (and bias gradients), then their clipped sum is accumulated from it:
``(norm2 (B,), Σ_b c_b P_b (D_out, D_in), bias gradients (B, D_out) or None)``."""
