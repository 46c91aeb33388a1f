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
    assert encoder.truncate("abc def ghi jkl") == "abc def gh"  # into the word that overflows
    assert encoder.truncate("abcdefghijklmnop") == "abcdefghij"
    assert encoder.truncate("ab cdefghijklmnopq") == "ab cdefghi"  # a long word after a short one
    encoder.encode(["abc def ghi jkl", "x"])
    assert model.seen == ["abc def gh", "x"]


def test_real_e5_truncates_to_512_tokens():
    encoder = E5Encoder()
    separator = "\nThe next user query is: "
    for text in (
        " ".join(f"word{i}" for i in range(2000)),
        "你好" + separator + "这是一个很长的问题" * 200,  # no spaces in the current prompt
    ):
        head = encoder.truncate(text)
        assert encoder.model.token_count(head) <= 512
        assert encoder.model.token_count(text[: len(head) + 1]) > 512  # one more character: not
    assert len(encoder.truncate("你好" + separator + "这是一个很长的问题" * 200)) > 400
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
    (tmp_path / "multilingual-e5-small-512-cut2.npz").write_bytes(b"not a cache")
    with pytest.raises(ValueError, match="delete it"):
        E5Encoder(CountingE5(), cache_dir=tmp_path)


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_tokens"):
        E5Encoder(CountingE5(), max_tokens=600)
    with pytest.raises(ValueError, match=r"max_tokens must be in \[3, 512\]"):
        E5Encoder(CountingE5(), max_tokens=2)  # not even the special tokens fit
    with pytest.raises(ValueError, match="batch_size"):
        E5Encoder(CountingE5(), batch_size=0)


def test_a_failed_run_keeps_the_embeddings_of_finished_chunks(tmp_path):
    class Failing(CountingE5):
        def query(self, texts):
            if any(t.startswith("boom") for t in texts):
                raise RuntimeError("engine failed")
            return super().query(texts)

    encoder = E5Encoder(Failing(), cache_dir=tmp_path, batch_size=2)
    texts = [f"text {i}" for i in range(1500)] + ["boom"]
    with pytest.raises(RuntimeError):
        encoder.encode(texts)  # the cache saves every 1024 texts
    again = CountingE5()
    E5Encoder(again, cache_dir=tmp_path).encode(texts[:-1])
    assert len(again.seen) == 1500 - 1024
