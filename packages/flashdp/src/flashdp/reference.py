"""PyTorch references of the per-example gradient computations, without B×|θ| memory (at most
a bounded chunk of per-example weight gradients at a time).

Every function takes a layer's saved input and output gradient with the batch in the
first dimension and all other leading dimensions (sequence, ...) flattened into one:
``x: (B, T, D_in)``, ``grad_output: (B, T, D_out)``. They return either the squared L2 norm of
each example's parameter gradient, ``(B,)``, or the clipped sum Σ_b c_b·g_b for coefficients
``coef: (B,)``, shaped like the parameter. These are the CPU path and the oracle of the Triton
kernels.
"""

from __future__ import annotations

from collections.abc import Callable

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
        x: ``(B, T, D_in)``, computed in float32.
        grad_output: ``(B, T, D_out)``, computed in float32.

    Returns:
        ``(B,)`` float32.
    """
    x, grad_output = x.float(), grad_output.float()
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
        x: ``(B, T, D_in)`` float32.
        grad_output: ``(B, T, D_out)`` float32.
        coef: ``(B,)`` float32.
    """
    scaled = (grad_output.float() * coef[:, None, None]).flatten(0, 1)
    return scaled.T @ x.float().flatten(0, 1)


def linear_weight_store_clip(
    x: torch.Tensor,
    grad_output: torch.Tensor,
    coefficients: Callable[[torch.Tensor], torch.Tensor],
    chunk: int,
    with_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-layer clipping of a linear weight from stored per-example gradients, one GEMM.

    For each chunk of at most ``chunk`` examples, P_b = G_bᵀX_b is computed once (float32),
    its squared norm taken, ``coefficients`` applied to the chunk's norms and Σ_b c_b P_b added
    to the sum: the released sum is exactly the clipped gradients whose norms were measured.

    Args:
        x: ``(B, T, D_in)``, float32 or 16-bit.
        grad_output: ``(B, T, D_out)``, float32 or 16-bit.
        coefficients: maps a chunk's norms² ``(b,)`` to the multipliers ``(b,)`` of its P_b,
            on the device (no host synchronisation).
        chunk: examples per workspace of ``chunk × D_out × D_in`` float32 elements.
        with_bias: also return each example's Σ_t G_bt (the bias gradient).

    Returns:
        ``(B,)`` float32 norms² ‖P_b‖²_F, the ``(D_out, D_in)`` float32 sum, and the
        ``(B, D_out)`` float32 bias gradients (``None`` without ``with_bias``).
    """
    d_out = grad_output.shape[-1]
    out = x.new_zeros(d_out, x.shape[-1], dtype=torch.float32)
    norms = []
    for xs, gs in zip(x.split(chunk), grad_output.split(chunk), strict=True):
        per_example = torch.bmm(gs.float().transpose(1, 2), xs.float())
        norm2 = torch.linalg.vector_norm(per_example, dim=(1, 2)).square()  # no squared copy
        norms.append(norm2)
        out.add_((coefficients(norm2) @ per_example.flatten(1)).view_as(out))
    norm2 = torch.cat(norms) if norms else x.new_zeros(0, dtype=torch.float32)
    bias = grad_output.float().sum(1) if with_bias else None
    return norm2, out, bias


def embedding_norm2(
    indices: torch.Tensor, grad_output: torch.Tensor, padding_idx: int | None
) -> torch.Tensor:
    """‖Σ_t onehot(i_bt) ⊗ G_bt‖²_F per example, by sort and segment sum on the device.

    The rows of each (example, token) pair are summed explicitly (sorted by pair, summed per
    segment), then squared: the error is relative to the rows themselves, however they cancel,
    and no shape depends on the data (no host synchronisation).

    Args:
        indices: ``(B, T)`` int64.
        grad_output: ``(B, T, D)`` float32.
        padding_idx: tokens with this index receive no gradient (as in ``nn.Embedding``).

    Returns:
        ``(B,)`` float32.
    """
    batch, tokens = indices.shape
    grad_output = _mask_padding(indices, grad_output, padding_idx)
    example = torch.arange(batch, device=indices.device).repeat_interleave(tokens)
    # one key per (example, token) pair; sorted, equal keys are consecutive
    order = torch.argsort(indices.flatten() * batch + example, stable=True)
    keys = (indices.flatten() * batch + example)[order]
    starts = torch.ones_like(keys, dtype=torch.bool)
    starts[1:] = keys[1:] != keys[:-1]
    segment = starts.cumsum(0) - 1
    rows = grad_output.new_zeros(batch * tokens, grad_output.shape[-1])
    rows.index_add_(0, segment, grad_output.flatten(0, 1)[order])
    owner = torch.zeros_like(segment).scatter_(0, segment, example[order])
    return grad_output.new_zeros(batch).index_add_(0, owner, rows.square().sum(1))


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
    x: torch.Tensor, grad_output: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example gradients of a LayerNorm's weight and bias over the last dimension, from the
    statistics its forward saved.

    Args:
        x: ``(B, T, D)`` float32, the layer's input (normalised over D).
        grad_output: ``(B, T, D)`` float32.
        mean: ``(B, T, 1)`` float32, each row's mean.
        rstd: ``(B, T, 1)`` float32, each row's 1/√(var + eps).

    Returns:
        ``(B, D)`` weight gradients Σ_t G_bt ⊙ x̂_bt and ``(B, D)`` bias gradients Σ_t G_bt.
    """
    return (grad_output * ((x - mean) * rstd)).sum(1), grad_output.sum(1)


def rms_norm_per_example(
    x: torch.Tensor, grad_output: torch.Tensor, rstd: torch.Tensor
) -> torch.Tensor:
    """Per-example gradients ``(B, D)`` of an RMSNorm's weight, Σ_t G_bt ⊙ x_bt·rstd_bt, for
    ``x, grad_output: (B, T, D)`` float32 and the forward's ``rstd: (B, T, 1)`` float32
    (1/√(mean(x²) + eps) per row)."""
    return (grad_output * (x * rstd)).sum(1)
