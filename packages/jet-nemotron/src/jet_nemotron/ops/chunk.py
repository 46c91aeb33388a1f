"""The chunked (WY) form of the gated delta rule in PyTorch, stage by stage, with its backward.

Per head the state ``S`` is ``(K, V)``; the recurrence ``S_t = e^{g_t} S_{t-1} + k_t u_tᵀ``,
``u_t = β_t (v_t - e^{g_t} S_{t-1}ᵀ k_t)``, ``o_t = scale · S_tᵀ q_t`` is evaluated one chunk
of ``C`` steps at a time. Inside a chunk, with the cumulative log decay ``gc``
(:func:`chunk_local_cumsum`):

* ``A = strict_lower((β ⊙ k) kᵀ ⊙ e^{gc_i - gc_j})`` (:func:`chunk_scaled_dot_kkt`) and
  ``Ai = (I + A)⁻¹`` (:func:`solve_tril`) give the WY representation
  ``w = Ai (β e^{gc} ⊙ k)``, ``u = Ai (β ⊙ v)`` (:func:`recompute_w_u`);
* over chunks (:func:`chunk_fwd_h`): ``v_new = u - w S``,
  ``S ← e^{gc_C} S + (k ⊙ e^{gc_C - gc})ᵀ v_new``, keeping the state ``h`` entering each chunk;
* the output (:func:`chunk_fwd_o`):
  ``o = scale (q ⊙ e^{gc}) h + scale · tril(q kᵀ ⊙ e^{gc_i - gc_j}) v_new``.

The backward pass recomputes ``w, u, h, v_new`` from the saved inputs, ``gc`` and ``Ai``, then runs
the backward stages: the local value gradient (:func:`chunk_bwd_dv_local`), the reverse recurrence
over chunks for the state and ``v_new`` gradients (:func:`chunk_bwd_dhu`), the gradients of ``q``,
``k``, ``w`` and ``gc`` (:func:`chunk_bwd_dqkwg`), the WY backward for ``k, v, β, gc``
(:func:`prepare_wy_repr_bwd`) and the reverse in-chunk cumulative sum of ``dgc`` into ``dg``.

The stage functions take the chunked layout ``(B, H, N, C, ...)`` (see :func:`to_chunks`) in float32
or float64. They are the specification of the Triton kernels (``jet_nemotron.kernels.chunk_*``),
which compute the same stages on the ``(B, T, H, ...)`` layout.
"""

from __future__ import annotations

from typing import Any

import torch

DIAGONAL_BLOCK = 16  # edge of the diagonal blocks that solve_tril inverts by row recursion


def to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``(B, T, H, *D)`` -> ``(B, H, N, C, *D)``, ``N = ceil(T / C)``, zero-padded at the end."""
    B, T, H = x.shape[:3]
    pad = -T % chunk_size
    x = x.movedim(2, 1)
    if pad:
        x = torch.cat([x, x.new_zeros(B, H, pad, *x.shape[3:])], dim=2)
    return x.unflatten(2, (-1, chunk_size))


def from_chunks(x: torch.Tensor, length: int) -> torch.Tensor:
    """``(B, H, N, C, *D)`` -> ``(B, T, H, *D)``, the first ``length`` steps."""
    return x.flatten(2, 3)[:, :, :length].movedim(1, 2)


def causal_decay(gc: torch.Tensor, strict: bool) -> torch.Tensor:
    """``(..., C)`` -> ``(..., C, C)``: ``exp(gc_i - gc_j)`` where ``j <= i`` (``j < i`` if
    ``strict``), 0 elsewhere; masked before the exponential, which would overflow above the
    diagonal."""
    C = gc.shape[-1]
    keep = torch.ones(C, C, dtype=torch.bool, device=gc.device).tril(-1 if strict else 0)
    diff = gc[..., :, None] - gc[..., None, :]
    return torch.exp(diff.masked_fill(~keep, -torch.inf))


def chunk_local_cumsum(g: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Cumulative sum inside each chunk: ``g (B, H, N, C)`` -> same shape; ``reverse`` sums from
    the end of the chunk (the backward of the forward sum)."""
    if reverse:
        return g.flip(-1).cumsum(-1).flip(-1)
    return g.cumsum(-1)


