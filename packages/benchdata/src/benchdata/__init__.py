"""Real datasets and pretrained models that install offline, plus seeded generators.

Every loader returns plain numpy arrays, torch tensors or Python objects with documented shapes,
never touches the network, and raises `DataNotFoundError` (a `FileNotFoundError`) naming the
exact install command when its data is missing.
"""

from importlib.metadata import PackageNotFoundError, version

from benchdata._files import CACHE_ENV, DataNotFoundError, cache_dir
from benchdata.text import TextCorpus, fortunes_corpus, lm_batch, tokenizer_cl100k

try:
    __version__ = version("benchdata")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = [
    "CACHE_ENV",
    "DataNotFoundError",
    "TextCorpus",
    "__version__",
    "cache_dir",
    "fortunes_corpus",
    "lm_batch",
    "tokenizer_cl100k",
]
