"""Public gated delta rule ops in FLA's calling convention: chunked, fused recurrent and naive.

``q, k: (B, T, H, K)``, ``v: (B, T, HV, V)``, ``g, beta: (B, T, HV)`` with ``HV`` a multiple of
``H`` (grouped value heads: value head ``i`` reads query/key head ``i // (HV // H)``), state
``(B, HV, K, V)`` in float32. Every form computes the same function; they differ in cost:
``chunk`` (WY representation, for training and prefill), ``fused_recurrent`` (one step at a time,
for decoding and short prompts) and ``naive`` (the float64-capable oracle).

Each op validates its inputs, expands grouped heads, L2-normalises q and k when
``use_qk_l2norm_in_kernel`` (FLA's ``x / sqrt(Σx² + 1e-6)``, in float32, differentiable) and then
dispatches through :class:`kernels_common.KernelOp`: Triton on CUDA tensors, the Triton
interpreter under ``TRITON_INTERPRET=1``, PyTorch otherwise (``backend=`` overrides).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from jet_nemotron.ops.chunk import chunk_gated_delta_rule_torch
from jet_nemotron.ops.naive import naive_recurrent_gated_delta_rule as _recurrence
from jet_nemotron.ops.validation import (
    check_chunk_size,
    check_float64_backend,
    check_gated_delta_inputs,
    check_kernel_head_dim,
    check_scale,
)
from kernels_common.backend import Backend, KernelOp, iter_tensors, resolve_backend

Output = tuple[torch.Tensor, torch.Tensor | None]
L2NORM_EPS = 1e-6

chunk_op = KernelOp(
    name="chunk_gated_delta_rule",
    reference=chunk_gated_delta_rule_torch,
    triton="jet_nemotron.ops.chunk_triton:chunk_gated_delta_rule_triton",
)
fused_recurrent_op = KernelOp(
    name="fused_recurrent_gated_delta_rule",
    reference=_recurrence,
    triton="jet_nemotron.ops.recurrent_triton:fused_recurrent_gated_delta_rule_triton",
)


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x / sqrt(Σ x² + eps)`` over the last dim, computed in float32, returned in x's dtype."""
    x32 = x.float() if x.dtype != torch.float64 else x
    return (x32 * torch.rsqrt(x32.square().sum(-1, keepdim=True) + eps)).to(x.dtype)


