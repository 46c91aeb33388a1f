"""PyTorch references of the per-example gradient computations, without B×|θ| memory.

Every function takes a layer's saved input and output gradient, in float32, with the batch in the
first dimension and all other leading dimensions (sequence, ...) flattened into one:
``x: (B, T, D_in)``, ``grad_output: (B, T, D_out)``. They return either the squared L2 norm of
each example's parameter gradient, ``(B,)``, or the clipped sum Σ_b c_b·g_b for coefficients
``coef: (B,)``, shaped like the parameter. These are the CPU path and the oracle of the Triton
kernels.
"""

from __future__ import annotations

import torch

# Per-example weight gradients are materialised (for the norm only) in chunks of at most this many
# elements, so the extra memory stays bounded whatever the batch size.
MAX_CHUNK_ELEMENTS = 1 << 22

# The Gram form Σ_{t,t'} ⟨x_t, x_t'⟩⟨g_t, g_t'⟩ cancels when rows oppose each other; its float32
# rounding error is up to ~(D + T)·2⁻²⁴ of S = (Σ_t ‖x_t‖‖g_t‖)², so a crafted example could have
# its norm underestimated by orders of magnitude and escape its clipping bound. Examples whose
# Gram norm² is below this fraction of S are recomputed from explicit per-example gradients
# (error relative to their own entries, as in the clipped sum); above it the Gram form's
# relative error stays below (D + T)·2⁻²⁴ / 1e-3, about 2% at D + T = 400 in the worst case.
GRAM_CANCELLATION = 1e-3


