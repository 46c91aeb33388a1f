"""The wrapper every adapter method shares: freezing, parameter counts, adapter-only saving.

A wrapper's ``state_dict()`` holds the adapter alone, as its ``save_pretrained`` does: the frozen
base model is the user's own checkpoint, not part of the adapter's state. So ``torch.save``, and
Hugging Face ``Trainer`` checkpoints (which save ``model.state_dict()`` for a model that is not a
``PreTrainedModel``) hold only the adapter, and ``load_state_dict`` of such a dict leaves the base
as it is. :meth:`PeftZooModel.full_state_dict` returns everything.
"""

from __future__ import annotations

import json
import logging
from itertools import chain
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from kernels_common.cli import atomic_file
from peft_zoo.config import AdapterConfig

logger = logging.getLogger(__name__)

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
FORMAT_VERSION = 1


class PeftZooModel(nn.Module):
    """A frozen Hugging Face model plus one adapter (``peft.PeftModel``'s role).

    Subclasses build the adapter in ``__init__`` and define :meth:`adapter_state_dict`.
    Attributes not found on the wrapper are looked up on the base model, as in ``peft``.
    """

    def __init__(self, base_model: nn.Module, config: AdapterConfig) -> None:
        super().__init__()
        self.base_model = base_model
        self.peft_config = config
        for parameter in base_model.parameters():
            parameter.requires_grad_(False)
        self._include_base = False
        self.register_state_dict_post_hook(_drop_frozen_base)
        self.register_load_state_dict_pre_hook(_note_absent_base)
        self.register_load_state_dict_post_hook(_forgive_absent_base)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "base_model":
                raise
            return getattr(self.base_model, name)

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter's tensors (all of them, trainable or frozen in the current stage)."""
        raise NotImplementedError

    def adapter_names(self) -> set[str]:
        """Names of the adapter's tensors as they appear in this module's ``state_dict()``."""
        ids = {id(tensor) for tensor in self.adapter_state_dict().values()}
        named = chain(
            self.named_parameters(remove_duplicate=False),
            self.named_buffers(remove_duplicate=False),
        )
        return {name for name, tensor in named if id(tensor) in ids}

    def full_state_dict(self, *args, **kwargs) -> dict[str, Any]:
        """``nn.Module.state_dict`` with the frozen base included (same arguments)."""
        self._include_base = True
        try:
            return super().state_dict(*args, **kwargs)
        finally:
            self._include_base = False

    def extra_state(self) -> dict[str, Any]:
        """JSON-ready state saved beside the config (e.g. LoPE's training stage)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`extra_state`."""

    def get_nb_trainable_parameters(self) -> tuple[int, int]:
        """``(trainable, total)`` parameter counts of the wrapped model."""
        trainable = total = 0
        for parameter in self.parameters():
            total += parameter.numel()
            if parameter.requires_grad:
                trainable += parameter.numel()
        return trainable, total

    def print_trainable_parameters(self) -> None:
        """Print ``trainable params: … || all params: … || trainable%: …`` like ``peft``."""
        trainable, total = self.get_nb_trainable_parameters()
        print(
            f"trainable params: {trainable:,d} || all params: {total:,d} || "
            f"trainable%: {100 * trainable / total:.4f}"
        )

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``adapter_config.json`` and ``adapter_model.safetensors`` (adapter only).

        Both files are written under temporary names and renamed at the end, so a failed save
        leaves no partial file (and does not create ``directory``)."""
        directory = Path(directory)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.adapter_state_dict().items()}
        meta = {
            "format_version": FORMAT_VERSION,
            "base_model_type": self.base_model.config.model_type,
            "base_model_class": type(self.base_model).__name__,
            "config": self.peft_config.to_dict(),
            "state": self.extra_state(),
        }
        with (
            atomic_file(directory / WEIGHTS_NAME) as weights,
            atomic_file(directory / CONFIG_NAME) as config,
        ):
            save_file(tensors, weights, metadata={"format": "pt"})
            config.write_text(json.dumps(meta, indent=2) + "\n")
        logger.info("saved %d adapter tensors to %s", len(tensors), directory)
        return directory

    def load_adapter_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy saved adapter tensors in, checking names and shapes."""
        own = self.adapter_state_dict()
        missing, unexpected = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
        if missing or unexpected:
            raise ValueError(
                f"adapter tensors do not match this model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        with torch.no_grad():
            for name, target in own.items():
                if target.shape != tensors[name].shape:
                    raise ValueError(
                        f"adapter tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                        f"the model expects {tuple(target.shape)}"
                    )
                target.copy_(tensors[name])


def _drop_frozen_base(module: PeftZooModel, state_dict: dict, prefix: str, local_metadata) -> None:
    """``state_dict`` post-hook: remove the frozen base's entries, keep the adapter's."""
    if module._include_base:
        return
    adapter = {prefix + name for name in module.adapter_names()}
    base = prefix + "base_model."
    for key in [k for k in state_dict if k.startswith(base) and k not in adapter]:
        del state_dict[key]


def _note_absent_base(module: PeftZooModel, state_dict: dict, prefix: str, *args) -> None:
    """``load_state_dict`` pre-hook: note the base entries absent from the loaded dict (an
    adapter-only checkpoint); those tensors are left untouched."""
    adapter = module.adapter_names()
    module._absent_base = {
        prefix + name
        for name in module.full_state_dict(keep_vars=True)
        if name.startswith("base_model.")
        and name not in adapter
        and prefix + name not in state_dict
    }


def _forgive_absent_base(module: PeftZooModel, incompatible_keys) -> None:
    """``load_state_dict`` post-hook: absent base entries are not missing (``strict`` still
    requires every adapter tensor)."""
    absent = module.__dict__.pop("_absent_base", set())
    missing = incompatible_keys.missing_keys
    missing[:] = [key for key in missing if key not in absent]


def loss_shifts_labels(model: nn.Module) -> bool:
    """Whether ``model``'s loss predicts ``labels[t + 1]`` at ``t``, decided as Hugging Face
    ``Trainer`` decides it when it counts ``num_items_in_batch``."""
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
    except ImportError:  # transformers without the loss registry: no shift is counted
        return False
    config = getattr(model, "config", None)
    causal = LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss
    return causal and not getattr(config, "is_encoder_decoder", False)


def share_of_sum(
    mean_loss: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor,
    shifted: bool,
) -> torch.Tensor:
    """A loss that is a mean over this batch's labelled items (label -100 ignored; from
    ``labels[..., 1:]`` when ``shifted``), turned into their summed loss divided by the whole
    accumulated batch's ``num_items_in_batch``; 0 for a batch without labelled items."""
    valid = (labels[..., 1:] if shifted else labels).ne(-100).sum()
    share = mean_loss * (valid / num_items_in_batch)
    return torch.where(valid > 0, share, torch.zeros_like(share))
