"""A small trainer that runs every method under one budget: full fine-tuning, LoRA and prompt
tuning from ``peft``, PT-MoE, CaPT, LoPE (two stages) and NanoAdam.

Example:
    >>> from peft_zoo.models import tiny_llama
    >>> from peft_zoo.data import lm_batch
    >>> model, tok = tiny_llama()
    >>> learner = build_learner("capt", model, tok, TrainSettings(steps=2))
    >>> learner.trainable
    64
"""

from __future__ import annotations

import logging
import math
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from peft_zoo.config import CaPTConfig, LoPEConfig, PTMoEConfig
from peft_zoo.data import Batch, qa_batch
from peft_zoo.lope import LoPEModel
from peft_zoo.mapping import get_peft_model
from peft_zoo.nanoadam import NanoAdam
from peft_zoo.noise import char_noise, embedding_noise_hook
from peft_zoo.prompt import PromptModel, causal_lm_loss, init_token_ids

logger = logging.getLogger(__name__)

METHODS = ("full", "lora", "prompt-tuning", "ptmoe", "capt", "lope", "nanoadam")


@dataclass(frozen=True)
class TrainSettings:
    """One budget for every method.

    Attributes:
        steps: optimizer steps (LoPE: stage I + stage II together).
        batch_size: examples per step.
        lr: learning rate per method (defaults below; see README for the choices).
        num_virtual_tokens, ptmoe_rank: prompt length of prompt tuning / PT-MoE and PT-MoE's R.
        lora_r: rank of ``peft`` LoRA; LoPE uses ``LoPEConfig`` defaults (r = 4, 3 experts).
        lope_stage1_fraction: share of the steps LoPE spends in stage I (noisy data).
        noise_alpha: LoPE's stage-I noise: character noise rate and embedding noise α (5%).
        nanoadam_density, nanoadam_interval: NanoAdam's ``density`` and mask interval ``m``.
        init_text: PT-MoE's SVD initialisation text.
        seed: seeds batches and noise.
    """

    steps: int = 100
    batch_size: int = 8
    lr: dict[str, float] = field(
        default_factory=lambda: {
            "full": 5e-5,
            "lora": 1e-3,
            "prompt-tuning": 1e-2,
            "ptmoe": 1e-2,
            "capt": 1e-2,
            "lope": 1e-3,
            "nanoadam": 2e-4,
        }
    )
    num_virtual_tokens: int = 40
    ptmoe_rank: int = 36
    lora_r: int = 8
    lope_stage1_fraction: float = 0.25
    noise_alpha: float = 0.05
    nanoadam_density: float = 0.05
    nanoadam_interval: int = 131
    init_text: str = "Continue the text in the same style."
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(
                f"steps and batch_size must be >= 1, got {self.steps}, {self.batch_size}"
            )
        if not 0.0 <= self.lope_stage1_fraction < 1.0:
            raise ValueError("lope_stage1_fraction must be in [0, 1)")
        missing = sorted(set(METHODS) - set(self.lr))
        if missing:
            raise ValueError(f"lr needs a learning rate for every method; missing {missing}")
        bad = {m: v for m, v in self.lr.items() if not (isinstance(v, int | float) and v > 0)}
        if bad:
            raise ValueError(f"learning rates must be positive numbers, got {bad}")
        if not 0.0 < self.nanoadam_density <= 1.0:
            raise ValueError(f"nanoadam_density must be in (0, 1], got {self.nanoadam_density}")


@dataclass
class Learner:
    """A model ready to train: what to call, what to optimise, how many parameters train."""

    method: str
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    trainable: int

    @property
    def takes_context(self) -> bool:
        return isinstance(self.model, PromptModel)

    def logits(self, batch: Batch) -> torch.Tensor:
        """``(B, L, V)`` logits aligned with ``batch.input_ids``."""
        kwargs = {"context_mask": batch.context_mask} if self.takes_context else {}
        out = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **kwargs)
        return out.logits[:, -batch.input_ids.shape[1] :]  # peft's prompt tuning prepends

    def loss(self, batch: Batch) -> torch.Tensor:
        return causal_lm_loss(self.logits(batch), batch.labels)


def _peft(method: str, model: nn.Module, tokenizer, settings: TrainSettings) -> nn.Module:
    try:
        import peft
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(f"method {method!r} needs peft: pip install 'peft-zoo[bench]'") from error
    if method == "lora":
        config = peft.LoraConfig(
            r=settings.lora_r,
            lora_alpha=2 * settings.lora_r,
            target_modules=["q_proj", "v_proj"],
            task_type="CAUSAL_LM",
        )
    else:
        config = peft.PromptTuningConfig(
            task_type="CAUSAL_LM", num_virtual_tokens=settings.num_virtual_tokens
        )
    with warnings.catch_warnings():
        # peft 0.19 calls a transformers attribute that transformers 5 marks deprecated
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        wrapped = peft.get_peft_model(model, config)
    if method == "prompt-tuning":
        # the same text initialisation as PT-MoE's: the embeddings of ``init_text`` repeated to
        # T tokens. This is what peft's ``prompt_tuning_init="TEXT"`` computes, done here because
        # peft would reload the tokenizer by name (the trainer's tokenizers need not have one).
        ids = init_token_ids(tokenizer, settings.init_text, settings.num_virtual_tokens)
        embedding = model.get_input_embeddings()
        with torch.no_grad():
            wrapped.prompt_encoder["default"].embedding.weight.copy_(
                embedding(torch.tensor(ids, device=embedding.weight.device))
            )
    return wrapped