def _prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None,
    initial_state: torch.Tensor | None,
    use_qk_l2norm_in_kernel: bool,
    backend: str | Backend | None,
) -> tuple[tuple[torch.Tensor, ...], float, torch.Tensor | None, Backend]:
    """Validated, grouped-head-expanded and normalised inputs plus the backend that will run."""
    _, _, H, HV, K, _ = check_gated_delta_inputs(q, k, v, g, beta, initial_state)
    scale = check_scale(scale, K)
    if backend in (None, "auto") and q.dtype == torch.float64:
        backend = Backend.REFERENCE  # float64 is the oracle's precision: no kernel takes it
    chosen = resolve_backend(backend, iter_tensors((q, k, v, g, beta, initial_state)))
    if chosen is not Backend.REFERENCE:
        check_kernel_head_dim(K)
        check_float64_backend(q.dtype, triton=True)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if HV != H:
        q, k = (x.repeat_interleave(HV // H, dim=2) for x in (q, k))
    if initial_state is not None:
        initial_state = initial_state.to(torch.promote_types(q.dtype, torch.float32))
    return (q, k, v, g, beta), scale, initial_state, chosen


def _run(
    op: KernelOp,
    inputs: tuple[torch.Tensor, ...],
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    backend: Backend,
    **options: int,
) -> Output:
    form: Callable[..., Output] = op.implementation(backend)
    return form(*inputs, scale, initial_state, output_final_state, **options)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    chunk_size: int = 64,
    backend: str | Backend | None = None,
) -> Output:
    """Gated delta rule in chunked (WY) form: for training and long prefills.

    Args:
        q: ``(B, T, H, K)`` queries.
        k: ``(B, T, H, K)`` keys.
        v: ``(B, T, HV, V)`` values, ``HV`` a multiple of ``H``.
        g: ``(B, T, HV)`` log decays (``α_t = exp(g_t)``), usually ``<= 0``.
        beta: ``(B, T, HV)`` write strengths, usually in ``(0, 1)``.
        scale: query scale; ``None`` is ``K ** -0.5``.
        initial_state: ``(B, HV, K, V)`` or ``None`` (zeros).
        output_final_state: also return the state after the last token.
        use_qk_l2norm_in_kernel: L2-normalise q and k first (as the JetBlock does).
        chunk_size: 16, 32 or 64.
        backend: ``None``/``"auto"``, ``"triton"``, ``"interpreter"`` or ``"reference"``.

    Returns:
        ``(o, final_state)``: ``o (B, T, HV, V)`` in q's dtype; the final state ``(B, HV, K, V)``
        in float32 (float64 for float64 inputs) or ``None``.

    Example:
        >>> import torch
        >>> q, k = torch.randn(2, 10, 1, 8), torch.randn(2, 10, 1, 8)
        >>> v, g, beta = torch.randn(2, 10, 2, 4), -torch.rand(2, 10, 2), torch.rand(2, 10, 2)
        >>> o, S = chunk_gated_delta_rule(
        ...     q,
        ...     k,
        ...     v,
        ...     g,
        ...     beta,
        ...     output_final_state=True,
        ...     use_qk_l2norm_in_kernel=True,
        ...     chunk_size=16,
        ...     backend="reference",
        ... )
        >>> o.shape, S.shape
        (torch.Size([2, 10, 2, 4]), torch.Size([2, 2, 8, 4]))
    """
    check_chunk_size(chunk_size)
    inputs, scale, state, chosen = _prepare(
        q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, backend
    )
    return _run(chunk_op, inputs, scale, state, output_final_state, chosen, chunk_size=chunk_size)


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    backend: str | Backend | None = None,
) -> Output:
    """Gated delta rule one token at a time in one fused kernel: for decoding and short prompts.

    Arguments and result as :func:`chunk_gated_delta_rule`. Differentiable on every backend: the
    Triton backward replays the recurrence in reverse from states it checkpoints during the
    forward pass.

    Example:
        >>> import torch
        >>> q = k = torch.randn(1, 1, 2, 8)
        >>> v, g, beta = torch.randn(1, 1, 2, 8), -torch.rand(1, 1, 2), torch.rand(1, 1, 2)
        >>> S0 = torch.zeros(1, 2, 8, 8)
        >>> o, S = fused_recurrent_gated_delta_rule(
        ...     q, k, v, g, beta, initial_state=S0, output_final_state=True, backend="reference"
        ... )
        >>> o.shape
        torch.Size([1, 1, 2, 8])
    """
    inputs, scale, state, chosen = _prepare(
        q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, backend
    )
    return _run(fused_recurrent_op, inputs, scale, state, output_final_state, chosen)


def naive_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
) -> Output:
    """The recurrence in PyTorch, step by step, in float32 or float64: the oracle.

    Arguments and result as :func:`chunk_gated_delta_rule` (note: FLA's function of this name
    orders its arguments ``q, k, v, beta, g``; this one keeps the order of the other ops).

    Example:
        >>> import torch
        >>> q = k = torch.randn(1, 4, 1, 8, dtype=torch.float64)
        >>> v = torch.randn(1, 4, 1, 2, dtype=torch.float64)
        >>> g, beta = torch.zeros(1, 4, 1, dtype=torch.float64), torch.ones(1, 4, 1).double()
        >>> naive_recurrent_gated_delta_rule(q, k, v, g, beta)[0].dtype
        torch.float64
    """
    inputs, scale, state, _ = _prepare(
        q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, "reference"
    )
    return _recurrence(*inputs, scale, state, output_final_state)
