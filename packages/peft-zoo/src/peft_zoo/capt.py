"""CaPT: one capsule prompt token at position 0, ``S_1 = p_1 + Mean(E)``.

The instance-aware part is the mean of the input's token embeddings (real tokens only), the
task-aware part a learnable vector ``p_1 ∈ ℝ^H``. The deep variant keeps one vector per layer and,
before layer ``i > 1``, replaces the capsule's hidden state by ``p_i + Mean(S_{i-1} ⊕ H_{i-1})``,
the mean over the capsule and the real tokens of the previous layer's output.
"""

from __future__ import annotations

import torch
from torch import nn

from peft_zoo.arch import hidden_size, transformer_layers
from peft_zoo.config import CaPTConfig
from peft_zoo.prompt import Inserted, PromptModel, masked_mean


class CaPTPrompt(nn.Module):
    """Task vectors ``p (num_layers or 1, H)``."""

    def __init__(self, config: CaPTConfig, width: int, num_layers: int) -> None:
        super().__init__()
        self.task_vectors = nn.Parameter(
            torch.randn(num_layers if config.deep else 1, width) * config.init_std
        )

    def forward(self, summary: torch.Tensor, layer: int = 0) -> torch.Tensor:
        """The capsule state ``p_layer + summary`` for the instance summary ``(B, H)``.

        The task vectors are used only here, so that wrappers of this module (e.g. per-example
        gradient clipping) see every use of them.
        """
        return self.task_vectors[layer] + summary


class CaPTModel(PromptModel):
    """A model with a capsule prompt (build with :func:`peft_zoo.get_peft_model`)."""

    def __init__(self, base_model: nn.Module, config: CaPTConfig) -> None:
        super().__init__(base_model, config)
        layers = transformer_layers(base_model)
        self.adapter = CaPTPrompt(config, hidden_size(base_model), len(layers))
        self._active: Inserted | None = None
        if config.deep:
            for index, layer in enumerate(layers):
                if index > 0:
                    layer.register_forward_pre_hook(self._hook(index), with_kwargs=True)

    def prompt(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        capsule = self.adapter(masked_mean(embeds, mask), 0)
        return capsule.unsqueeze(1)

    def _hook(self, index: int):
        def replace_capsule(module, args, kwargs):
            active = self._active
            hidden = args[0] if args else kwargs.get("hidden_states")
            if active is None or hidden is None or hidden.shape[1] != active.embeds.shape[1]:
                return None  # not this model's prefill pass (e.g. a cached decoding step)
            state = self.adapter(masked_mean(hidden, active.context_mask), index)
            at_capsule = torch.zeros_like(active.attention_mask, dtype=torch.bool)
            at_capsule[torch.arange(len(active.start)), active.start] = True
            hidden = torch.where(
                at_capsule.unsqueeze(-1), state.unsqueeze(1).to(hidden.dtype), hidden
            )
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}

        return replace_capsule

    def _run(self, inserted: Inserted, **kwargs):
        self._active = inserted
        try:
            return super()._run(inserted, **kwargs)
        finally:
            self._active = None

    def _generate(self, inserted: Inserted, **kwargs) -> torch.Tensor:
        self._active = inserted
        try:
            return super()._generate(inserted, **kwargs)
        finally:
            self._active = None
