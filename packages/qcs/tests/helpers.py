"""Test helpers: a byte-level tokenizer with a ChatML template and a tiny Llama over it."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from qcs import InstructionPair, arithmetic_pairs, tokenize_pairs

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|im_start|>", "<|im_end|>", "<pad>"]


def byte_tokenizer(chat_template: str | None = CHATML) -> PreTrainedTokenizerFast:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    tokenizer.add_special_tokens(
        {
            "additional_special_tokens": SPECIALS[:2],
            "pad_token": SPECIALS[2],
            "eos_token": SPECIALS[1],
        }
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def tiny_llama(vocab_size: int, layers: int = 3, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


TEXTS = [
    ("Name a colour.", "Blue is a colour."),
    ("Say hello.", "Hello there, friend!"),
    ("What is two plus two?", "Two plus two is four."),
    ("Give a fruit.", "An apple is a fruit."),
    ("Count to three.", "One, two, three."),
    ("Name an animal.", "A cat is an animal."),
    ("Spell cat.", "C, A, T spells cat."),
    ("What day follows Monday?", "Tuesday follows Monday."),
]


def tiny_task(count: int = 8, max_length: int = 192):
    tokenizer = byte_tokenizer()
    pairs = [InstructionPair(p, r, "toy") for p, r in TEXTS[:count]]
    pool = tokenize_pairs(pairs, tokenizer, max_length=max_length)
    validation = tokenize_pairs(arithmetic_pairs(3, seed=1), tokenizer, max_length=max_length)
    return tokenizer, pool, validation
