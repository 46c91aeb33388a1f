"""The gated delta rule one step at a time: the oracle of every other form.

Per head, with the state ``S`` of shape ``(K, V)``:
``S_t = exp(g_t) S_{t-1} + k_t u_tᵀ`` with ``u_t = β_t (v_t - exp(g_t) S_{t-1}ᵀ k_t)``, i.e.
``S_t = S_{t-1} exp(g_t) (I - β_t k_t k_tᵀ) + β_t k_t v_tᵀ`` written for ``(K, V)`` states, and
``o_t = scale · S_tᵀ q_t``.
"""

from __future__ import annotations

import torch


def naive_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule by its recurrence, in float32 (float64 for float64 inputs).

    No validation, no GQA and no normalisation: the public ops do that and call this as the
    ``reference`` backend of the fused recurrent form.

    Args:
        q: ``(B, T, H, K)`` queries; k: ``(B, T, H, K)`` keys.
        v: ``(B, T, H, V)`` values.
        g: ``(B, T, H)`` log decays (``<= 0``); beta: ``(B, T, H)`` write strengths.
        scale: multiplies the queries; ``None`` is ``K ** -0.5``.
        initial_state: ``(B, H, K, V)`` or ``None`` (zeros).
        output_final_state: also return the state after the last step.

    Returns:
        ``o (B, T, H, V)`` in ``q``'s dtype and the final state ``(B, H, K, V)`` (float32 or
        float64) or ``None``.

    Example:
        >>> import torch
        >>> q = k = torch.nn.functional.normalize(torch.randn(1, 3, 2, 4), dim=-1)
        >>> v, g, beta = torch.randn(1, 3, 2, 5), -torch.rand(1, 3, 2), torch.rand(1, 3, 2)
        >>> o, S = naive_recurrent_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
        >>> o.shape, S.shape
        (torch.Size([1, 3, 2, 5]), torch.Size([1, 2, 4, 5]))
    """
    in_dtype, dtype = q.dtype, torch.promote_types(q.dtype, torch.float32)
    B, T, H, K = k.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(dtype)
    outputs = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        outputs.append(scale * torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(B, 0, H, V, dtype=dtype)
    return o.to(in_dtype), (S if output_final_state else None)
