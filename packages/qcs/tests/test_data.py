"""Pairs, tokenization with response-only loss, the target task and the planted noise."""

from __future__ import annotations

import json
import re

import pytest
import torch
from helpers import byte_tokenizer

from qcs import (
    InstructionPair,
    arithmetic_pairs,
    extract_answer,
    plant_noise,
    read_pairs,
    tokenize_pairs,
)

PAIRS = [InstructionPair("Say hi.", "Hi!"), InstructionPair("Add 2 and 3.", "2 + 3 = 5.")]


def test_prompt_plus_response_is_the_rendered_conversation():
    tokenizer = byte_tokenizer()
    data = tokenize_pairs(PAIRS, tokenizer)
    for i, pair in enumerate(PAIRS):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": pair.prompt},
             {"role": "assistant", "content": pair.response}], tokenize=False)  # fmt: skip
        whole = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert torch.cat([data.prompt_ids[i], data.response_ids[i]]).tolist() == whole
        decoded = tokenizer.decode(data.response_ids[i])
        assert decoded == pair.response + "<|im_end|>\n"


def test_only_response_tokens_carry_loss_and_weights():
    data = tokenize_pairs(PAIRS, byte_tokenizer())
    weights = [torch.arange(len(r), dtype=torch.float32) + 1 for r in data.response_ids]
    batch = data.batch([1, 0], weights)
    for row, i in enumerate([1, 0]):
        start, length = len(data.prompt_ids[i]), len(data.response_ids[i])
        targets = batch["targets"][row]
        scored = torch.nonzero(targets != -100).flatten()
        # exactly the positions start-1 .. start+length-2 predict the response tokens
        assert scored.tolist() == list(range(start - 1, start + length - 1))
        assert torch.equal(targets[scored], data.response_ids[i])
        assert torch.equal(batch["weights"][row][scored], weights[i])
        assert float(batch["weights"][row].sum()) == float(weights[i].sum())
        assert int(batch["attention_mask"][row].sum()) == start + length


def test_long_responses_are_cut_and_marked():
    long = InstructionPair("Say a lot.", "word " * 100)
    data = tokenize_pairs([long, PAIRS[0]], byte_tokenizer(), max_length=80)
    assert len(data.prompt_ids[0]) + len(data.response_ids[0]) == 80
    assert data.truncated.tolist() == [True, False]


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(ValueError, match="chat template"):
        tokenize_pairs(PAIRS, byte_tokenizer(chat_template=None))
    with pytest.raises(ValueError, match="empty response"):
        InstructionPair("Say hi.", "   ")
    with pytest.raises(ValueError, match="leaving fewer than"):
        tokenize_pairs([InstructionPair("x" * 200, "y")], byte_tokenizer(), max_length=64)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"instruction": "a", "output": "b"}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
        read_pairs(bad)
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({"instruction": "a"}) + "\n")
    with pytest.raises(ValueError, match="missing field 'output'"):
        read_pairs(missing)
    with pytest.raises(FileNotFoundError):
        read_pairs(tmp_path / "none.jsonl")
    with pytest.raises(ValueError, match="format must be"):
        read_pairs(bad, "dolly")


def test_read_pairs_in_both_formats(tmp_path):
    alpaca = tmp_path / "a.jsonl"
    alpaca.write_text(json.dumps({"instruction": "Sum", "input": "1 2", "output": "3"}) + "\n")
    assert read_pairs(alpaca) == [InstructionPair("Sum\n\n1 2", "3", "alpaca")]
    share = tmp_path / "s.jsonl"
    share.write_text(
        json.dumps(
            {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}
        )
        + "\n"
    )
    assert read_pairs(share, "sharegpt") == [InstructionPair("Hi", "Hello", "sharegpt")]


def test_arithmetic_answers_are_right():
    for pair in arithmetic_pairs(40, seed=3):
        numbers = [int(v) for v in re.findall(r"\d+", pair.prompt)]
        if "×" in pair.prompt:
            truth = numbers[0] * numbers[1]
        elif "+" in pair.prompt:
            truth = numbers[0] + numbers[1]
        elif " - " in pair.prompt:
            truth = numbers[0] - numbers[1]
        else:  # a has, buys b packs of c
            truth = numbers[0] + numbers[1] * numbers[2]
        assert pair.answer == str(truth)
        assert extract_answer(pair.response) == str(truth)
    assert extract_answer("so the answer is: -12 apples") == "-12"
    assert extract_answer("no number") is None


def test_planted_noise_marks_exactly_what_it_corrupted():
    tokenizer = byte_tokenizer()
    pairs = [InstructionPair(f"Question {i}?", f"Answer number {i} is here, plainly.")
             for i in range(20)]  # fmt: skip
    clean = tokenize_pairs(pairs, tokenizer)
    noisy = plant_noise(clean, sequence_fraction=0.3, token_fraction=0.25,
                        vocab_size=len(tokenizer), special_ids=tuple(tokenizer.all_special_ids),
                        seed=1)  # fmt: skip
    assert int(noisy.noisy_sequence.sum()) == 6
    assert sum(int(t.any()) for t in noisy.noisy_tokens) == 5
    for i in range(len(clean)):
        before, after = clean.response_ids[i], noisy.response_ids[i]
        if noisy.noisy_sequence[i]:
            assert not torch.equal(before, after)  # shuffled or truncated
            assert not noisy.noisy_tokens[i].any()
        else:
            assert torch.equal(before != after, noisy.noisy_tokens[i])
            garbage = after[noisy.noisy_tokens[i]]
            assert not any(int(t) in tokenizer.all_special_ids for t in garbage)
    again = plant_noise(clean, sequence_fraction=0.3, token_fraction=0.25,
                        vocab_size=len(tokenizer), seed=1)  # fmt: skip
    assert torch.equal(again.noisy_sequence, noisy.noisy_sequence)
    with pytest.raises(ValueError, match="already holds"):
        plant_noise(noisy, vocab_size=len(tokenizer))
