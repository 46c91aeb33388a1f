"""Text encoders for the continuation predictor: anything with ``encode(texts) -> (N, D)``.

* :class:`SentenceEncoder`: a sentence-transformers model (all-MiniLM-L6-v2 from benchdata in
  place of the paper's multilingual-e5-small), with an optional on-disk cache keyed by the
  SHA-256 of the model name and the text, so repeated runs embed each prompt once.
* :class:`HashingEncoder`: a dependency-free bag-of-words feature hasher (tests, quick baselines).
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


class SentenceEncoder:
    """A sentence-transformers model truncated to ``max_tokens`` word pieces per text.

    Args:
        model: a ``SentenceTransformer`` (default: ``benchdata.minilm_encoder()``).
        max_tokens: word pieces kept per text (256: MiniLM's own limit).
        batch_size: texts per forward pass.
        cache_dir: folder of an embedding cache (``<name>.npz``), or None.
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
        self.cache_path = (
            None if cache_dir is None else Path(cache_dir) / f"{name}-{max_tokens}.npz"
        )
        self._cache: dict[str, np.ndarray] = {}
        if self.cache_path is not None and self.cache_path.exists():
            self._cache = _read_cache(self.cache_path, self.dim)

    def _key(self, text: str) -> str:
        return hashlib.sha256(f"{self.name}\0{text}".encode()).hexdigest()

    def encode(self, texts: list[str]) -> np.ndarray:
        import torch

        keys = [self._key(t) for t in texts]
        todo = {k: t for k, t in zip(keys, texts, strict=True) if k not in self._cache}
        if todo:
            logger.info("embedding %d new texts with %s", len(todo), self.name)
            with torch.inference_mode():
                vectors = self.model.encode(
                    list(todo.values()),
                    batch_size=self.batch_size,
                    convert_to_numpy=True,
                    show_progress_bar=len(todo) > 2000,
                )
            self._cache.update(zip(todo, vectors.astype(np.float32), strict=True))
            if self.cache_path is not None:
                stored = list(self._cache)
                with atomic_file(self.cache_path) as temporary:  # never half a cache file
                    np.savez(
                        temporary,
                        keys=np.array(stored),
                        vectors=np.stack([self._cache[k] for k in stored]),
                    )
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._cache[k] for k in keys]).astype(np.float32)
