"""PT-MoE, LoPE, CaPT and NanoAdam: parameter-efficient fine-tuning for Hugging Face models.

The adapters follow ``peft``'s conventions (config dataclass, :func:`get_peft_model`,
``print_trainable_parameters``, adapter-only ``save_pretrained`` / :func:`from_pretrained`);
:class:`NanoAdam` is a ``torch.optim.Optimizer``.
"""

from importlib import metadata as _metadata

from peft_zoo.arch import ARCHITECTURES
from peft_zoo.base import PeftZooModel
from peft_zoo.capt import CaPTModel
from peft_zoo.config import AdapterConfig, CaPTConfig, LoPEConfig, PTMoEConfig
from peft_zoo.lope import LoPELinear, LoPEModel
from peft_zoo.mapping import from_pretrained, get_peft_model
from peft_zoo.nanoadam import NanoAdam
from peft_zoo.noise import char_noise, embedding_noise, embedding_noise_hook
from peft_zoo.prompt import insert_prompt
from peft_zoo.ptmoe import PTMoEModel

try:
    __version__ = _metadata.version("peft-zoo")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "ARCHITECTURES",
    "AdapterConfig",
    "CaPTConfig",
    "CaPTModel",
    "LoPEConfig",
    "LoPELinear",
    "LoPEModel",
    "NanoAdam",
    "PTMoEConfig",
    "PTMoEModel",
    "PeftZooModel",
    "__version__",
    "char_noise",
    "embedding_noise",
    "embedding_noise_hook",
    "from_pretrained",
    "get_peft_model",
    "insert_prompt",
]
