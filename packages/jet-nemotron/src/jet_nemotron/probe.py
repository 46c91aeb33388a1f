"""Passkey retrieval: a number hidden at a random depth of a long filler context.

The filler is real text (fortunes); the key is a seeded 5-digit number stated twice at a random
depth, and the question asks for it at the end, as the passkey tests of long-context papers do.
A trial passes when the first number the model generates (greedy) is the key. The prompt goes
through the tokenizer's chat template when it has one, with the answer's start ("The pass key
is") already written, so a short greedy continuation suffices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

INSTRUCTION = "There is a pass key hidden inside a lot of irrelevant text. Find it and remember it."
QUESTION = "What is the pass key?"
ANSWER_START = "The pass key is"


@dataclass(frozen=True)
class PasskeyTrial:
    """One prompt: its token ids and the key it hides."""

    input_ids: torch.Tensor  # (1, L) int64
    key: str
    depth: float  # where the key sits, as a fraction of the filler


def passkey_trial(
    tokenizer: Any, filler: list[str], context_tokens: int, seed: int
) -> PasskeyTrial:
    """Build a prompt of about ``context_tokens`` tokens hiding a seeded key at a seeded depth.

    Args:
        tokenizer: a Hugging Face tokenizer.
        filler: texts to draw the haystack from (in a seeded order).
        context_tokens: target prompt length; the haystack is cut to fit it.
        seed: selects the key, the depth and the filler.
    """
    if context_tokens < 64:
        raise ValueError(f"context_tokens must be >= 64 to hold the question, got {context_tokens}")
    if not filler:
        raise ValueError("filler must hold at least one text")
    generator = torch.Generator().manual_seed(seed)
    key = str(int(torch.randint(10_000, 100_000, (1,), generator=generator)))
    depth = float(torch.rand((), generator=generator))
    needle = f" The pass key is {key}. Remember it. {key} is the pass key. "
    overhead = len(tokenizer(INSTRUCTION + needle + QUESTION + ANSWER_START)["input_ids"]) + 32
    budget = context_tokens - overhead
    order = torch.randperm(len(filler), generator=generator).tolist()
    haystack: list[int] = []
    for index in order * (1 + budget // max(1, len(filler))):
        haystack.extend(tokenizer(" " + filler[index], add_special_tokens=False)["input_ids"])
        if len(haystack) >= budget:
            break
    haystack = haystack[: max(budget, 0)]
    cut = round(depth * len(haystack))
    text = (tokenizer.decode(haystack[:cut]) + needle + tokenizer.decode(haystack[cut:])).strip()
    content = f"{INSTRUCTION}\n\n{text}\n\n{QUESTION}"
    if getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    else:
        prompt = content + "\n"
    ids = tokenizer(prompt + ANSWER_START, add_special_tokens=False, return_tensors="pt")
    return PasskeyTrial(ids["input_ids"], key, depth)


@torch.no_grad()
def passkey_accuracy(
    model: Any,
    tokenizer: Any,
    filler: list[str],
    context_tokens: int,
    trials: int = 5,
    seed: int = 0,
) -> float:
    """Share of ``trials`` seeded prompts whose key the model retrieves (greedy, 8 new tokens).

    Example:
        >>> import benchdata
        >>> lm = benchdata.smollm2_135m()
        >>> texts = benchdata.fortunes_corpus().train
        >>> 0.0 <= passkey_accuracy(lm.model, lm.tokenizer, texts, 256, trials=1) <= 1.0
        True
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    device = next(model.parameters()).device
    hits = 0
    for trial_index in range(trials):
        trial = passkey_trial(tokenizer, filler, context_tokens, seed + trial_index)
        ids = trial.input_ids.to(device)
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
            do_sample=False, pad_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
        answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        found = re.search(r"\d+", answer)
        hits += int(found is not None and found.group() == trial.key)
    return hits / trials
