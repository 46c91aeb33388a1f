"""How each linear layer's per-example clipping is computed: a cost model over three methods.

For a linear layer with B examples of T tokens, weight D_out × D_in, the weight gradient of the
whole batch is one GEMM of 2·B·T·D_in·D_out flops. Per-example clipping adds:

* ``store`` (per-layer clipping only): every per-example gradient P_b = G_bᵀX_b is computed once,
  into a bounded float32 workspace (a chunk of examples at a time), its norm taken and the
  clipped sum formed from it; extra cost: writing and reading B·D_out·D_in float32 values, and
  reading and writing the float32 sum once per chunk. What is released is exactly the clipped
  gradients whose norms were measured.
* ``ghost``: the norm from Gram matrices ⟨X_bX_bᵀ, G_bG_bᵀ⟩ (2·B·T²·(D_in + D_out) flops, the
  rank-one form when T = 1, per-example blocks when cheaper), then the clipped sum in one GEMM.
  The PyTorch reference implements it; on the Triton path it is offered for T = 1 only (the
  rank-one norm; the Gram form's cancellation check reads the device).
* ``recompute`` (Triton): the norms in one GEMM-sized pass over per-example tiles held in
  registers, then the clipped sum in a second: twice the GEMM, no memory.

Flat clipping needs every layer's norms before any coefficient is known, so it cannot reduce a
chunk at a time: it uses ``ghost`` or ``recompute``. Costs are compared in flops, a byte of memory
traffic counting as :data:`FLOPS_PER_BYTE` flops of the device (its machine balance).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Method = Literal["store", "ghost", "recompute"]
METHODS: tuple[str, ...] = ("auto", "store", "ghost", "recompute")

# Machine balance (flops per byte of memory traffic) used to price the workspace of `store`:
# CUDA from an H200's data sheet (989 TFLOP/s dense bf16, 4.8 TB/s: ~200), CPU from a 2-core
# AVX2 machine (~100 GFLOP/s fp32, ~10 GB/s per core pair: ~10).
FLOPS_PER_BYTE = {"cuda": 200.0, "cpu": 10.0}

DEFAULT_WORKSPACE_MB = {"cuda": 256.0, "cpu": 4.0}
"""Default bound (MiB) of the ``store`` workspace, the float32 per-example gradients of one chunk,
by device type. On a GPU, a few percent of a GPT-2-small step's memory (4.7 GB at B = 8,
T = 1024) in chunks large enough to keep launches few; on a CPU, where a GEMM per example is as
fast as a batched one, a few examples of a small model's largest weight."""


@dataclass(frozen=True)
class LayerPlan:
    """The method chosen for one linear weight and what it was chosen from.

    Attributes:
        method: ``"store"``, ``"ghost"`` or ``"recompute"``.
        chunk: examples per workspace chunk (``store``; 0 otherwise).
        costs: estimated flops of each method considered, by name.
    """

    method: Method
    chunk: int
    costs: tuple[tuple[str, float], ...]


def plan_linear(
    batch: int,
    tokens: int,
    d_in: int,
    d_out: int,
    *,
    clipping: str,
    device: str,
    triton: bool,
    workspace_mb: float | None = None,
    method: str = "auto",
) -> LayerPlan:
    """Choose how to clip one linear weight (see the module docstring).

    Args:
        batch: B, examples in the backward pass.
        tokens: T, rows per example.
        d_in: the weight's input width.
        d_out: the weight's output width.
        clipping: ``"per_layer"`` or ``"flat"``.
        device: the device type (``"cuda"``, ``"cpu"``, ...); sets the machine balance.
        triton: whether the Triton kernels run (they implement ``store`` and ``recompute``;
            the PyTorch reference implements ``store`` and ``ghost``).
        workspace_mb: bound of the ``store`` workspace in MiB (``None``: the device's
            :data:`DEFAULT_WORKSPACE_MB`, the CPU's for other devices).
        method: ``"auto"`` (the cheapest available), or a method to use whenever it is
            available (benchmarks, tests, or exact released norms with ``"store"``).

    Returns:
        The chosen method, with the costs of every available one.

    Raises:
        ValueError: an unknown method, or one not available for this layer (``store`` under
            flat clipping or with a workspace smaller than one example, ``recompute`` without
            Triton).
    """
    balance = FLOPS_PER_BYTE.get(device, FLOPS_PER_BYTE["cpu"])
    weight = d_in * d_out
    gemm = 2.0 * batch * tokens * weight
    costs: dict[str, float] = {}
    if workspace_mb is None:
        workspace_mb = DEFAULT_WORKSPACE_MB.get(device, DEFAULT_WORKSPACE_MB["cpu"])
    chunk = int(workspace_mb * 2**20) // (4 * weight)
    if clipping == "per_layer" and chunk >= 1:
        chunks = -(-batch // chunk) if batch else 0
        costs["store"] = gemm + balance * 8.0 * (batch + chunks) * weight
    if triton:
        costs["recompute"] = 2.0 * gemm
    if not triton or tokens == 1:
        costs["ghost"] = gemm + 2.0 * batch * min(tokens * tokens * (d_in + d_out), tokens * weight)
    if method not in METHODS:
        raise ValueError(f"linear_method must be one of {METHODS}, got {method!r}")
    if method == "auto":
        method = min(costs, key=costs.__getitem__)
    elif method not in costs:
        raise ValueError(
            f"linear_method={method!r} is not available for a {d_out}×{d_in} weight here "
            f"({clipping} clipping, {'Triton' if triton else 'PyTorch reference'}, "
            f"{batch}×{tokens} rows): available {sorted(costs)}"
        )
    return LayerPlan(
        method=method,  # type: ignore[arg-type]
        chunk=max(1, min(chunk, batch)) if method == "store" else 0,
        costs=tuple(costs.items()),
    )