def chunk_scaled_dot_kkt(k: torch.Tensor, beta: torch.Tensor, gc: torch.Tensor) -> torch.Tensor:
    """``A = strict_lower((β ⊙ k) kᵀ ⊙ e^{gc_i - gc_j})``: k ``(B, H, N, C, K)``, beta and gc
    ``(B, H, N, C)`` -> ``(B, H, N, C, C)``."""
    return (beta[..., None] * k) @ k.transpose(-1, -2) * causal_decay(gc, strict=True)


def solve_tril(A: torch.Tensor) -> torch.Tensor:
    """``(I + A)⁻¹`` of strictly lower triangular ``A (..., C, C)``, ``C`` a multiple of 16.

    Blocked forward substitution. First each 16 x 16 diagonal block ``L_m = I + A_mm`` is
    inverted by row recursion: row ``i`` of ``X_m = L_m⁻¹`` is ``e_i - Σ_{j<i} A_ij X_j``, which
    needs only the rows above it (all blocks at once). Then the blocks are merged by doubling:
    with ``D`` the block-diagonal part of ``I + A`` at block size ``b`` and ``O`` the blocks that
    join pairs of them into blocks of size ``2b``, ``(D + O)⁻¹ = D⁻¹ - D⁻¹ O D⁻¹`` (the inverse
    of ``[[X₁, 0], [Y, X₂]]`` is ``[[X₁⁻¹, 0], [-X₂⁻¹ Y X₁⁻¹, X₂⁻¹]]``), two matmuls per level:
    16 -> 32 -> 64.
    """
    C = A.shape[-1]
    n, b = C // DIAGONAL_BLOCK, DIAGONAL_BLOCK
    eye_b = torch.eye(b, dtype=A.dtype, device=A.device)
    blocks = A.unflatten(-2, (n, b)).unflatten(-1, (n, b)).diagonal(dim1=-4, dim2=-2)
    blocks = blocks.movedim(-1, -3)  # (..., n, b, b): the diagonal blocks
    rows = torch.arange(b, device=A.device)[:, None]
    inverse = eye_b.expand_as(blocks)
    for i in range(1, b):
        row = eye_b[i] - blocks[..., i : i + 1, :] @ inverse
        inverse = torch.where(rows == i, row, inverse)
    eye_n = torch.eye(n, dtype=A.dtype, device=A.device)
    inverse = torch.einsum("...mij,mn->...minj", inverse, eye_n).reshape(A.shape)
    index = torch.arange(C, device=A.device)
    while b < C:
        same_pair = index[:, None] // (2 * b) == index[None, :] // (2 * b)
        joining = same_pair & (index[:, None] // b > index[None, :] // b)
        inverse = inverse - inverse @ (A * joining) @ inverse
        b *= 2
    return inverse


def recompute_w_u(
    k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, gc: torch.Tensor, Ai: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """WY representation: ``w = Ai (β e^{gc} ⊙ k)`` ``(B, H, N, C, K)`` and ``u = Ai (β ⊙ v)``
    ``(B, H, N, C, V)``, with ``Ai = (I + A)⁻¹ (B, H, N, C, C)``."""
    w = Ai @ (k * (beta * gc.exp())[..., None])
    u = Ai @ (v * beta[..., None])
    return w, u


def chunk_fwd_h(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    gc: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The recurrence over chunks: ``h (B, H, N, K, V)`` (the state entering each chunk),
    ``v_new = u - w h`` ``(B, H, N, C, V)`` and the final state ``(B, H, K, V)``."""
    B, H, N, _, K = k.shape
    V = u.shape[-1]
    S = k.new_zeros(B, H, K, V) if initial_state is None else initial_state
    states, values = [], []
    for n in range(N):
        states.append(S)
        v_new = u[:, :, n] - w[:, :, n] @ S
        values.append(v_new)
        g_last = gc[:, :, n, -1]
        k_decayed = k[:, :, n] * (g_last[..., None] - gc[:, :, n]).exp()[..., None]
        S = S * g_last.exp()[..., None, None] + k_decayed.transpose(-1, -2) @ v_new
    return torch.stack(states, dim=2), torch.stack(values, dim=2), S


def chunk_fwd_o(
    q: torch.Tensor,
    k: torch.Tensor,
    v_new: torch.Tensor,
    h: torch.Tensor,
    gc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """``o = scale (q ⊙ e^{gc}) h + scale · tril(q kᵀ ⊙ e^{gc_i - gc_j}) v_new``:
    ``(B, H, N, C, V)``."""
    inter = (q * gc.exp()[..., None]) @ h
    intra = (q @ k.transpose(-1, -2) * causal_decay(gc, strict=False)) @ v_new
    return scale * (inter + intra)


def chunk_bwd_dv_local(
    q: torch.Tensor, k: torch.Tensor, gc: torch.Tensor, do: torch.Tensor, scale: float
) -> torch.Tensor:
    """The in-chunk part of ``dv_new``: ``scale · tril(q kᵀ ⊙ e^{gc_i - gc_j})ᵀ do``
    ``(B, H, N, C, V)``."""
    scores = q @ k.transpose(-1, -2) * causal_decay(gc, strict=False)
    return scale * scores.transpose(-1, -2) @ do


def chunk_bwd_dhu(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    gc: torch.Tensor,
    dht: torch.Tensor | None,
    do: torch.Tensor,
    dv: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reverse recurrence over chunks.

    ``dS`` starts at the final state's gradient ``dht`` (or 0). For each chunk from the last:
    ``dh = dS`` (the gradient of the state leaving the chunk), ``dv_new = dv + (k ⊙
    e^{gc_C - gc}) dS``, ``dS ← e^{gc_C} dS + scale (q ⊙ e^{gc})ᵀ do - wᵀ dv_new``.

    Returns:
        ``dh (B, H, N, K, V)``, the initial state's gradient ``dh0 (B, H, K, V)`` and the full
        ``dv_new (B, H, N, C, V)``.
    """
    B, H, N, _, K = k.shape
    V = do.shape[-1]
    dS = k.new_zeros(B, H, K, V) if dht is None else dht
    dh, dv_new = [None] * N, [None] * N
    for n in reversed(range(N)):
        dh[n] = dS
        g_last = gc[:, :, n, -1]
        k_decayed = k[:, :, n] * (g_last[..., None] - gc[:, :, n]).exp()[..., None]
        dv_new[n] = dv[:, :, n] + k_decayed @ dS
        q_decayed = q[:, :, n] * gc[:, :, n].exp()[..., None]
        dS = (
            dS * g_last.exp()[..., None, None]
            + scale * q_decayed.transpose(-1, -2) @ do[:, :, n]
            - w[:, :, n].transpose(-1, -2) @ dv_new[n]
        )
    return torch.stack(dh, dim=2), dS, torch.stack(dv_new, dim=2)


def chunk_bwd_dqkwg(
    q: torch.Tensor,
    k: torch.Tensor,
    v_new: torch.Tensor,
    w: torch.Tensor,
    gc: torch.Tensor,
    h: torch.Tensor,
    dv: torch.Tensor,
    do: torch.Tensor,
    dh: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients through the output and the state update: ``dq, dk (B, H, N, C, K)``,
    ``dw (B, H, N, C, K)`` and ``dgc (B, H, N, C)``.

    ``dq = scale e^{gc} ⊙ (do hᵀ) + ds k`` and ``dk = e^{gc_C - gc} ⊙ (v_new dhᵀ) + dsᵀ q`` with
    ``ds = scale (do v_newᵀ) ⊙ tril(e^{gc_i - gc_j})``; ``dw = -dv hᵀ``. Every term of the
    output and the state is linear in ``q_i e^{gc_i}`` or ``k_j e^{-gc_j}``, so
    ``dgc = Σ_K q ⊙ dq - Σ_K k ⊙ dk``, plus, on the last row, the paths through ``e^{gc_C}``:
    ``e^{gc_C} <h, dh> + Σ k ⊙ dk_state``.
    """
    g_last = gc[..., -1:]
    ds = scale * (do @ v_new.transpose(-1, -2)) * causal_decay(gc, strict=False)
    dq = scale * (do @ h.transpose(-1, -2)) * gc.exp()[..., None] + ds @ k
    dk_state = (v_new @ dh.transpose(-1, -2)) * (g_last - gc).exp()[..., None]
    dk = dk_state + ds.transpose(-1, -2) @ q
    dw = -dv @ h.transpose(-1, -2)
    dgc = (q * dq).sum(-1) - (k * dk).sum(-1)
    last = g_last[..., 0].exp() * (h * dh).sum((-2, -1)) + (k * dk_state).sum((-2, -1))
    dgc = torch.cat([dgc[..., :-1], dgc[..., -1:] + last[..., None]], dim=-1)
    return dq, dk, dw, dgc


def prepare_wy_repr_bwd(
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    gc: torch.Tensor,
    Ai: torch.Tensor,
    dw: torch.Tensor,
    du: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of ``A -> Ai -> (w, u)``: ``dk (B, H, N, C, K)``, ``dv (B, H, N, C, V)``,
    ``dbeta`` and ``dgc`` ``(B, H, N, C)``.

    With ``X = β e^{gc} ⊙ k``, ``Y = β ⊙ v``: ``dX = Aiᵀ dw``, ``dY = Aiᵀ du``,
    ``dAi = dw Xᵀ + du Yᵀ`` and ``dA = -Aiᵀ dAi Aiᵀ`` below the diagonal. ``A_ij = β_i (k_i·k_j)
    e^{gc_i - gc_j}`` then gives, with ``G = dA ⊙ e^{gc_i - gc_j}``: ``dk = β ⊙ G k + Gᵀ (β ⊙ k)``,
    ``dβ_i = Σ_j G_ij k_i·k_j`` and ``dgc = rowsum(dA ⊙ A) - colsum(dA ⊙ A)``.
    """
    decay = causal_decay(gc, strict=True)
    X = k * (beta * gc.exp())[..., None]
    Y = v * beta[..., None]
    Ait = Ai.transpose(-1, -2)
    dX, dY = Ait @ dw, Ait @ du
    dAi = dw @ X.transpose(-1, -2) + du @ Y.transpose(-1, -2)
    G = -(Ait @ dAi @ Ait) * decay
    kk = k @ k.transpose(-1, -2)
    P = G * kk * beta[..., None]  # dA ⊙ A
    kb = k * beta[..., None]
    dk = dX * (beta * gc.exp())[..., None] + beta[..., None] * (G @ k) + G.transpose(-1, -2) @ kb
    dbeta = gc.exp() * (k * dX).sum(-1) + (v * dY).sum(-1) + (G * kk).sum(-1)
    dgc = (X * dX).sum(-1) + P.sum(-1) - P.sum(-2)
    return dk, dY * beta[..., None], dbeta, dgc


def chunk_gated_delta_rule_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward stages on the chunked layout: ``o (B, H, N, C, V)``, the final state
    ``(B, H, K, V)`` and what the backward pass keeps, ``gc (B, H, N, C)`` and
    ``Ai (B, H, N, C, C)``."""
    gc = chunk_local_cumsum(g)
    Ai = solve_tril(chunk_scaled_dot_kkt(k, beta, gc))
    w, u = recompute_w_u(k, v, beta, gc, Ai)
    h, v_new, final_state = chunk_fwd_h(k, w, u, gc, initial_state)
    return chunk_fwd_o(q, k, v_new, h, gc, scale), final_state, gc, Ai


def chunk_gated_delta_rule_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    gc: torch.Tensor,
    Ai: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    do: torch.Tensor,
    dht: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """The backward stages on the chunked layout, by recomputation of ``w, u, h, v_new``:
    ``dq, dk, dv, dg, dbeta`` (the inputs' chunked shapes) and ``dh0 (B, H, K, V)``."""
    w, u = recompute_w_u(k, v, beta, gc, Ai)
    h, v_new, _ = chunk_fwd_h(k, w, u, gc, initial_state)
    dv = chunk_bwd_dv_local(q, k, gc, do, scale)
    dh, dh0, dv = chunk_bwd_dhu(q, k, w, gc, dht, do, dv, scale)
    dq, dk, dw, dgc = chunk_bwd_dqkwg(q, k, v_new, w, gc, h, dv, do, dh, scale)
    dk_wy, dv, dbeta, dgc_wy = prepare_wy_repr_bwd(k, v, beta, gc, Ai, dw, dv)
    dg = chunk_local_cumsum(dgc + dgc_wy, reverse=True)
    return dq, dk + dk_wy, dv, dg, dbeta, dh0


class ChunkGatedDeltaRuleFunction(torch.autograd.Function):
    """The chunked form with the explicit recomputation backward of
    :func:`chunk_gated_delta_rule_bwd`."""

    @staticmethod
    def forward(ctx: Any, q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size):
        T = q.shape[1]
        dtype = torch.promote_types(q.dtype, torch.float32)
        chunked = [to_chunks(x.to(dtype), chunk_size) for x in (q, k, v, g, beta)]
        state = None if initial_state is None else initial_state.to(dtype)
        o, final_state, gc, Ai = chunk_gated_delta_rule_fwd(*chunked, scale, state)
        qc, kc, vc, _, betac = chunked
        ctx.save_for_backward(qc, kc, vc, betac, gc, Ai, state)
        ctx.scale, ctx.length = scale, T
        ctx.dtypes = [x.dtype for x in (q, k, v, g, beta)]
        return from_chunks(o, T).to(q.dtype), final_state if output_final_state else None

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor, dht: torch.Tensor | None):
        qc, kc, vc, betac, gc, Ai, state = ctx.saved_tensors
        chunk_size = gc.shape[-1]
        do = to_chunks(do.to(qc.dtype), chunk_size)
        dht = None if dht is None else dht.to(qc.dtype)
        *grads, dh0 = chunk_gated_delta_rule_bwd(
            qc, kc, vc, betac, gc, Ai, ctx.scale, state, do, dht
        )
        dq, dk, dv, dg, dbeta = (
            from_chunks(x, ctx.length).to(dtype) for x, dtype in zip(grads, ctx.dtypes, strict=True)
        )
        return dq, dk, dv, dg, dbeta, None, None if state is None else dh0, None, None


def chunk_gated_delta_rule_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule in chunked (WY) form, in PyTorch, computed in float32 (float64 for
    float64 inputs); no validation (:func:`jet_nemotron.ops.chunk_gated_delta_rule` does it).

    Args:
        q, k: ``(B, T, H, K)``; v: ``(B, T, H, V)``; g (log decays), beta: ``(B, T, H)``.
        scale: multiplies the queries.
        initial_state: ``(B, H, K, V)`` or ``None`` (zeros).
        output_final_state: also return the state after the last step.
        chunk_size: 16, 32 or 64.

    Returns:
        ``o (B, T, H, V)`` in q's dtype and the final state ``(B, H, K, V)`` in float32 (float64
        for float64 inputs) or ``None``; differentiable in every input and the initial state.

    Example:
        >>> import torch
        >>> q = k = torch.nn.functional.normalize(torch.randn(1, 20, 2, 8), dim=-1)
        >>> v, g, beta = torch.randn(1, 20, 2, 4), -torch.rand(1, 20, 2), torch.rand(1, 20, 2)
        >>> o, S = chunk_gated_delta_rule_torch(q, k, v, g, beta, 8**-0.5, None, True, 16)
        >>> o.shape, S.shape
        (torch.Size([1, 20, 2, 4]), torch.Size([1, 2, 8, 4]))
    """
    return ChunkGatedDeltaRuleFunction.apply(
        q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size
    )
