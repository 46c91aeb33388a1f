"""PT-MoE: a decomposed soft prompt ``P = Σ_i w_i A_i B`` chosen per input by a top-1 router.

``A_i ∈ ℝ^{T×R}`` per expert, ``B ∈ ℝ^{R×H}`` shared. Router logits ``l = W·mean(E) + b`` over the
input's token embeddings ``E``; in training ``l' = l ⊙ (1 + ε)``, ``ε ~ N(0, σ²)``;
``w = softmax(l') ⊙ one_hot(argmax l')``, so the chosen expert is scaled by its probability and
the router receives gradients through that probability.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from peft_zoo.arch import hidden_size
from peft_zoo.config import PTMoEConfig
from peft_zoo.prompt import PromptModel, embedding_std, init_token_ids, masked_mean

logger = logging.getLogger(__name__)


class PTMoEPrompt(nn.Module):
    """Parameters ``A (N, T, R)``, ``B (R, H)`` and the router ``Linear(H, N)``."""

    def __init__(self, config: PTMoEConfig, width: int, scale: float) -> None:
        super().__init__()
        if config.rank > width:
            raise ValueError(f"rank ({config.rank}) must be at most the hidden size ({width})")
        self.config = config
        n, t, r = config.num_experts, config.num_virtual_tokens, config.rank
        # random init: entries of A_i B have the embedding matrix's scale
        self.A = nn.Parameter(torch.randn(n, t, r))
        self.B = nn.Parameter(torch.randn(r, width) * (scale / r**0.5))
        self.router = nn.Linear(width, n)
        self.last_expert: torch.Tensor | None = None

    @torch.no_grad()
    def svd_init(self, text_embeds: torch.Tensor) -> None:
        """SVD ``E = UΣVᵀ`` of ``text_embeds (T, H)``.

        Sets ``A_i = U_R Σ_R^{1/2}`` for every expert and ``B = Σ_R^{1/2} V_Rᵀ``.
        """
        u, s, vh = torch.linalg.svd(text_embeds.float(), full_matrices=False)
        r = self.config.rank
        root = s[:r].sqrt()
        self.A.copy_((u[:, :r] * root).expand_as(self.A))
        self.B.copy_(root[:, None] * vh[:r])

    def weights(self, mean_embeds: torch.Tensor) -> torch.Tensor:
        """Top-1 expert weights ``(B, N)`` from the mean input embedding ``(B, H)``."""
        logits = self.router(mean_embeds.to(self.router.weight.dtype))
        if self.training and self.config.router_noise_std > 0:
            logits = logits * (1 + self.config.router_noise_std * torch.randn_like(logits))
        probs = logits.softmax(-1)
        chosen = probs.argmax(-1)
        self.last_expert = chosen.detach()
        # one-hot by scatter, not F.one_hot (whose range check is data-dependent): the router
        # then runs under torch.func.vmap, e.g. for per-example gradients
        return probs * torch.zeros_like(probs).scatter(-1, chosen.unsqueeze(-1), 1.0)

    def forward(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        w = self.weights(masked_mean(embeds, mask))
        return torch.einsum("bn,ntr,rh->bth", w, self.A, self.B)


class PTMoEModel(PromptModel):
    """A model with a PT-MoE prompt (build with :func:`peft_zoo.get_peft_model`)."""

    def __init__(self, base_model: nn.Module, config: PTMoEConfig, tokenizer=None) -> None:
        super().__init__(base_model, config)
        self.adapter = PTMoEPrompt(config, hidden_size(base_model), embedding_std(base_model))
        if config.init_text is not None and tokenizer is not None:
            ids = init_token_ids(tokenizer, config.init_text, config.num_virtual_tokens)
            embedding = base_model.get_input_embeddings()
            self.adapter.svd_init(embedding(torch.tensor(ids, device=embedding.weight.device)))
        elif config.init_text is not None:
            logger.info("init_text given without a tokenizer: prompt left at random init")

    def prompt(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.adapter(embeds, mask)
