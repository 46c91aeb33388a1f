"""Private xLSTM: flashdp on tfla-mlstm's ``xLSTMLM`` (reference backend, float32).

``xLSTMLM`` holds a trainable tensor that no fused DP layer covers: each mLSTM layer's per-head norm
weight (a raw ``nn.Parameter``); its default head reuses the embedding matrix directly. Without
the fallback this is refused, naming the modules; with ``fallback="vmap"`` the untied model
(``tie_embeddings=False``) trains with its embedding, RMS norms, FFN and head fused and the mLSTM
layers clipped per example under vmap. The tied head cannot
be clipped per layer (one parameter, two uses) and fails loudly.

Oracle: brute-force per-example gradients of the unmodified model (``private_oracle``), with the
model run block by block (``xLSTMLM.forward`` validates token ids with data-dependent Python
control flow, which vmap cannot trace).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flashdp
from tfla_mlstm import xLSTMConfig, xLSTMLM

sys.path.insert(0, str(Path(__file__).parent))

from private_oracle import clip_and_sum, per_example_gradients, relative_error, total_norms

VOCAB, BATCH, LENGTH = 32, 4, 20
# float32; the private and oracle gradients are the same products summed in another order
# (observed <= 1e-6 of the largest entry through two blocks); 1e-5 leaves room for other
# platforms, while an example clipped with a wrong coefficient moves entries by ~1e-1.
RTOL = 1e-5


def xlstm(tie: bool) -> xLSTMLM:
    torch.manual_seed(0)
    config = xLSTMConfig(
        vocab_size=VOCAB,
        d_model=16,
        num_layers=2,
        num_heads=2,
        chunk_size=16,
        backend="reference",
        tie_embeddings=tie,
    )
    return xLSTMLM(config)


class Unchecked(nn.Module):
    """The LM's forward without its token-id validation (for the vmapped oracle)."""

    def __init__(self, lm: xLSTMLM) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, tokens):
        x = self.lm.embedding(tokens)
        for block in self.lm.blocks:
            x, _ = block(x)
        return self.lm._logits(x)


def example_losses(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per-example next-token cross-entropy summed over positions, ``(B,)``."""
    ce = F.cross_entropy(
        logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none"
    ).view(tokens.shape[0], -1)
    return ce.sum(1)


def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(0))


def make(model, clipping="per_layer", max_grad_norm=1.0, **options):
    return flashdp.make_private(
        model,
        max_grad_norm=max_grad_norm,
        noise_multiplier=0.0,
        clipping=clipping,
        loss_reduction="sum",
        backend="reference",
        **options,
    )


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
def test_private_xlstm_equals_brute_force(clipping):
    ids = tokens()
    grads = per_example_gradients(
        Unchecked(xlstm(tie=False)), lambda call, x: example_losses(call(x), x).sum(), ids
    )
    grads = {name.removeprefix("lm."): g for name, g in grads.items()}
    norms = total_norms(grads)
    max_grad_norm = float(norms.median())  # some examples clipped, some not
    assert norms.min() < max_grad_norm < norms.max()
    expected = clip_and_sum(grads, clipping, max_grad_norm, divide_by=BATCH)

    private = make(xlstm(tie=False), clipping, max_grad_norm, fallback="vmap")
    controller = flashdp.get_controller(private)
    # fused: embedding, RMS norms, FFN and head; per example under vmap: the mLSTM layers
    assert isinstance(private.embedding, flashdp.DPEmbedding)
    assert isinstance(private.head, flashdp.DPLinear)
    assert isinstance(private.norm, flashdp.DPRMSNorm)
    assert isinstance(private.blocks[0].ffn.down, flashdp.DPLinear)
    assert controller.fallback_modules == ("blocks.0.mixer", "blocks.1.mixer")
    example_losses(private(ids), ids).sum().backward()
    got = {k: p.grad for k, p in private.named_parameters()}
    assert relative_error(got, expected) <= RTOL


def test_xlstm_without_fallback_is_refused_naming_the_modules():
    message = (
        r"'blocks\.0\.mixer' \(mLSTMLayer\): \['blocks\.0\.mixer\.norm_weight'\]"
        r".*'blocks\.1\.mixer' \(mLSTMLayer\).*fallback='vmap'"
    )
    with pytest.raises(ValueError, match=message):
        make(xlstm(tie=False))


def test_tied_head_fails_loudly():
    """The tied head uses the embedding matrix outside its layer: that use would escape
    clipping, so the backward raises and no gradient is released; running the whole model
    through the fallback is refused too (its token-id check is data-dependent)."""
    ids = tokens()
    private = make(xlstm(tie=True), fallback="vmap")
    with pytest.raises(RuntimeError, match=r"'embedding\.weight' received a gradient outside"):
        example_losses(private(ids), ids).sum().backward()
    assert all(p.grad is None for p in private.parameters())
    private = make(xlstm(tie=True), fallback="vmap", fallback_modules=[""])
    with pytest.raises(RuntimeError, match=r"\(xLSTMLM\) cannot run one example at a time"):
        private(ids)
