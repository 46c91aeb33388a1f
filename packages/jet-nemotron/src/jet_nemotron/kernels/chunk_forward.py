"""Chunked gated delta rule, forward stages: one kernel per stage of ``jet_nemotron.ops.chunk``.

Layout (FLA's): q, k ``(B, T, H, K)``, v and o ``(B, T, H, V)``, g, beta and the in-chunk
cumulative decay gc ``(B, T, H)``, all contiguous; ``A`` and ``Ai = (I + A)⁻¹`` ``(B, T, H, BT)``
(row ``t`` holds its chunk's row); the chunk states ``h (B, NT, H, K, V)``; initial and final
states ``(B, H, K, V)`` float32. Nothing is padded: rows past ``T`` are masked loads of 0, and gc
there is read as the chunk's last valid value (:func:`load_chunk_gates`), which is what zero
padding of ``g`` would give. Arithmetic is float32; ``tl.dot`` takes float32 tiles at ``PRECISION``
(full ``"ieee"`` for float32 inputs) or, for float16/bfloat16 inputs, tiles in the inputs' dtype
with float32 accumulation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.triton_utils import autotune, cdiv, device_guard, next_power_of_2

SOLVE_BLOCK = 16  # diagonal blocks of solve_tril, inverted by row recursion
MAX_TILE = 64  # head-dimension tile of the kernels that loop over K or V
# Launch options tried on the GPU (the interpreter keeps the first): configurations whose
# software pipelining runs out of shared memory (large K in float32) are dropped by the autotuner.
LAUNCH_CONFIGS = [
    triton.Config({}, num_warps=warps, num_stages=stages)
    for warps in (4, 8, 2)
    for stages in (2, 1, 3)
]


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: full float32 for float32 inputs (the tests compare with a
    float32 reference), TF32 where float32 tiles meet 16-bit inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


def head_tile(dim: int) -> int:
    """Tile of a head dimension that a kernel loops over: a power of two in ``[16, 64]``."""
    return min(max(16, next_power_of_2(dim)), MAX_TILE)


@triton.jit
def chunk_rows(i_t, i_bh, T, H, BT: tl.constexpr):
    """Rows of chunk ``i_t`` of head ``i_bh``: positions ``o_t``, their mask ``o_t < T`` and
    their indices into the flattened ``(B, T, H)``."""
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    return o_t, m_t, (i_b * T + o_t) * H + i_h


@triton.jit
def state_tile(H, K, V, BK: tl.constexpr, BV: tl.constexpr):
    """The program of a state kernel, one per (V tile, b·h): ``(i_v, i_bh, i_b, i_h)``, the K and
    V offsets, the tile's mask and its offsets in a row-major ``(K, V)`` state."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_s = (o_k < K)[:, None] & (o_v < V)[None, :]
    tile = o_k[:, None] * V + o_v[None, :]
    return i_v, i_bh, i_bh // H, i_bh % H, o_k, o_v, m_s, tile


@triton.jit
def load_tile(ptr, rows, m_t, o_d, D):
    """``ptr[rows, o_d]`` of a row-major ``(-, D)`` matrix, 0 outside the rows' and ``D``'s
    masks."""
    return tl.load(
        ptr + rows[:, None] * D + o_d[None, :], mask=m_t[:, None] & (o_d < D)[None, :], other=0.0
    )


@triton.jit
def store_tile(ptr, value, rows, m_t, o_d, D):
    """``ptr[rows, o_d] = value`` (cast to ``ptr``'s dtype) inside the masks."""
    tl.store(
        ptr + rows[:, None] * D + o_d[None, :],
        value.to(ptr.dtype.element_ty),
        mask=m_t[:, None] & (o_d < D)[None, :],
    )


@triton.jit
def load_chunk_gates(gc_ptr, i_t, i_bh, T, H, BT: tl.constexpr):
    """``gc (BT,)`` of a chunk, rows past ``T`` holding the last valid value, and that value."""
    i_b = i_bh // H
    i_h = i_bh % H
    _, m_t, rows = chunk_rows(i_t, i_bh, T, H, BT)
    last = tl.minimum(T, i_t * BT + BT) - 1
    g_last = tl.load(gc_ptr + (i_b * T + last) * H + i_h)
    gc = tl.load(gc_ptr + rows, mask=m_t, other=0.0)
    return tl.where(m_t, gc, g_last), g_last


@triton.jit
def causal_decay(gc, BT: tl.constexpr, STRICT: tl.constexpr):
    """``exp(gc_i - gc_j)`` for ``j <= i`` (``j < i`` if ``STRICT``), 0 elsewhere; masked before
    the exponential, which would overflow above the diagonal."""
    o_i = tl.arange(0, BT)
    keep = o_i[:, None] > o_i[None, :] if STRICT else o_i[:, None] >= o_i[None, :]
    return tl.exp(tl.where(keep, gc[:, None] - gc[None, :], float("-inf")))


