"""LoPE: asymmetric LoRA with a poisoning expert.

Each adapted linear layer computes ``y = W0 x + s·(ω_D·B_D + Σ_i ω_i·B_i) A x`` with one shared
down-projection ``A ∈ ℝ^{r×in}``, ``N`` up-projection experts ``B_i ∈ ℝ^{out×r}``, the poisoning
expert ``B_D ∈ ℝ^{out×r}``, a per-token router ``ω = softmax(W_gateᵀ x)`` over the ``N + 1``
experts, and ``s = lora_alpha / r``. Stage I trains ``A`` and ``B_D`` on generated noisy data;
stage II freezes ``B_D`` (it stays in the forward pass) and trains ``A``, the ``B_i`` and the router
on task data. At inference (``eval()`` mode) the poisoning expert's term is dropped; the normal
experts keep their router weights (no renormalisation).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from peft_zoo.arch import architecture
from peft_zoo.base import PeftZooModel, loss_shifts_labels, share_of_sum
from peft_zoo.config import LoPEConfig

STAGES = (1, 2)


class LoPELinear(nn.Module):
    """A frozen ``nn.Linear`` (or GPT-2 ``Conv1D``) plus the LoPE update."""

    def __init__(self, base: nn.Module, config: LoPEConfig) -> None:
        super().__init__()
        if isinstance(base, Conv1D):
            in_features, out_features = base.weight.shape
        else:
            in_features, out_features = base.in_features, base.out_features
        self.base = base
        self.scaling = config.scaling
        r, n = config.r, config.num_experts
        self.lope_A = nn.Parameter(torch.empty(r, in_features))
        nn.init.kaiming_uniform_(self.lope_A, a=math.sqrt(5))  # as LoRA's A
        self.lope_B = nn.Parameter(torch.zeros(n, out_features, r))
        self.lope_B_D = nn.Parameter(torch.zeros(out_features, r))
        self.lope_gate = nn.Parameter(torch.randn(n + 1, in_features) / math.sqrt(in_features))
        self.dropout = nn.Dropout(config.lora_dropout) if config.lora_dropout else nn.Identity()
        self.mask_poison: bool | None = None  # None: masked exactly when not training

    def poison_masked(self) -> bool:
        return (not self.training) if self.mask_poison is None else self.mask_poison

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """The adapter's output ``(…, out)`` for input ``(…, in)``."""
        x = x.to(self.lope_A.dtype)
        gate = (x @ self.lope_gate.T).softmax(-1)  # (…, N + 1), last = poisoning expert
        h = self.dropout(x) @ self.lope_A.T  # (…, r)
        experts = self.lope_B
        if not self.poison_masked():
            experts = torch.cat([experts, self.lope_B_D.unsqueeze(0)], dim=0)
        mixed = gate[..., : len(experts), None] * h.unsqueeze(-2)  # (…, E, r)
        stacked = experts.permute(0, 2, 1).reshape(-1, experts.shape[1])  # (E·r, out)
        return self.scaling * (mixed.flatten(-2) @ stacked)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        return out + self.delta(x).to(out.dtype)


def replace_targets(model: nn.Module, targets: tuple[str, ...], config: LoPEConfig) -> list[str]:
    """Swap every linear layer whose leaf name is in ``targets`` for a :class:`LoPELinear`."""
    linear_names = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.named_modules()
            if isinstance(m, nn.Linear | Conv1D)
        }
    )
    replaced = []
    for name, module in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in targets:
            continue
        if not isinstance(module, nn.Linear | Conv1D):
            raise ValueError(
                f"target module {name!r} is a {type(module).__name__}; LoPE supports nn.Linear "
                "and transformers Conv1D layers"
            )
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        setattr(parent, leaf, LoPELinear(module, config))
        replaced.append(name)
    found = {name.rsplit(".", 1)[-1] for name in replaced}
    missing = sorted(set(targets) - found)
    if missing:
        raise ValueError(
            f"target modules {missing} not found in {type(model).__name__}; its linear layers "
            f"are named {linear_names}"
        )
    return replaced


class LoPEModel(PeftZooModel):
    """A model with LoPE layers (build with :func:`peft_zoo.get_peft_model`); starts in stage I."""

    def __init__(self, base_model: nn.Module, config: LoPEConfig) -> None:
        super().__init__(base_model, config)
        targets = config.target_modules or architecture(base_model).default_targets
        self.targeted = replace_targets(base_model, targets, config)
        self.stage = 1
        self.set_stage(1)

    def lope_layers(self) -> list[LoPELinear]:
        return [m for m in self.base_model.modules() if isinstance(m, LoPELinear)]

    def set_stage(self, stage: int) -> None:
        """Stage 1 trains ``A``, ``B_D``; stage 2 trains ``A``, ``B_i``, router, freezes ``B_D``."""
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        self.stage = stage
        for layer in self.lope_layers():
            layer.lope_A.requires_grad_(True)
            layer.lope_B_D.requires_grad_(stage == 1)
            layer.lope_B.requires_grad_(stage == 2)
            layer.lope_gate.requires_grad_(stage == 2)

    def set_poison_mask(self, masked: bool | None) -> None:
        """Force the poisoning expert off (True) or on (False); None: off exactly in ``eval()``."""
        for layer in self.lope_layers():
            layer.mask_poison = masked

    # the forward honours ``num_items_in_batch``, so Trainer need not rescale for accumulation
    accepts_loss_kwargs = True

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ):
        """The base model's forward with the LoPE layers in place (same arguments and output).

        The inputs are named, as in ``peft``'s models, so that Hugging Face ``Trainer`` keeps
        those dataset columns and finds the label names; other keyword arguments are passed on.
        Given ``num_items_in_batch`` (the labelled items of a whole accumulated batch, as
        ``Trainer`` passes it), the base's mean loss becomes this batch's share of the sum,
        whatever the base does with that argument, so accumulated micro-batches give the whole
        batch's gradient.
        """
        named = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "inputs_embeds": inputs_embeds,
            "token_type_ids": token_type_ids,
            "position_ids": position_ids,
        }
        output = self.base_model(**{k: v for k, v in named.items() if v is not None}, **kwargs)
        if labels is not None and num_items_in_batch is not None:
            shifted = loss_shifts_labels(self.base_model)
            output["loss"] = share_of_sum(output.loss, labels, num_items_in_batch, shifted)
        return output

    def generate(self, *args, **kwargs):
        return self.base_model.generate(*args, **kwargs)

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        return {n: p for n, p in self.base_model.named_parameters() if ".lope_" in n}

    def extra_state(self) -> dict[str, Any]:
        return {"stage": self.stage}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.set_stage(int(state.get("stage", 2)))
