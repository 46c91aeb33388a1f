"""The language model side: LoRA through peft, and per-token response losses computed fast.

QCS trains many short LoRA runs (one per policy draw), so the cost of a training step matters.
Two exact savings:

- the output layer runs only at positions that predict a response token (the prompt's logits
  are never needed);
- with LoRA on the top layers only (``LoraSettings.layers``), everything below the first adapted
  layer is frozen, so :class:`ResponseScorer` runs it once per example and caches the hidden
  states entering that layer; every later forward starts there. The result equals the full
  model's to float rounding (tested).

Models: any Hugging Face causal LM with the Llama / Qwen2 layout (``model.model.layers``,
``model.lm_head``): SmolLM2-135M-Instruct from benchdata, or a user's checkpoint folder.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from qcs.data import TokenizedPairs

__all__ = ["LoraSettings", "ResponseScorer", "add_lora", "base_model", "load_model"]

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters (peft): rank ``r``, scale ``alpha / r``, on ``target_modules`` of the top
    ``layers`` decoder layers (``None``: every layer, as LESS)."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = TARGET_MODULES
    layers: int | None = None

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"LoRA rank r must be >= 1, got {self.r}")
        if not self.alpha > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout}")
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"layers must be None (all) or >= 1, got {self.layers}")
        object.__setattr__(self, "target_modules", tuple(self.target_modules))


def load_model(path=None):
    """``(model, tokenizer)``: SmolLM2-135M-Instruct from benchdata (float32, eval mode), or the
    Hugging Face folder at ``path``."""
    from benchdata import smollm2_135m

    return tuple(smollm2_135m(path))


def base_model(model) -> torch.nn.Module:
    """The plain causal LM under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _layers(model) -> torch.nn.ModuleList:
    inner = getattr(base_model(model), "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise TypeError(
            f"{type(base_model(model)).__name__} is not a Llama / Qwen2-style causal LM "
            "(model.model.layers)"
        )
    return layers


def add_lora(model, settings: LoraSettings = LoraSettings(), seed: int = 0):
    """Wrap ``model`` in a peft LoRA model; only the adapters train. ``seed`` fixes the
    adapters' random init (A; B starts at zero, so the wrapped model equals the original)."""
    from peft import LoraConfig, get_peft_model

    count = len(_layers(model))
    if settings.layers is not None and settings.layers > count:
        raise ValueError(f"LoRA on the top {settings.layers} layers: the model has {count}")
    layers = None if settings.layers is None else list(range(count - settings.layers, count))
    config = LoraConfig(
        r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules), layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft asks transformers 5 a deprecated question while wrapping; nothing to act on
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def first_adapted_layer(model) -> int:
    """Index of the lowest decoder layer holding a trainable parameter (0 if none is found
    below the top, e.g. without adapters: then nothing is cached)."""
    for index, layer in enumerate(_layers(model)):
        if any(p.requires_grad for p in layer.parameters()):
            return index
    return 0


@contextlib.contextmanager
def _only_layers(model, start: int, stop: int):
    inner = base_model(model).model
    saved = inner.layers
    inner.layers = torch.nn.ModuleList(list(saved)[start:stop])
    try:
        yield inner
    finally:
        inner.layers = saved