def linear_weight_norm2(x: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """‖G_bᵀ X_b‖²_F for every example b of a linear layer ``y = x Wᵀ``.

    Picks the cheaper of two exact methods for the shape:

    * ``T == 1``: ‖g_b‖²·‖x_b‖² (rank one).
    * Gram ("ghost") form ⟨X_b X_bᵀ, G_b G_bᵀ⟩: O(B·T²·(D_in + D_out)) time, B·T² memory; used
      when ``T·(D_in + D_out) <= D_in·D_out``, except for examples whose rows cancel (see
      :data:`GRAM_CANCELLATION`), which take the blockwise form.
    * Blockwise: G_bᵀX_b for a chunk of examples at a time (at most
      :data:`MAX_CHUNK_ELEMENTS` elements), squared and summed, then discarded.

    Args:
        x: ``(B, T, D_in)`` float32.
        grad_output: ``(B, T, D_out)`` float32.

    Returns:
        ``(B,)`` float32.
    """
    _, tokens, d_in = x.shape
    d_out = grad_output.shape[-1]
    if tokens == 1:
        return x.square().sum((1, 2)) * grad_output.square().sum((1, 2))
    if tokens * (d_in + d_out) <= d_in * d_out:
        gram_x = torch.bmm(x, x.transpose(1, 2))
        gram_g = torch.bmm(grad_output, grad_output.transpose(1, 2))
        norm2 = (gram_x * gram_g).sum((1, 2))
        scale = (x.norm(dim=-1) * grad_output.norm(dim=-1)).sum(1).square()
        cancelled = norm2 < GRAM_CANCELLATION * scale
        if bool(cancelled.any()):
            norm2[cancelled] = _blockwise_norm2(x[cancelled], grad_output[cancelled])
        return norm2
    return _blockwise_norm2(x, grad_output)


def _blockwise_norm2(x: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    chunk = max(1, MAX_CHUNK_ELEMENTS // (x.shape[-1] * grad_output.shape[-1]))
    norms = [
        torch.bmm(g.transpose(1, 2), xs).square().sum((1, 2))
        for g, xs in zip(grad_output.split(chunk), x.split(chunk), strict=True)
    ]
    return torch.cat(norms) if norms else x.new_zeros(x.shape[0])


def linear_weight_clipped_sum(
    x: torch.Tensor, grad_output: torch.Tensor, coef: torch.Tensor
) -> torch.Tensor:
    """Σ_b c_b G_bᵀX_b in one GEMM (book-keeping): ``(D_out, D_in)`` float32.

    Args:
        x: ``(B, T, D_in)``; grad_output: ``(B, T, D_out)``; coef: ``(B,)``, all float32.
    """
    scaled = (grad_output * coef[:, None, None]).flatten(0, 1)
    return scaled.T @ x.flatten(0, 1)


def bias_per_example(grad_output: torch.Tensor) -> torch.Tensor:
    """Each example's bias gradient Σ_t G_bt: ``(B, D_out)`` (activation-sized, not B×|W|)."""
    return grad_output.sum(1)


def embedding_norm2(
    indices: torch.Tensor, grad_output: torch.Tensor, padding_idx: int | None
) -> torch.Tensor:
    """‖Σ_t onehot(i_bt) ⊗ G_bt‖²_F per example, via Σ_{t,t'} [i_bt = i_bt'] ⟨G_bt, G_bt'⟩.

    Args:
        indices: ``(B, T)`` int64.
        grad_output: ``(B, T, D)`` float32.
        padding_idx: tokens with this index receive no gradient (as in ``nn.Embedding``).

    Returns:
        ``(B,)`` float32.
    """
    grad_output = _mask_padding(indices, grad_output, padding_idx)
    same = indices[:, :, None] == indices[:, None, :]
    gram = torch.bmm(grad_output, grad_output.transpose(1, 2))
    norm2 = (gram * same).sum((1, 2))
    row_norms = grad_output.norm(dim=-1)
    scale = (row_norms[:, :, None] * row_norms[:, None, :] * same).sum((1, 2))
    for b in (norm2 < GRAM_CANCELLATION * scale).nonzero().flatten().tolist():
        # rows of one token cancel (see GRAM_CANCELLATION): sum them explicitly, per token
        tokens, inverse = indices[b].unique(return_inverse=True)
        rows = grad_output.new_zeros(len(tokens), grad_output.shape[-1])
        norm2[b] = rows.index_add_(0, inverse, grad_output[b]).square().sum()
    return norm2


def embedding_clipped_sum(
    indices: torch.Tensor,
    grad_output: torch.Tensor,
    coef: torch.Tensor,
    num_embeddings: int,
    padding_idx: int | None,
) -> torch.Tensor:
    """Σ_b c_b Σ_t onehot(i_bt) ⊗ G_bt: ``(num_embeddings, D)`` float32."""
    grad_output = _mask_padding(indices, grad_output, padding_idx)
    out = grad_output.new_zeros(num_embeddings, grad_output.shape[-1])
    scaled = (grad_output * coef[:, None, None]).flatten(0, 1)
    return out.index_add_(0, indices.flatten(), scaled)


def _mask_padding(
    indices: torch.Tensor, grad_output: torch.Tensor, padding_idx: int | None
) -> torch.Tensor:
    if padding_idx is None:
        return grad_output
    return grad_output.masked_fill((indices == padding_idx)[..., None], 0.0)


def layer_norm_per_example(
    x: torch.Tensor, grad_output: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example gradients of a LayerNorm's weight and bias over the last dimension.

    Args:
        x: ``(B, T, D)`` float32, the layer's input (normalised over D).
        grad_output: ``(B, T, D)`` float32.
        eps: the layer's epsilon.

    Returns:
        ``(B, D)`` weight gradients Σ_t G_bt ⊙ x̂_bt and ``(B, D)`` bias gradients Σ_t G_bt.
    """
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    normalized = (x - mean) * torch.rsqrt(var + eps)
    return (grad_output * normalized).sum(1), grad_output.sum(1)


def rms_norm_per_example(x: torch.Tensor, grad_output: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-example gradients ``(B, D)`` of an RMSNorm's weight, Σ_t G_bt ⊙ x_bt / rms(x_bt), for
    ``x, grad_output: (B, T, D)`` float32."""
    return (grad_output * x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)).sum(1)
