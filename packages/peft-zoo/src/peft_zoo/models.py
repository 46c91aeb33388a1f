"""The models the trainer and ``reproduce`` use: the real SmolLM2-135M (through ``benchdata``) or
a tiny random-initialised Llama with a byte tokenizer (offline, seconds)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from peft_zoo.data import ByteTokenizer

MODELS = ("smollm2-135m", "tiny")


def tiny_llama(seed: int = 0) -> tuple[LlamaForCausalLM, ByteTokenizer]:
    """A 2-layer, width-64 Llama over bytes (vocabulary 258), randomly initialised."""
    torch.manual_seed(seed)
    tokenizer = ByteTokenizer()
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config).eval(), tokenizer


def load_model(name: str, seed: int = 0):
    """``(model, tokenizer)``: ``"smollm2-135m"`` (``benchdata[smollm2]``) or ``"tiny"``."""
    if name == "tiny":
        return tiny_llama(seed)
    if name == "smollm2-135m":
        from benchdata import smollm2_135m

        lm = smollm2_135m()
        return lm.model.eval(), lm.tokenizer
    raise ValueError(f"unknown model {name!r}; choose one of {MODELS}")