class ResponseScorer:
    """Per-token negative log-likelihoods of the response tokens of ``data`` under ``model``.

    Args:
        model: a (peft-wrapped) causal LM.
        data: the examples scored; indices below refer to it.
        cache_prefix: cache the hidden states entering the first adapted layer (see the module
            docstring); ``False`` runs the whole model every time.
        batch_size: examples per forward when caching and in :meth:`mean_loss`.
    """

    def __init__(self, model, data: TokenizedPairs, *, cache_prefix: bool = True,
                 batch_size: int = 16) -> None:  # fmt: skip
        self.model, self.data, self.batch_size = model, data, batch_size
        self.device = next(model.parameters()).device
        self.start = first_adapted_layer(model) if cache_prefix else 0
        self._cache: list[torch.Tensor] | None = None
        if self.start > 0:
            self._cache = self._prefix_states()

    def _prefix_states(self) -> list[torch.Tensor]:
        states = []
        with torch.no_grad(), _only_layers(self.model, 0, self.start) as inner:
            captured = {}
            hook = inner.layers[-1].register_forward_hook(
                lambda _m, _i, out: captured.__setitem__(
                    "h", out[0] if isinstance(out, tuple) else out
                )
            )
            try:
                for chunk in torch.arange(len(self.data)).split(self.batch_size):
                    batch = self._batch(chunk)
                    inner(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          use_cache=False)  # fmt: skip
                    lengths = batch["attention_mask"].sum(1).tolist()
                    states += [captured["h"][row, :n].clone() for row, n in enumerate(lengths)]
            finally:
                hook.remove()
        return states

    def _batch(self, indices, token_weights=None) -> dict:
        return {k: v.to(self.device) for k, v in self.data.batch(indices, token_weights).items()}

    def _hidden(self, batch: dict, indices: list[int]) -> torch.Tensor:
        mask = batch["attention_mask"]
        if self._cache is None:
            out = base_model(self.model).model(input_ids=batch["input_ids"], attention_mask=mask,
                                               use_cache=False)  # fmt: skip
            return out.last_hidden_state
        width = mask.shape[1]
        first = self._cache[indices[0]]
        embeds = first.new_zeros((len(indices), width, first.shape[-1]))
        for row, i in enumerate(indices):
            embeds[row, : len(self._cache[i])] = self._cache[i]
        layers = len(_layers(self.model))
        with _only_layers(self.model, self.start, layers) as inner:
            out = inner(inputs_embeds=embeds, attention_mask=mask, use_cache=False)
        return out.last_hidden_state

    def token_losses(self, indices, token_weights: list[torch.Tensor] | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """``(nll, weights, rows)``: one entry per response token of the examples at
        ``indices`` (in order), its NLL (differentiable when grad is enabled), its weight, and
        the position in ``indices`` of the example it belongs to."""
        idx = [int(i) for i in torch.as_tensor(indices, dtype=torch.long).reshape(-1).tolist()]
        batch = self._batch(idx, token_weights)
        hidden = self._hidden(batch, idx)
        where = batch["targets"] != -100
        head = base_model(self.model).lm_head
        logits = head(hidden[where]).float()
        nll = F.cross_entropy(logits, batch["targets"][where], reduction="none")
        rows = torch.nonzero(where)[:, 0]
        return nll, batch["weights"][where], rows

    def weighted_loss(self, indices, token_weights: list[torch.Tensor] | None = None
                      ) -> torch.Tensor:  # fmt: skip
        """``Σ w_t ℓ_t / Σ w_t`` over the response tokens of ``indices`` (the QCS inner loss:
        each token weighted by its elastic weight; unselected sequences are simply absent)."""
        nll, weights, _ = self.token_losses(indices, token_weights)
        return (weights * nll).sum() / weights.sum()

    @torch.no_grad()
    def per_example_loss(self, indices=None) -> torch.Tensor:
        """``(k,)`` float64 (on the CPU): each example's mean response-token NLL."""
        idx = torch.arange(len(self.data)) if indices is None else torch.as_tensor(indices)
        out = []
        for chunk in idx.split(self.batch_size):
            nll, _, rows = self.token_losses(chunk)
            nll, rows = nll.double().cpu(), rows.cpu()
            total = torch.zeros(len(chunk), dtype=torch.float64).index_add_(0, rows, nll)
            count = torch.zeros(len(chunk), dtype=torch.float64).index_add_(
                0, rows, torch.ones_like(nll)
            )
            out.append(total / count)
        return torch.cat(out)

    @torch.no_grad()
    def mean_loss(self, indices=None) -> float:
        """Mean NLL over all response tokens of ``indices`` (default every example): the
        held-out loss."""
        idx = torch.arange(len(self.data)) if indices is None else torch.as_tensor(indices)
        total, count = 0.0, 0
        for chunk in idx.split(self.batch_size):
            nll, _, _ = self.token_losses(chunk)
            total += float(nll.double().sum())
            count += nll.numel()
        return total / count
