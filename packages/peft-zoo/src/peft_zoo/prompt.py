"""Input-dependent soft prompts inserted before the first real token (PT-MoE and CaPT).

A prompt of ``P`` vectors per example goes right before each row's first attended token: at
index 0 for right-padded or unpadded rows, after the pads for left-padded rows. Position ids are
``cumsum(attention_mask) - 1``, so the prompt always takes positions ``0 … P-1`` and a padded row
computes exactly what the same row would unpadded. Returned logits are aligned with
``input_ids`` (the prompt positions are removed), and the language-model loss covers only the
input positions.

The instance-aware summary (CaPT's ``Mean(E)``, PT-MoE's router input) averages the positions of
``context_mask`` (default: the attention mask). When labels cover later tokens of the same
sequence (an answer after an instruction), pass the instruction's positions as ``context_mask``
so that the summary does not see the targets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import ModelOutput

from peft_zoo.base import PeftZooModel, share_of_sum


@dataclass
class Inserted:
    """A batch with the prompt inserted.

    Attributes:
        embeds: ``(B, L + P, H)`` input embeddings with the prompt.
        attention_mask: ``(B, L + P)`` long, 1 on the prompt and the real tokens.
        position_ids: ``(B, L + P)`` long, ``cumsum(mask) - 1`` clamped at 0.
        start: ``(B,)`` index of each row's first prompt vector.
        source_index: ``(B, L)`` new index of every original position.
        context_mask: ``(B, L + P)`` long, 1 on the prompt and the context positions.
    """

    embeds: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    start: torch.Tensor
    source_index: torch.Tensor
    context_mask: torch.Tensor | None = None

    def insert(self, values: torch.Tensor, fill: int) -> torch.Tensor:
        """Insert ``fill`` at the prompt positions of a ``(B, L)`` tensor (labels, type ids)."""
        batch, _length = values.shape
        out = values.new_full((batch, self.embeds.shape[1]), fill)
        return out.scatter(1, self.source_index, values)

    def extract(self, values: torch.Tensor) -> torch.Tensor:
        """Keep the original positions of a ``(B, L + P, …)`` tensor: ``(B, L, …)``."""
        index = self.source_index
        index = index.view(*index.shape, *([1] * (values.dim() - 2))).expand(
            -1, -1, *values.shape[2:]
        )
        return values.gather(1, index)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values (B, L, H)`` over positions where ``mask (B, L)`` is 1: ``(B, H)``."""
    weights = mask.to(values.dtype).unsqueeze(-1)
    return (values * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def insert_prompt(embeds: torch.Tensor, mask: torch.Tensor, prompt: torch.Tensor) -> Inserted:
    """Insert ``prompt (B, P, H)`` before the first attended token of ``embeds (B, L, H)``."""
    batch, length, width = embeds.shape
    prompt_len = prompt.shape[1]
    leading = (mask.cumsum(1) == 0).sum(1)  # pads before the first real token
    j = torch.arange(length + prompt_len, device=embeds.device).expand(batch, -1)
    lead = leading.unsqueeze(1)
    source = torch.where(
        j < lead, j, torch.where(j < lead + prompt_len, length + j - lead, j - prompt_len)
    )
    combined = torch.cat([embeds, prompt.to(embeds.dtype)], dim=1)
    new_embeds = combined.gather(1, source.unsqueeze(-1).expand(-1, -1, width))
    new_mask = torch.cat([mask, mask.new_ones(batch, prompt_len)], dim=1).gather(1, source)
    positions = (new_mask.long().cumsum(1) - 1).clamp(min=0)
    original = torch.arange(length, device=embeds.device).expand(batch, -1)
    source_index = torch.where(original < lead, original, original + prompt_len)
    return Inserted(new_embeds, new_mask.long(), positions, leading, source_index)


def causal_lm_loss(
    logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
) -> torch.Tensor:
    """Next-token cross-entropy: ``logits (B, L, V)`` at ``t`` predict ``labels[:, t+1]``; label
    -100 is ignored. The mean over the predicted tokens, or, given ``num_items_in_batch`` (the
    predicted tokens of a whole accumulated batch, as Hugging Face ``Trainer`` passes it), their
    sum divided by it."""
    flat_logits, flat_labels = logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten()
    if num_items_in_batch is None:
        return F.cross_entropy(flat_logits, flat_labels, ignore_index=-100)
    total = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum")
    return total / num_items_in_batch


class PromptModel(PeftZooModel):
    """Base for methods that prepend an input-dependent prompt; subclasses define :meth:`prompt`."""

    # the loss honours ``num_items_in_batch``, so Trainer need not rescale it for accumulation
    accepts_loss_kwargs = True

    def prompt(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The prompt ``(B, P, H)`` for input embeddings ``(B, L, H)`` and mask ``(B, L)``."""
        raise NotImplementedError

    def _inserted(self, input_ids, attention_mask, inputs_embeds, context_mask=None) -> Inserted:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.base_model.get_input_embeddings()(input_ids)
        if inputs_embeds.dim() != 3:
            raise ValueError(f"inputs must be (batch, length), got {tuple(inputs_embeds.shape)}")
        batch, length = inputs_embeds.shape[:2]
        if attention_mask is None:
            attention_mask = torch.ones(
                batch, length, dtype=torch.long, device=inputs_embeds.device
            )
        if attention_mask.shape != (batch, length):
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} does not match the input "
                f"{(batch, length)}"
            )
        if context_mask is None:
            context_mask = attention_mask
        elif context_mask.shape != (batch, length):
            raise ValueError(
                f"context_mask shape {tuple(context_mask.shape)} does not match the input "
                f"{(batch, length)}"
            )
        context_mask = context_mask.long() * attention_mask.long()
        inserted = insert_prompt(
            inputs_embeds, attention_mask, self.prompt(inputs_embeds, context_mask)
        )
        inserted.context_mask = inserted.insert(context_mask, 1)
        return inserted

    def _run(self, inserted: Inserted, **kwargs) -> ModelOutput:
        return self.base_model(
            inputs_embeds=inserted.embeds,
            attention_mask=inserted.attention_mask,
            position_ids=inserted.position_ids,
            **kwargs,
        )

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> ModelOutput:
        """Run the base model on the input with the prompt inserted.

        Args:
            input_ids: ``(B, L)`` token ids (or ``inputs_embeds (B, L, H)``).
            attention_mask: ``(B, L)``, 1 on real tokens; left or right padding.
            labels: causal LM: ``(B, L)`` token ids, -100 ignored, loss on input positions only;
                sequence classification: ``(B,)`` passed to the base model.
            context_mask: ``(B, L)``, the positions summarised by the method (default: all real
                tokens); see the module docstring.
            num_items_in_batch: the labelled items of the whole (accumulated) batch, as Hugging
                Face ``Trainer`` passes it: the loss is then a sum divided by it (for a base
                model's loss over ``(B,)`` labels: its mean times this batch's share of items).

        Returns:
            The base model's output; 3-D outputs (``logits (B, L, V)``) are aligned with the input.
        """
        inserted = self._inserted(input_ids, attention_mask, inputs_embeds, context_mask)
        if token_type_ids is not None:
            kwargs["token_type_ids"] = inserted.insert(token_type_ids, 0)
        is_lm = labels is not None and labels.dim() == 2
        if labels is not None and not is_lm:
            kwargs["labels"] = labels
        output = self._run(inserted, **kwargs)
        if output.logits.dim() == 3:
            output["logits"] = inserted.extract(output.logits)
        if is_lm:
            output["loss"] = causal_lm_loss(output.logits, labels, num_items_in_batch)
        elif labels is not None and num_items_in_batch is not None:
            # the base model's loss is a mean over its labels: rescale it to a share of the sum
            output["loss"] = share_of_sum(output.loss, labels, num_items_in_batch, shifted=False)
        return output

    @torch.no_grad()
    def generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor:
        """``base_model.generate`` with the prompt: returns ``(B, L + new)`` ids like HF's
        ``generate`` (the prompt is not in the output). Left-pad batched inputs."""
        inserted = self._inserted(input_ids, attention_mask, None)
        new_tokens = self._generate(inserted, **kwargs)
        return torch.cat([input_ids, new_tokens], dim=1)

    def _generate(self, inserted: Inserted, **kwargs) -> torch.Tensor:
        return self.base_model.generate(
            inputs_embeds=inserted.embeds, attention_mask=inserted.attention_mask, **kwargs
        )

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.adapter.named_parameters())


def init_token_ids(tokenizer, text: str, length: int) -> list[int]:
    """``text``'s token ids repeated and cut to ``length`` (peft's ``TEXT`` prompt init)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"the init text {text!r} has no tokens")
    return (ids * (length // len(ids) + 1))[:length]


def embedding_std(model: nn.Module) -> float:
    """Standard deviation of the input embedding matrix (scale for random prompt inits)."""
    return model.get_input_embeddings().weight.detach().float().std().item()
