"""Real datasets and pretrained models that install offline, plus seeded generators.

Every loader returns plain numpy arrays, torch tensors or Python objects with documented shapes,
never touches the network, accepts the path of the user's own copy in the standard format, and
raises `DataNotFoundError` (a `FileNotFoundError`) naming the exact install command when its data
is missing. Heavy optional libraries (transformers, scikit-image, ...) are imported only by the
loaders that need them.
"""

from importlib.metadata import PackageNotFoundError, version

from benchdata._files import CACHE_ENV, INSTALL, DataNotFoundError, cache_dir
from benchdata.curves import LearningCurves, fashion_mnist_curves
from benchdata.graph_files import TextGraph, debian_packages_graph, ogb_node_graph, planetoid_graph
from benchdata.graphs import Graph, csbm, edge_homophily, image_knn_graph, knn_graph
from benchdata.hpo_tables import lcbench_curves, pd1_curves, taskset_curves
from benchdata.lcdb import lcdb_curves, lcdb_datasets
from benchdata.models import (
    E5SmallEncoder,
    PretrainedLM,
    e5_small_encoder,
    minilm_encoder,
    smollm2_135m,
)
from benchdata.sequences import TokenSequences, token_sequences, zipf_pmf
from benchdata.sharegpt import sharegpt_conversations
from benchdata.sr import sr_images
from benchdata.text import TextCorpus, fortunes_corpus, lm_batch, tokenizer_cl100k
from benchdata.vision import ImageDataset, digits, fashion_mnist, mnist_5k

try:
    __version__ = version("benchdata")
except PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "CACHE_ENV",
    "INSTALL",
    "DataNotFoundError",
    "E5SmallEncoder",
    "Graph",
    "ImageDataset",
    "LearningCurves",
    "PretrainedLM",
    "TextCorpus",
    "TextGraph",
    "TokenSequences",
    "__version__",
    "cache_dir",
    "csbm",
    "debian_packages_graph",
    "digits",
    "e5_small_encoder",
    "edge_homophily",
    "fashion_mnist",
    "fashion_mnist_curves",
    "fortunes_corpus",
    "image_knn_graph",
    "knn_graph",
    "lcbench_curves",
    "lcdb_curves",
    "lcdb_datasets",
    "lm_batch",
    "minilm_encoder",
    "mnist_5k",
    "ogb_node_graph",
    "pd1_curves",
    "planetoid_graph",
    "sharegpt_conversations",
    "smollm2_135m",
    "sr_images",
    "taskset_curves",
    "token_sequences",
    "tokenizer_cl100k",
    "zipf_pmf",
]
