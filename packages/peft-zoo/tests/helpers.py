"""Test helpers: tiny random-initialised Hugging Face models built from configs, id batches."""

from __future__ import annotations

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

VOCAB = 96
# Llama and Qwen2 share the architecture knobs; the same tiny sizes for both
DECODER_SIZES = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
DECODERS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def tiny_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind in DECODERS:
        config_class, model_class = DECODERS[kind]
        model = model_class(config_class(**DECODER_SIZES))
    elif kind == "gpt2":
        config = GPT2Config(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=128,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        model = GPT2LMHeadModel(config)
    elif kind == "bert":
        config = BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=128,
            num_labels=3,
        )
        model = BertForSequenceClassification(config)
    else:
        raise ValueError(kind)
    return model.eval()


CAUSAL = ["llama", "gpt2", "qwen2"]


def batch(seed: int = 0, size: int = 3, length: int = 7) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (size, length), generator=generator)


def left_pad(rows: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad 1-D id tensors into ``(ids, mask)``."""
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, length - len(row) :] = row
        mask[i, length - len(row) :] = 1
    return ids, mask
