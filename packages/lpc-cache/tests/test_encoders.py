"""E5Encoder: the authors' "query: " input truncated to the model's 512 tokens, and the
embedding cache on disk."""

from __future__ import annotations

import numpy as np
import pytest

from lpc_cache import E5Encoder


class CountingE5:
    """An E5SmallEncoder stand-in: one token per character, records what it embeds."""

    dim = 4
    max_tokens = 512

    def __init__(self) -> None:
        self.seen: list[str] = []

    def token_count(self, text: str, kind: str = "query") -> int:
        return len(text) + 2  # <s> ... </s>

    def query(self, texts: list[str]) -> np.ndarray:
        self.seen.extend(texts)
        out = np.array([[len(t), t.count(" "), 1.0, 0.0] for t in texts], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_truncation_keeps_the_longest_head_that_fits():
    model = CountingE5()
    encoder = E5Encoder(model, max_tokens=12)  # 10 characters of content
    assert encoder.truncate("abc def") == "abc def"
    assert encoder.truncate("abc def ghi jkl") == "abc def"  # "abc def ghi" is 11 characters
    assert encoder.truncate("abcdefghijklmnop") == "abcdefghij"  # one long word: by characters
    encoder.encode(["abc def ghi jkl", "x"])
    assert model.seen == ["abc def", "x"]


def test_real_e5_truncates_to_512_tokens():
    encoder = E5Encoder()
    text = " ".join(f"word{i}" for i in range(2000))
    head = encoder.truncate(text)
    assert encoder.model.token_count(head) <= 512
    next_word = text[len(head) :].split()[0]
    assert encoder.model.token_count(f"{head} {next_word}") > 512  # nothing more fits
    short = "how do I reset my password?"
    np.testing.assert_array_equal(encoder.encode([short]), encoder.model.query([short]))


def test_cache_embeds_each_text_once_across_instances(tmp_path):
    first = CountingE5()
    a = E5Encoder(first, cache_dir=tmp_path)
    vectors = a.encode(["one", "two", "one"])
    assert first.seen == ["one", "two"]
    second = CountingE5()
    b = E5Encoder(second, cache_dir=tmp_path)
    np.testing.assert_array_equal(b.encode(["two", "one"]), vectors[[1, 0]])
    assert second.seen == []
    assert b.encode([]).shape == (0, 4)
    (tmp_path / "multilingual-e5-small-512.npz").write_bytes(b"not a cache")
    with pytest.raises(ValueError, match="delete it"):
        E5Encoder(CountingE5(), cache_dir=tmp_path)


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_tokens"):
        E5Encoder(CountingE5(), max_tokens=600)
    with pytest.raises(ValueError, match="batch_size"):
        E5Encoder(CountingE5(), batch_size=0)
