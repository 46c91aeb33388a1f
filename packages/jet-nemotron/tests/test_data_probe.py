"""Packing real text into rows, and the passkey probe, with a character tokenizer as oracle."""

from __future__ import annotations

import pytest
import torch

from jet_nemotron.data import _pack, text_rows
from jet_nemotron.probe import passkey_accuracy, passkey_trial


class CharTokenizer:
    """One token per character (its code point), EOS = 0, a trivial chat template."""

    eos_token_id = 0
    chat_template = "plain"

    def __call__(self, text, add_special_tokens=True, return_tensors=None):
        ids = [ord(c) for c in text]
        return {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(int(i)) for i in ids if int(i) != 0)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def test_packing_keeps_every_token_in_order():
    tokenizer = CharTokenizer()
    packed = _pack(tokenizer, ["abc", "de", "fghij"], seq_len=4)
    stream = [97, 98, 99, 0, 100, 101, 0, 102, 103, 104, 105, 106, 0]
    assert packed.tolist() == [stream[0:4], stream[4:8], stream[8:12]]


def test_fortunes_rows_split_by_text():
    rows = text_rows(CharTokenizer(), "fortunes", seq_len=32, num_texts=200)
    assert rows.train.shape[1] == rows.validation.shape[1] == 32
    assert rows.train.dtype == torch.long
    # 10% of the texts are held out: their rows are about a tenth of the whole
    share = len(rows.validation) / (len(rows.train) + len(rows.validation))
    assert 0.03 < share < 0.2


def test_sharegpt_rows_use_the_chat_template():
    rows = text_rows(CharTokenizer(), "sharegpt", seq_len=64, num_texts=20)
    text = CharTokenizer().decode(rows.train.flatten().tolist())
    assert text.startswith("<user>")
    assert "<assistant>" in text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"source": "wiki"}, "source must be one of"),
        ({"seq_len": 1}, "seq_len"),
        ({"validation_fraction": 1.0}, "validation_fraction"),
    ],
)
def test_bad_text_settings_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        text_rows(CharTokenizer(), **{"source": "fortunes", **options})


def test_passkey_prompt_hides_the_key_at_its_depth():
    filler = [f"filler sentence number {i}." for i in range(50)]
    trial = passkey_trial(CharTokenizer(), filler, context_tokens=600, seed=4)
    text = CharTokenizer().decode(trial.input_ids[0].tolist())
    assert 500 <= trial.input_ids.shape[1] <= 620
    assert text.count(trial.key) == 2
    assert text.endswith("The pass key is")
    position = text.index(trial.key) / len(text)
    assert abs(position - trial.depth) < 0.2  # the haystack is most of the prompt
    assert passkey_trial(CharTokenizer(), filler, 600, seed=4).key == trial.key


class Oracle(torch.nn.Module):
    """Generates the key hidden in its prompt (or a wrong one)."""

    def __init__(self, right: bool):
        super().__init__()
        self.right = right
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def generate(self, input_ids, **options):
        text = CharTokenizer().decode(input_ids[0].tolist())
        key = text.split("The pass key is ")[1][:5]
        answer = key if self.right else str(int(key) + 1)
        return torch.cat([input_ids, torch.tensor([[ord(c) for c in " " + answer]])], 1)


def test_passkey_accuracy_counts_exact_keys():
    filler = [f"filler {i}." for i in range(30)]
    assert passkey_accuracy(Oracle(True), CharTokenizer(), filler, 200, trials=3) == 1.0
    assert passkey_accuracy(Oracle(False), CharTokenizer(), filler, 200, trials=3) == 0.0
    with pytest.raises(ValueError, match="context_tokens"):
        passkey_trial(CharTokenizer(), filler, 10, seed=0)