def build_learner(method: str, model: nn.Module, tokenizer, settings: TrainSettings) -> Learner:
    """Wrap ``model`` (modified in place: pass a copy) for ``method``, with its optimizer."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    lr = settings.lr[method]
    if method in ("full", "nanoadam"):
        wrapped = model
        for p in model.parameters():
            p.requires_grad_(True)
    elif method in ("lora", "prompt-tuning"):
        wrapped = _peft(method, model, tokenizer, settings)
    elif method == "ptmoe":
        config = PTMoEConfig(
            num_virtual_tokens=settings.num_virtual_tokens,
            rank=settings.ptmoe_rank,
            init_text=settings.init_text,
        )
        wrapped = get_peft_model(model, config, tokenizer=tokenizer)
    elif method == "capt":
        wrapped = get_peft_model(model, CaPTConfig())
    else:
        wrapped = get_peft_model(model, LoPEConfig())
    params = [p for p in wrapped.parameters() if p.requires_grad]
    if method == "nanoadam":
        optimizer = NanoAdam(
            params,
            lr=lr,
            density=settings.nanoadam_density,
            mask_interval=settings.nanoadam_interval,
        )
    elif method == "lope":  # every adapter tensor: the stage decides which have gradients
        optimizer = torch.optim.AdamW(list(wrapped.adapter_state_dict().values()), lr=lr)
    else:
        optimizer = torch.optim.AdamW(params, lr=lr)
    trainable = sum(p.numel() for p in params)
    if method == "lope":
        trainable = sum(
            p.numel()
            for n, p in wrapped.adapter_state_dict().items()
            if "B_D" not in n  # deployed parameters: B_D is masked at inference
        )
    if method == "nanoadam":  # entries actually updated
        trainable = sum(max(1, math.ceil(settings.nanoadam_density * p.numel())) for p in params)
    return Learner(method, wrapped, optimizer, trainable)


def train(
    learner: Learner,
    items: Sequence,
    make_batch: Callable[[list], Batch],
    settings: TrainSettings,
    progress: bool = True,
) -> list[float]:
    """Train for ``settings.steps`` steps on random batches of ``items``; returns the losses.

    LoPE first spends ``lope_stage1_fraction`` of the steps in stage I on generated noisy copies
    of the items (character noise and embedding noise, α = ``noise_alpha``), then stage II.
    """
    rng = random.Random(settings.seed)
    stage1 = (
        round(settings.lope_stage1_fraction * settings.steps) if learner.method == "lope" else 0
    )
    noise_gen = torch.Generator().manual_seed(settings.seed)
    losses = []
    learner.model.train()
    bar = tqdm(
        range(settings.steps), desc=learner.method, disable=not progress, leave=False, mininterval=5
    )
    for step in bar:
        chosen = rng.sample(list(items), min(settings.batch_size, len(items)))
        if step < stage1:
            chosen = [_noisy(item, settings.noise_alpha, rng) for item in chosen]
            with embedding_noise_hook(learner.model, settings.noise_alpha, generator=noise_gen):
                loss = learner.loss(make_batch(chosen))
        else:
            if isinstance(learner.model, LoPEModel) and learner.model.stage == 1:
                learner.model.set_stage(2)
            loss = learner.loss(make_batch(chosen))
        loss.backward()
        learner.optimizer.step()
        learner.optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    if isinstance(learner.model, LoPEModel):
        learner.model.set_stage(2)
    learner.model.eval()
    return losses


def _noisy(item, rate: float, rng: random.Random):
    if isinstance(item, str):
        return char_noise(item, rate, rng)
    return tuple(char_noise(part, rate, rng) for part in item)


@torch.no_grad()
def perplexity(learner: Learner, batches: list[Batch]) -> float:
    """``exp`` of the mean NLL over every labelled target of ``batches`` (eval mode)."""
    learner.model.eval()
    total, count = 0.0, 0
    for batch in batches:
        logits = learner.logits(batch)[:, :-1].float()
        targets = batch.labels[:, 1:]
        nll = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum"
        )
        total += nll.item()
        count += int((targets != -100).sum())
    return math.exp(total / max(count, 1))


@torch.no_grad()
def exact_match(
    learner: Learner, tokenizer, problems: list[tuple[str, str]], batch_size: int = 32
) -> float:
    """Share of problems that greedy decoding answers exactly, computed without decoding.

    Greedy decoding of ``question`` produces ``answer``'s tokens followed by a token that does
    not continue the number exactly when, teacher-forced on ``question + answer``, the argmax at
    every answer position is the answer's next token and the argmax after the last answer token
    does not start with a digit. One forward pass per ``batch_size`` problems gives the same
    verdict as token-by-token ``generate`` (tested against it) at a fraction of the cost.
    """
    if not problems:
        raise ValueError("exact_match needs at least one problem")
    learner.model.eval()
    correct = 0
    for start in range(0, len(problems), batch_size):
        batch = qa_batch(tokenizer, problems[start : start + batch_size], eos=False)
        predicted = learner.logits(batch).argmax(-1)  # (B, L): the greedy next token at t
        targets = batch.labels[:, 1:]
        answer = targets != -100
        tokens_ok = ((predicted[:, :-1] == targets) | ~answer).all(1)
        last = batch.attention_mask.sum(1) - 1  # right-padded: index of the last answer token
        after = predicted[torch.arange(len(last)), last]
        for ok, token in zip(tokens_ok.tolist(), after.tolist(), strict=True):
            text = tokenizer.decode([token], skip_special_tokens=True)
            correct += ok and not text[:1].isdigit()
    return correct / len(problems)
