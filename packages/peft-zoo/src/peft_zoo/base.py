"""The wrapper every adapter method shares: freezing, parameter counts, adapter-only saving."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

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
        """Write ``adapter_config.json`` and ``adapter_model.safetensors`` (adapter only)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.adapter_state_dict().items()}
        save_file(tensors, directory / WEIGHTS_NAME, metadata={"format": "pt"})
        meta = {
            "format_version": FORMAT_VERSION,
            "base_model_type": self.base_model.config.model_type,
            "base_model_class": type(self.base_model).__name__,
            "config": self.peft_config.to_dict(),
            "state": self.extra_state(),
        }
        (directory / CONFIG_NAME).write_text(json.dumps(meta, indent=2) + "\n")
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
