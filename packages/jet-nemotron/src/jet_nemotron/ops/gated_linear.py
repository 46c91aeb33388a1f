"""Gated linear attention with a per-key log decay, in PyTorch: naive, chunked and recurrent.

FLA's ``chunk_gla`` convention: ``q, k (B, T, H, K)``, ``v (B, T, H, V)``, log decay ``g <= 0``,
state ``S (B, H, K, V)`` in float32 (float64 for float64 inputs)::

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ,        o_t = scale · S_tᵀ q_t.

The decay ``g`` takes three shapes:

* ``(B, T, H, K)``: one decay per key dim (GLA);
* ``(B, T, H)``: one decay per head and token, broadcast over ``K`` (Mamba2, Gated DeltaNet);
* ``(H,)``: one constant decay per head (retention, ``g_h = log γ_h``).

All three forms compute the same function and differ in cost: :func:`naive_recurrent_gla` (the
literal loop, the oracle), :func:`chunk_gla` (chunks of 16, 32 or 64 tokens: for training and
prefill) and :func:`fused_recurrent_gla` (one step per token: for decoding and short prompts).
Everything is differentiable through plain torch ops; the computation runs in float32 (float64
for float64 inputs) and the output comes back in ``q``'s dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from jet_nemotron.ops.validation import FLOAT_DTYPES, check_chunk_size, check_scale

Output = tuple[torch.Tensor, torch.Tensor | None]


def _check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> torch.Tensor:
    """Validate the op's inputs (types, shapes, dtypes, devices); return ``g`` as
    ``(B, T, H, K)`` or ``(B, T, H, 1)``."""
    named = {"q": q, "k": k, "v": v, "g": g}
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float32, float16, bfloat16 or float64, got {x.dtype}")
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(
            f"q and k must both be (B, T, H, K), got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    B, T, H, K = q.shape
    if v.dim() != 4 or v.shape[:3] != (B, T, H):
        raise ValueError(f"v must be (B, T, H, V) with (B, T, H) = {(B, T, H)}, got {v.shape}")
    if len({q.dtype, k.dtype, v.dtype}) != 1:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if min(B, T, H, K, v.shape[-1]) < 1:
        raise ValueError(f"every dim of q {tuple(q.shape)} and v {tuple(v.shape)} must be >= 1")
    if g.shape == (B, T, H, K):
        decay = g
    elif g.shape == (B, T, H):
        decay = g[..., None]
    elif g.shape == (H,):
        decay = g[:, None].expand(B, T, H, 1)
    else:
        raise ValueError(
            f"g must be (B, T, H, K) = {(B, T, H, K)} (per key dim), (B, T, H) = {(B, T, H)} "
            f"(per head) or (H,) = {(H,)} (constant per head), got {tuple(g.shape)}"
        )
    tensors = [q, k, v, g]
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or not initial_state.is_floating_point():
            raise TypeError("initial_state must be a floating-point torch.Tensor (B, H, K, V)")
        expected = (B, H, K, v.shape[-1])
        if initial_state.shape != expected:
            raise ValueError(
                f"initial_state must be (B, H, K, V) = {expected}, got {tuple(initial_state.shape)}"
            )
        tensors.append(initial_state)
    devices = {x.device for x in tensors}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    return decay


def _prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None,
    initial_state: torch.Tensor | None,
) -> tuple[tuple[torch.Tensor, ...], float, torch.Tensor]:
    """Validated inputs in ``(B, H, T, ·)`` layout and the compute dtype, the scale and the
    initial state (zeros when ``None``)."""
    decay = _check_inputs(q, k, v, g, initial_state)
    scale = check_scale(scale, q.shape[-1])
    dtype = torch.promote_types(q.dtype, torch.float32)
    q, k, v, decay = (x.transpose(1, 2).to(dtype) for x in (q, k, v, decay))
    B, H, _, K, V = *q.shape, v.shape[-1]
    state = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(dtype)
    return (q, k, v, decay), scale, state


def _finish(o: torch.Tensor, dtype: torch.dtype, state: torch.Tensor, final: bool) -> Output:
    """``o (B, H, T, V)`` back to ``(B, T, H, V)`` in ``dtype``; the state if asked for."""
    return o.transpose(1, 2).to(dtype), (state if final else None)


def naive_recurrent_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> Output:
    """The recurrence written out token by token: the oracle of the other forms.

    Args:
        q: ``(B, T, H, K)`` queries.
        k: ``(B, T, H, K)`` keys.
        v: ``(B, T, H, V)`` values (q, k, v of one floating dtype).
        g: log decay ``(B, T, H, K)``, ``(B, T, H)`` or ``(H,)`` (see the module docstring),
            usually ``<= 0``.
        scale: query scale; ``None`` is ``K ** -0.5``.
        initial_state: ``(B, H, K, V)`` or ``None`` (zeros).
        output_final_state: also return the state after the last token.

    Returns:
        ``(o (B, T, H, V) in q's dtype, final state (B, H, K, V) in float32/float64 or None)``.

    Example:
        >>> import torch
        >>> q = k = torch.randn(1, 3, 2, 4, dtype=torch.float64)
        >>> o, S = naive_recurrent_gla(q, k, q, -torch.rand(1, 3, 2), output_final_state=True)
        >>> o.shape, S.shape, S.dtype
        (torch.Size([1, 3, 2, 4]), torch.Size([1, 2, 4, 4]), torch.float64)
    """
    dtype = q.dtype
    (q, k, v, decay), scale, S = _prepare(q, k, v, g, scale, initial_state)
    outputs = []
    for t in range(q.shape[2]):
        S = decay[:, :, t, :, None].exp() * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        outputs.append(scale * (q[:, :, t, :, None] * S).sum(-2))
    return _finish(torch.stack(outputs, dim=2), dtype, S, output_final_state)


def fused_recurrent_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> Output:
    """One step per token in output-first form: for decoding and short prompts.

    Each step reads the previous state once, ``o_t = scale · ((q_t ⊙ exp(g_t))ᵀ S_{t-1} +
    (q_t · k_t) v_t)``, then writes ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ`` (the same function
    as :func:`naive_recurrent_gla`, as matrix products). Arguments and result as
    :func:`naive_recurrent_gla`.

    Example:
        >>> import torch
        >>> q = k = v = torch.randn(2, 1, 3, 8)
        >>> S0 = torch.zeros(2, 3, 8, 8)
        >>> o, S = fused_recurrent_gla(
        ...     q, k, v, -torch.rand(2, 1, 3, 8), initial_state=S0, output_final_state=True
        ... )
        >>> o.shape, S.shape
        (torch.Size([2, 1, 3, 8]), torch.Size([2, 3, 8, 8]))
    """
    dtype = q.dtype
    (q, k, v, decay), scale, S = _prepare(q, k, v, g, scale, initial_state)
    outputs = []
    for t in range(q.shape[2]):
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]
        alpha = decay[:, :, t].exp()  # (B, H, K) or (B, H, 1)
        read = ((q_t * alpha)[:, :, None] @ S)[:, :, 0] + (q_t * k_t).sum(-1, keepdim=True) * v_t
        outputs.append(scale * read)
        S = alpha[..., None] * S + k_t[..., None] * v_t[..., None, :]
    return _finish(torch.stack(outputs, dim=2), dtype, S, output_final_state)


def _pad_to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``(B, H, T, D) -> (B, H, N, C, D)`` with zeros after the last token."""
    pad = -x.shape[2] % chunk_size
    return F.pad(x, (0, 0, 0, pad)).unflatten(2, (-1, chunk_size))


def chunk_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    chunk_size: int = 64,
) -> Output:
    """Chunked form: exact attention inside each chunk, the decayed state between chunks.

    With ``b_i = Σ_{s <= i} g_s`` the decay accumulated from the chunk's start (``b`` falls, as
    ``g <= 0``), a chunk with incoming state ``S`` gives

        o_i = scale · (Σ_{j <= i} (q_i ⊙ exp(b_i - b_j))ᵀ k_j v_j + (q_i ⊙ exp(b_i))ᵀ S),
        S' = diag(exp(b_C)) S + Σ_j (k_j ⊙ exp(b_C - b_j)) v_jᵀ.

    Every exponent is ``<= 0`` for ``g <= 0``: the pairwise differences are masked to ``j <= i``
    *before* ``exp`` (no ``exp(-b_j)`` factor that overflows under strong decay). The padded tail
    of the last chunk has ``k = 0, g = 0`` and changes nothing. Memory: the intra-chunk decay
    tensor holds ``C · K`` floats per token and head for per-key decays (``C`` for per-head
    ones), so chunk 16 is the lightest. The other arguments are those of
    :func:`naive_recurrent_gla`.

    Args:
        chunk_size: ``C``, one of 16, 32, 64.

    Returns:
        as :func:`naive_recurrent_gla`.

    Example:
        >>> import torch
        >>> q = k = torch.randn(1, 20, 2, 4)
        >>> o, _ = chunk_gla(q, k, torch.randn(1, 20, 2, 6), -torch.rand(2), chunk_size=16)
        >>> o.shape
        torch.Size([1, 20, 2, 6])
    """
    check_chunk_size(chunk_size)
    dtype, T = q.dtype, q.shape[1]
    (q, k, v, decay), scale, S = _prepare(q, k, v, g, scale, initial_state)
    q, k, v, decay = (_pad_to_chunks(x, chunk_size) for x in (q, k, v, decay))
    b = decay.cumsum(-2)  # (B, H, N, C, K or 1)
    b_last = b[..., -1:, :]
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    # exp(b_i - b_j) for j <= i, zero above the diagonal; masked before exp so no overflow
    pairwise = b[..., :, None, :] - b[..., None, :, :]  # (B, H, N, C, C, K or 1)
    pairwise = pairwise.masked_fill(~causal[..., None], float("-inf")).exp()
    if decay.shape[-1] == 1:
        scores = (q @ k.transpose(-1, -2)) * pairwise[..., 0]
    else:
        scores = (q[..., :, None, :] * k[..., None, :, :] * pairwise).sum(-1)
    o_intra = (scale * scores) @ v
    q_decayed = scale * q * b.exp()
    k_decayed = k * (b_last - b).exp()
    chunk_decay = b_last[..., 0, :, None].exp()  # (B, H, N, K or 1, 1)
    o_inter = []
    for n in range(q.shape[2]):
        o_inter.append(q_decayed[:, :, n] @ S)
        S = chunk_decay[:, :, n] * S + k_decayed[:, :, n].transpose(-1, -2) @ v[:, :, n]
    o = (o_intra + torch.stack(o_inter, dim=2)).flatten(2, 3)[:, :, :T]
    return _finish(o, dtype, S, output_final_state)