@triton.jit
def _chunk_local_cumsum_kernel(
    g_ptr, out_ptr, T, H, BT: tl.constexpr, REVERSE: tl.constexpr
):  # fmt: skip
    """One program per (chunk, b·h): the cumulative sum of ``g`` inside the chunk (from its end
    if ``REVERSE``), float32."""
    _, m_t, rows = chunk_rows(tl.program_id(0), tl.program_id(1).to(tl.int64), T, H, BT)
    g = tl.load(g_ptr + rows, mask=m_t, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, tl.cumsum(g, 0, reverse=REVERSE), mask=m_t)


@autotune(LAUNCH_CONFIGS, key=["K", "BT"])
@triton.jit
def _chunk_scaled_dot_kkt_kernel(
    k_ptr, beta_ptr, gc_ptr, A_ptr, T, H, K,
    BT: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (chunk, b·h): ``A = strict_lower((β ⊙ k) kᵀ ⊙ e^{gc_i - gc_j})``."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    _, m_t, rows = chunk_rows(i_t, i_bh, T, H, BT)
    beta = tl.load(beta_ptr + rows, mask=m_t, other=0.0).to(tl.float32)
    A = tl.zeros((BT, BT), dtype=tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        k = load_tile(k_ptr, rows, m_t, o_k, K)
        kb = (k.to(tl.float32) * beta[:, None]).to(k.dtype)
        A += tl.dot(kb, tl.trans(k), input_precision=PRECISION)
    gc, _ = load_chunk_gates(gc_ptr, i_t, i_bh, T, H, BT)
    A = A * causal_decay(gc, BT, True)
    store_tile(A_ptr, A, rows, m_t, tl.arange(0, BT), BT)


@triton.jit
def _solve_tril_kernel(
    A_ptr, Ai_ptr, T, H,
    BT: tl.constexpr, NB: tl.constexpr, LEVELS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per (chunk, b·h): ``Ai = (I + A)⁻¹`` by blocked forward substitution (see
    ``jet_nemotron.ops.chunk.solve_tril``). The ``NB`` diagonal blocks ``(NB, BLOCK, BLOCK)`` are
    inverted together, one row per step from rows of ``A`` read from memory; the block-diagonal
    inverse is then widened to ``(BT, BT)`` and merged by doubling, ``LEVELS = log2(NB)`` times
    ``Ai ← Ai - Ai (A ⊙ joining) Ai``."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_m = tl.arange(0, NB)
    o_r = tl.arange(0, BLOCK)
    eye = (o_r[:, None] == o_r[None, :]).to(tl.float32)
    X = tl.zeros((NB, BLOCK, BLOCK), dtype=tl.float32) + eye[None, :, :]
    for i in range(1, BLOCK):
        t_row = i_t * BT + o_m * BLOCK + i
        row_ptr = A_ptr + ((i_b * T + t_row) * H + i_h) * BT + o_m * BLOCK
        a = tl.load(
            row_ptr[:, None] + o_r[None, :],
            mask=(t_row < T)[:, None] & (o_r < i)[None, :],
            other=0.0,
        )
        row = (o_r == i).to(tl.float32)[None, :] - tl.sum(a[:, :, None] * X, 1)
        X = tl.where((o_r == i)[None, :, None], row[:, None, :], X)
    diagonal = (o_m[:, None] == o_m[None, :]).to(tl.float32)
    Ai = tl.reshape(X[:, :, None, :] * diagonal[:, None, :, None], (BT, BT))
    _, m_t, rows = chunk_rows(i_t, i_bh, T, H, BT)
    o_i = tl.arange(0, BT)
    if NB > 1:
        A = load_tile(A_ptr, rows, m_t, o_i, BT)
        for level in tl.static_range(LEVELS):
            size = BLOCK << level
            joining = (o_i[:, None] // (2 * size) == o_i[None, :] // (2 * size)) & (
                o_i[:, None] // size > o_i[None, :] // size
            )
            merged = tl.dot(Ai, tl.where(joining, A, 0.0), input_precision="ieee")
            Ai = Ai - tl.dot(merged, Ai, input_precision="ieee")
    store_tile(Ai_ptr, Ai, rows, m_t, o_i, BT)


@autotune(LAUNCH_CONFIGS, key=["K", "V", "BT"])
@triton.jit
def _recompute_w_u_kernel(
    k_ptr, v_ptr, beta_ptr, gc_ptr, Ai_ptr, w_ptr, u_ptr, T, H, K, V,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (chunk, b·h): ``w = Ai (β e^{gc} ⊙ k)``, ``u = Ai (β ⊙ v)``."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    _, m_t, rows = chunk_rows(i_t, i_bh, T, H, BT)
    beta = tl.load(beta_ptr + rows, mask=m_t, other=0.0).to(tl.float32)
    gc, _ = load_chunk_gates(gc_ptr, i_t, i_bh, T, H, BT)
    Ai = load_tile(Ai_ptr, rows, m_t, tl.arange(0, BT), BT)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        v = load_tile(v_ptr, rows, m_t, o_v, V)
        vb = (v.to(tl.float32) * beta[:, None]).to(v.dtype)
        u = tl.dot(Ai.to(v.dtype), vb, input_precision=PRECISION)
        store_tile(u_ptr, u, rows, m_t, o_v, V)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        k = load_tile(k_ptr, rows, m_t, o_k, K)
        kb = (k.to(tl.float32) * (beta * tl.exp(gc))[:, None]).to(k.dtype)
        w = tl.dot(Ai.to(k.dtype), kb, input_precision=PRECISION)
        store_tile(w_ptr, w, rows, m_t, o_k, K)


@autotune(LAUNCH_CONFIGS, key=["K", "V", "BT"])
@triton.jit
def _chunk_fwd_h_kernel(
    k_ptr, w_ptr, u_ptr, gc_ptr, h0_ptr, h_ptr, v_new_ptr, ht_ptr, T, H, K, V, NT,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_INITIAL: tl.constexpr, STORE_FINAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (V tile, b·h), a loop over the chunks with the ``(BK, BV)`` state tile in
    registers: store ``h`` (the state entering the chunk), ``v_new = u - w S``,
    ``S ← e^{gc_C} S + (k ⊙ e^{gc_C - gc})ᵀ v_new``."""
    _, i_bh, i_b, i_h, o_k, o_v, m_s, tile = state_tile(H, K, V, BK, BV)
    S = tl.zeros((BK, BV), dtype=tl.float32)
    if HAS_INITIAL:
        S = tl.load(h0_ptr + i_bh * K * V + tile, mask=m_s, other=0.0).to(tl.float32)
    for i_t in range(NT):
        _, m_t, rows = chunk_rows(i_t, i_bh, T, H, BT)
        state = (i_b * NT + i_t) * H + i_h
        tl.store(h_ptr + state * K * V + tile, S.to(h_ptr.dtype.element_ty), mask=m_s)
        w = load_tile(w_ptr, rows, m_t, o_k, K)
        u = load_tile(u_ptr, rows, m_t, o_v, V).to(tl.float32)
        v_new = u - tl.dot(w, S.to(w.dtype), input_precision=PRECISION)
        store_tile(v_new_ptr, v_new, rows, m_t, o_v, V)
        gc, g_last = load_chunk_gates(gc_ptr, i_t, i_bh, T, H, BT)
        k = load_tile(k_ptr, rows, m_t, o_k, K)
        k_decayed = (k.to(tl.float32) * tl.exp(g_last - gc)[:, None]).to(k.dtype)
        S = S * tl.exp(g_last) + tl.dot(
            tl.trans(k_decayed), v_new.to(k.dtype), input_precision=PRECISION
        )
    if STORE_FINAL:
        tl.store(ht_ptr + i_bh * K * V + tile, S, mask=m_s)


@autotune(LAUNCH_CONFIGS, key=["K", "V", "BT"])
@triton.jit
def _chunk_fwd_o_kernel(
    q_ptr, k_ptr, v_new_ptr, h_ptr, gc_ptr, o_ptr, scale, T, H, K, V, NT,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (V tile, chunk, b·h):
    ``o = scale (q ⊙ e^{gc}) h + scale · tril(q kᵀ ⊙ e^{gc_i - gc_j}) v_new``."""
    i_v = tl.program_id(0)
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    _, m_t, rows = chunk_rows(i_t, i_bh, T, H, BT)
    state = ((i_bh // H) * NT + i_t) * H + i_bh % H
    o_v = i_v * BV + tl.arange(0, BV)
    inter = tl.zeros((BT, BV), dtype=tl.float32)
    scores = tl.zeros((BT, BT), dtype=tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        q = load_tile(q_ptr, rows, m_t, o_k, K)
        k = load_tile(k_ptr, rows, m_t, o_k, K)
        h = load_tile(h_ptr + state * K * V, o_k, o_k < K, o_v, V)
        inter += tl.dot(q, h.to(q.dtype), input_precision=PRECISION)
        scores += tl.dot(q, tl.trans(k), input_precision=PRECISION)
    gc, _ = load_chunk_gates(gc_ptr, i_t, i_bh, T, H, BT)
    scores = scores * causal_decay(gc, BT, False)
    v_new = load_tile(v_new_ptr, rows, m_t, o_v, V)
    intra = tl.dot(scores.to(v_new.dtype), v_new, input_precision=PRECISION)
    o = scale * (inter * tl.exp(gc)[:, None] + intra)
    store_tile(o_ptr, o, rows, m_t, o_v, V)


def chunk_local_cumsum(g: torch.Tensor, chunk_size: int, reverse: bool = False) -> torch.Tensor:
    """In-chunk cumulative sum of ``g (B, T, H)`` (any float dtype): float32 ``(B, T, H)``."""
    B, T, H = g.shape
    out = torch.empty(B, T, H, device=g.device, dtype=torch.float32)
    with device_guard(g):
        _chunk_local_cumsum_kernel[(cdiv(T, chunk_size), B * H)](
            g, out, T, H, BT=chunk_size, REVERSE=reverse
        )
    return out


def chunk_scaled_dot_kkt(
    k: torch.Tensor, beta: torch.Tensor, gc: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """``A (B, T, H, BT)`` float32 from k ``(B, T, H, K)``, beta and gc ``(B, T, H)``."""
    B, T, H, K = k.shape
    A = torch.empty(B, T, H, chunk_size, device=k.device, dtype=torch.float32)
    with device_guard(k):
        _chunk_scaled_dot_kkt_kernel[(cdiv(T, chunk_size), B * H)](
            k, beta, gc, A, T, H, K,
            BT=chunk_size, BK=head_tile(K), PRECISION=dot_precision(k.dtype),
        )  # fmt: skip
    return A


def solve_tril(A: torch.Tensor) -> torch.Tensor:
    """``(I + A)⁻¹`` of each chunk's strictly lower triangular ``A (B, T, H, BT)``: float32."""
    B, T, H, BT = A.shape
    Ai = torch.empty_like(A)
    NB = BT // SOLVE_BLOCK
    with device_guard(A):
        _solve_tril_kernel[(cdiv(T, BT), B * H)](
            A, Ai, T, H, BT=BT, NB=NB, LEVELS=NB.bit_length() - 1, BLOCK=SOLVE_BLOCK
        )
    return Ai


def recompute_w_u(
    k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, gc: torch.Tensor, Ai: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w (B, T, H, K)`` and ``u (B, T, H, V)`` in k's dtype."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    BT = Ai.shape[-1]
    w = torch.empty_like(k)
    u = torch.empty_like(v)
    with device_guard(k):
        _recompute_w_u_kernel[(cdiv(T, BT), B * H)](
            k, v, beta, gc, Ai, w, u, T, H, K, V,
            BT=BT, BK=head_tile(K), BV=head_tile(V), PRECISION=dot_precision(k.dtype),
        )  # fmt: skip
    return w, u


def state_tiles(K: int, V: int) -> tuple[int, int]:
    """``(BK, BV)`` of the kernels that keep a state tile in registers: all of ``K``
    (``K <= 256``) and a V tile of at most 8192 / BK elements."""
    BK = max(16, next_power_of_2(K))
    return BK, min(max(16, next_power_of_2(V)), max(16, 8192 // BK), MAX_TILE)


def chunk_fwd_h(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    gc: torch.Tensor,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``h (B, NT, H, K, V)`` and ``v_new (B, T, H, V)`` in k's dtype, and the final state
    ``(B, H, K, V)`` float32 (or ``None``)."""
    B, T, H, K = k.shape
    V = u.shape[-1]
    NT = cdiv(T, chunk_size)
    h = k.new_empty(B, NT, H, K, V)
    v_new = torch.empty_like(u)
    final = k.new_empty(B, H, K, V, dtype=torch.float32) if output_final_state else None
    BK, BV = state_tiles(K, V)
    with device_guard(k):
        _chunk_fwd_h_kernel[(cdiv(V, BV), B * H)](
            k, w, u, gc, initial_state, h, v_new, final, T, H, K, V, NT,
            BT=chunk_size, BK=BK, BV=BV, HAS_INITIAL=initial_state is not None,
            STORE_FINAL=output_final_state, PRECISION=dot_precision(k.dtype),
        )  # fmt: skip
    return h, v_new, final


def chunk_fwd_o(
    q: torch.Tensor,
    k: torch.Tensor,
    v_new: torch.Tensor,
    h: torch.Tensor,
    gc: torch.Tensor,
    scale: float,
    chunk_size: int,
) -> torch.Tensor:
    """``o (B, T, H, V)`` in q's dtype."""
    B, T, H, K = q.shape
    V = v_new.shape[-1]
    NT = cdiv(T, chunk_size)
    o = torch.empty_like(v_new, dtype=q.dtype)
    BV = head_tile(V)
    with device_guard(q):
        _chunk_fwd_o_kernel[(cdiv(V, BV), NT, B * H)](
            q, k, v_new, h, gc, o, scale, T, H, K, V, NT,
            BT=chunk_size, BK=head_tile(K), BV=BV, PRECISION=dot_precision(q.dtype),
        )  # fmt: skip
    return o
