import gzip
import hashlib
import math
import pickle
import random
import re
import shutil
import zlib
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import benchdata
from benchdata import DataNotFoundError, debian_packages_graph, ogb_node_graph, planetoid_graph

from .test_graphs import assert_simple_undirected


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(benchdata.CACHE_ENV, str(tmp_path / "cache"))


# Twelve records: version constraints, arch qualifiers, alternatives whose first name is absent or
# present, a dependency on an absent package, a self dependency, areas in Sections, a second
# record for `alpha` (ignored: its Section and Depends must not show), Suggests (not an edge).
DUMPAVAIL = """\
Package: zeta
Version: 1.0
Section: non-free/games
Depends: libfoo1, zeta (>= 0.9)
Description: Zeta game
Filename: pool/z/zeta.deb

Package: alpha
Version: 2.0
Section: utils
Depends: libfoo1 (>= 1.2), libbar1:any | libbaz1, python3:any (>= 3.11~), missing-pkg
Recommends: beta, libfoo1
Description: Alpha tool for tests
 Alpha does alpha things.
 .
 Second paragraph.
Filename: pool/a/alpha.deb

Package: beta
Section: contrib/utils
Pre-Depends: dpkg (>= 1.15)
Depends: alpha [amd64]
Description: Beta helper

Package: libfoo1
Section: libs
Depends: libc6 (>= 2.34)
Description: Foo library

Package: libbaz1
Section: libs
Depends: libc6
Description: Baz library

Package: libc6
Section: libs
Description: GNU C Library: Shared libraries

Package: dpkg
Section: admin
Depends: libc6 (>= 2.34), tar | gnu-tar
Description: Debian package management system

Package: python3
Section: python
Depends: python3.11 (>= 3.11.2-1~), libc6
Description: interactive high-level object-oriented language (default python3 version)

Package: python3.11
Section: python
Depends: libc6, libfoo1 | libbaz1
Description: Interactive high-level object-oriented language (version 3.11)

Package: alpha
Version: 1.0
Section: games
Depends: zeta
Description: An older alpha

Package: gamma
Section: contrib/games
Recommends: zeta, alpha | beta
Suggests: libc6
Description: Gamma puzzle

Package: delta
Section: doc
Depends: beta
Description: Delta documentation
"""

# derived by hand from the records above; Sections: libs 3; games, python, utils 2; admin, doc 1
CLASSES = ["libs", "games", "python", "utils", "admin", "doc"]
SECTION = {
    "alpha": "utils",
    "beta": "utils",
    "delta": "doc",
    "dpkg": "admin",
    "gamma": "games",
    "libbaz1": "libs",
    "libc6": "libs",
    "libfoo1": "libs",
    "python3": "python",
    "python3.11": "python",
    "zeta": "games",
}
EDGES = {
    ("zeta", "libfoo1"),
    ("alpha", "libfoo1"),
    ("alpha", "libbaz1"),  # libbar1 is absent: the next alternative
    ("alpha", "python3"),
    ("alpha", "beta"),  # Recommends of alpha, Depends of beta
    ("beta", "dpkg"),
    ("libfoo1", "libc6"),
    ("libbaz1", "libc6"),
    ("dpkg", "libc6"),
    ("python3", "python3.11"),
    ("python3", "libc6"),
    ("python3.11", "libc6"),
    ("python3.11", "libfoo1"),  # the first of two present alternatives only
    ("gamma", "zeta"),
    ("gamma", "alpha"),
    ("delta", "beta"),
}
ALPHA_TEXT = "Alpha tool for tests\nAlpha does alpha things.\n\nSecond paragraph."


@pytest.fixture
def dump(tmp_path):
    path = tmp_path / "dumpavail.txt"
    path.write_text(DUMPAVAIL)
    return path


def edge_names(data):
    return {(data.names[i], data.names[j]) for i, j in data.graph.edge_index.T.tolist()}


def undirected(pairs):
    return pairs | {(b, a) for a, b in pairs}


@pytest.mark.parametrize("num_classes", [4, 6])
def test_debian_parser_matches_the_hand_derived_graph(dump, num_classes):
    data = debian_packages_graph(features="bow", num_classes=num_classes, dumpavail=dump)
    classes = CLASSES[:num_classes]
    kept = sorted(name for name, section in SECTION.items() if section in classes)
    assert data.names == kept  # num_classes=4 drops dpkg (admin) and delta (doc)
    assert data.class_names == classes
    assert [classes[c] for c in data.graph.labels.tolist()] == [SECTION[n] for n in kept]
    expected = {(a, b) for a, b in EDGES if a in kept and b in kept}
    assert edge_names(data) == undirected(expected)
    assert_simple_undirected(data.graph.edge_index, len(kept))
    assert data.sha256 == hashlib.sha256(DUMPAVAIL.encode()).hexdigest()
    assert data.texts[kept.index("alpha")] == ALPHA_TEXT
    summary = data.summary()
    assert (summary["nodes"], summary["edges"], summary["classes"]) == (
        len(kept),
        len(expected),
        num_classes,
    )
    assert summary["class_sizes"] == dict(Counter(SECTION[n] for n in kept))
    assert data.graph.features.shape == (len(kept), benchdata.graph_files.DEBIAN_BOW_DIM)


NAMES = ["a", "b", "c", "d", "e", "f", "g", "h"]  # g and h never get a record (absent)
DECORATIONS = ["{}", "{} (>= 1.0)", "{}:any", "{}:amd64 (<< 2~)", "{} [amd64]"]
package_records = st.dictionaries(
    st.sampled_from(NAMES[:6]),
    st.tuples(
        st.sampled_from(["libs", "main/libs", "contrib/utils", "utils", "doc"]),
        st.lists(  # relation fields: groups of alternatives, each name decorated
            st.lists(
                st.tuples(st.sampled_from(NAMES), st.sampled_from(DECORATIONS)),
                min_size=1,
                max_size=3,
            ),
            max_size=4,
        ),
        st.sampled_from(["Depends", "Pre-Depends", "Recommends", "Suggests"]),
    ),
    min_size=2,
)


@settings(max_examples=40, deadline=None)
@given(records=package_records)
def test_debian_edges_equal_a_brute_force_over_random_records(records, tmp_path_factory):
    text = "Package: z\nSection: games\nDescription: a second Section at least\n\n"
    for name, (section, groups, relation) in records.items():
        value = ", ".join(" | ".join(d.format(n) for n, d in group) for group in groups)
        text += f"Package: {name}\nSection: {section}\n{relation}: {value}\nDescription: x\n\n"
    path = tmp_path_factory.mktemp("dump") / "dumpavail.txt"
    path.write_text(text)
    sections = {section.rpartition("/")[2] for section, _, _ in records.values()} | {"games"}
    data = debian_packages_graph(
        features="bow", num_classes=len(sections), dumpavail=path, cache=False
    )
    expected = set()
    for name, (_, groups, relation) in records.items():
        if relation == "Suggests":
            continue
        for group in groups:
            present = [n for n, _ in group if n in records]
            if present and present[0] != name:
                expected |= {(name, present[0]), (present[0], name)}
    assert data.names == sorted([*records, "z"])
    assert edge_names(data) == expected


def test_debian_bag_of_words_is_the_documented_hash(dump):
    data = debian_packages_graph(features="bow", bow_dim=8, num_classes=6, dumpavail=dump)
    features = data.graph.features.numpy()
    # alpha's words, crc32 mod 8: alpha (x3) 0xD0E0396A -> 2, tool 0x20F33ED1 -> 1,
    # for 0xEF7509F8 -> 0, tests 0x1260FC5E -> 6, does 0x070D8C31 -> 1, things 0x6FE451BD -> 5,
    # second 0xB61F1169 -> 1, paragraph 0x7DD39862 -> 2
    counts = {0: 1, 1: 1 + 1 + 1, 2: 3 + 1, 5: 1, 6: 1}
    expected = np.zeros(8)
    for column, count in counts.items():
        expected[column] = count / math.sqrt(1 + 9 + 16 + 1 + 1)
    np.testing.assert_allclose(features[data.names.index("alpha")], expected, rtol=1e-6)
    for name, text in zip(data.names, data.texts, strict=True):  # every row, recomputed
        words = Counter(zlib.crc32(w.encode()) % 8 for w in re.findall("[a-z0-9]+", text.lower()))
        row = np.zeros(8)
        for column, count in words.items():
            row[column] = count
        np.testing.assert_allclose(features[data.names.index(name)], row / np.linalg.norm(row))
    again = debian_packages_graph(features="bow", bow_dim=8, num_classes=6, dumpavail=dump)
    assert torch.equal(again.graph.features, data.graph.features)


def test_debian_parse_is_cached_and_verified(dump, tmp_path, monkeypatch):
    first = debian_packages_graph(features="bow", dumpavail=dump, num_classes=4)
    calls = []
    original = benchdata.graph_files._parse_dumpavail
    monkeypatch.setattr(
        benchdata.graph_files, "_parse_dumpavail", lambda text: calls.append(1) or original(text)
    )
    again = debian_packages_graph(features="bow", dumpavail=dump, num_classes=4)
    assert calls == []
    assert again.names == first.names
    assert all(torch.equal(a, b) for a, b in zip(first.graph, again.graph, strict=True))
    (folder,) = [p for p in (tmp_path / "cache" / "debian-packages").iterdir() if p.is_dir()]
    assert folder.name == first.sha256[:16]
    (folder / "pairs.npy").write_bytes(b"tampered")
    assert edge_names(debian_packages_graph(features="bow", dumpavail=dump, num_classes=4)) == (
        edge_names(first)
    )
    assert calls == [1]  # parsed again
    uncached = debian_packages_graph(features="bow", dumpavail=dump, num_classes=4, cache=False)
    assert torch.equal(uncached.graph.edge_index, first.graph.edge_index)


def test_debian_errors_name_the_problem(dump, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="num_classes must be an int >= 2"):
        debian_packages_graph(features="bow", dumpavail=dump, num_classes=1)
    with pytest.raises(ValueError, match="num_classes must be an int"):
        debian_packages_graph(features="bow", dumpavail=dump, num_classes=True)
    with pytest.raises(ValueError, match="only 6 Sections"):
        debian_packages_graph(features="bow", dumpavail=dump, num_classes=7)
    with pytest.raises(ValueError, match="bow_dim"):
        debian_packages_graph(features="bow", dumpavail=dump, bow_dim=0)
    with pytest.raises(ValueError, match="features must be"):
        debian_packages_graph(features="tfidf", dumpavail=dump)
    with pytest.raises(DataNotFoundError, match="apt-get update"):
        debian_packages_graph(features="bow", dumpavail=tmp_path / "missing.txt")
    # no apt-cache on PATH; then one that lists only installed packages (no archive index)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(DataNotFoundError, match=r"no apt-cache.*`apt-get update`"):
        debian_packages_graph(features="bow")
    fake = bin_dir / "apt-cache"
    fake.write_text("#!/bin/sh\nprintf 'Package: base-files\\nSection: admin\\n\\n'\n")
    fake.chmod(0o755)
    with pytest.raises(DataNotFoundError, match=r"only installed packages.*`apt-get update`"):
        debian_packages_graph(features="bow")
    fake.write_text("#!/bin/sh\necho 'E: broken lists' >&2\nexit 100\n")
    with pytest.raises(DataNotFoundError, match=r"E: broken lists.*`apt-get update`"):
        debian_packages_graph(features="bow")


def test_debian_minilm_features_are_the_encoder_of_the_texts(dump, monkeypatch, no_network):
    pytest.importorskip("sentence_transformers", reason="the minilm extra is not installed")
    encoder = benchdata.minilm_encoder()
    monkeypatch.setattr(benchdata.models, "minilm_encoder", lambda: encoder)  # loaded once
    data = debian_packages_graph(features="minilm", num_classes=6, dumpavail=dump)
    expected = encoder.encode(data.texts)
    assert data.graph.features.shape == (11, 384)
    assert data.graph.features.dtype == torch.float32
    # the same fp32 model on other batches (padding differs): agreement to float32 rounding
    np.testing.assert_allclose(data.graph.features, expected, rtol=1e-4, atol=1e-5)
    uncached = debian_packages_graph(features="minilm", num_classes=4, dumpavail=dump, cache=False)
    rows = [data.names.index(name) for name in uncached.names]
    np.testing.assert_allclose(uncached.graph.features, expected[rows], rtol=1e-4, atol=1e-5)

    def refuse():
        raise AssertionError("encoded again")

    monkeypatch.setattr(benchdata.models, "minilm_encoder", refuse)
    cached = debian_packages_graph(features="minilm", num_classes=4, dumpavail=dump)
    assert torch.equal(cached.graph.features, data.graph.features[rows])


def apt_dump() -> bytes:
    if shutil.which("apt-cache") is None:
        pytest.skip("apt-cache is not installed (not a Debian or Ubuntu machine)")
    return benchdata.graph_files._dumpavail_bytes()


def test_debian_real_index(monkeypatch):
    raw = apt_dump()
    monkeypatch.setattr(benchdata.graph_files, "_dumpavail_bytes", lambda: raw)  # run it once
    data = debian_packages_graph(features="bow")
    assert data.sha256 == hashlib.sha256(raw).hexdigest()
    assert data.num_nodes > 20_000
    assert data.num_edges > 50_000
    assert data.num_classes == 10
    assert_simple_undirected(data.graph.edge_index, data.num_nodes)
    assert data.graph.features.shape == (data.num_nodes, 512)

    # oracle: a line scan of the dump (one record per package in apt's output)
    text = raw.decode("utf-8", errors="replace")
    sections = Counter(s.rpartition("/")[2] for s in re.findall(r"^Section: *(\S+)", text, re.M))
    top = sorted(sections, key=lambda s: (-sections[s], s))[:10]
    assert data.class_names == top
    assert data.summary()["class_sizes"] == {s: sections[s] for s in top}
    relations = {}
    for record in text.split("\n\n"):
        name = re.search(r"^Package: *(\S+)", record, re.M)
        if name:
            fields = re.findall(r"^(?:Pre-Depends|Depends|Recommends):(.*)", record, re.M)
            relations[name[1]] = set(re.findall(r"[a-z0-9][a-z0-9+.-]+", " ".join(fields)))
    edges = data.graph.edge_index.T.tolist()
    for i, j in random.Random(0).sample(edges, 200):
        a, b = data.names[i], data.names[j]
        assert b in relations[a] or a in relations[b], (a, b)

    # the same snapshot gives the same graph, from the cache as from a fresh parse
    again = debian_packages_graph(features="bow", cache=False)
    assert again.names == data.names
    assert again.texts == data.texts
    assert all(torch.equal(a, b) for a, b in zip(data.graph, again.graph, strict=True))


# ---------------------------------------------------------------------------------------------
# Planetoid: tiny files in the format of Kipf's gcn repository, written here


def write_planetoid(folder: Path, prefix: str, test_offsets: list[int], num_allx: int = 6) -> dict:
    """`num_allx` non-test nodes (the first 3 labelled), 3 classes, 4 features; test node ids
    start at `num_allx`, and tx row k is node test_index[k]."""
    sparse = pytest.importorskip("scipy.sparse")
    rng = np.random.default_rng(0)
    test_index = [num_allx + offset for offset in test_offsets]
    allx = rng.integers(0, 2, (num_allx, 4)).astype(np.float32)
    tx = rng.integers(0, 2, (len(test_index), 4)).astype(np.float32)
    ally = np.eye(3, dtype=np.int64)[np.resize([0, 1, 2, 2, 1, 0], num_allx)]
    ty = np.eye(3, dtype=np.int64)[[1, 2, 0, 1][: len(test_index)]]
    n = num_allx
    graph = defaultdict(list, {0: [1, 2], 1: [0], 2: [0, 2], 3: [4], 4: [3], n: [n + 2, n + 2]})
    graph[n + 3].append(5)  # stored in one direction only
    arrays = {
        "x": sparse.csr_matrix(allx[:3]),
        "tx": sparse.csr_matrix(tx),
        "allx": sparse.csr_matrix(allx),
        "y": ally[:3],
        "ty": ty,
        "ally": ally,
        "graph": graph,
    }
    folder.mkdir(exist_ok=True)
    for item, value in arrays.items():
        with (folder / f"ind.{prefix}.{item}").open("wb") as handle:
            pickle.dump(value, handle, protocol=2)
    (folder / f"ind.{prefix}.test.index").write_text("".join(f"{i}\n" for i in test_index))
    return {"allx": allx, "tx": tx, "ally": ally, "ty": ty}


def test_planetoid_reads_the_raw_format_with_gaps_in_the_test_ids(tmp_path):
    # CiteSeer-like: test ids 8, 6, 9 leave node 7 out: zero features, label 0, in no split
    written = write_planetoid(tmp_path, "citeseer", [2, 0, 3])
    graph, split = planetoid_graph(tmp_path, "CiteSeer")
    features = np.zeros((10, 4), dtype=np.float32)
    features[:6] = written["allx"]
    features[[8, 6, 9]] = written["tx"]
    labels = [0, 1, 2, 2, 1, 0, 2, 0, 1, 0]  # node 6 = ty row 1, 8 = row 0, 9 = row 2
    np.testing.assert_array_equal(graph.features.numpy(), features)
    assert graph.features.dtype == torch.float32
    assert graph.labels.tolist() == labels
    expected = undirected({(0, 1), (0, 2), (3, 4), (6, 8), (5, 9)})  # self loop 2-2 dropped
    assert set(map(tuple, graph.edge_index.T.tolist())) == expected
    assert_simple_undirected(graph.edge_index, 10)
    assert split["train"].tolist() == [0, 1, 2]
    assert split["val"].tolist() == [3, 4, 5]  # the next 500, cut where allx ends
    assert split["test"].tolist() == [6, 8, 9]


def test_planetoid_agrees_with_pytorch_geometric(tmp_path):
    planetoid = pytest.importorskip("torch_geometric.io.planetoid")
    # PyG's reader needs the 500 validation nodes to exist
    for prefix, test_offsets in (("citeseer", [2, 0, 3]), ("cora", [1, 0, 2, 3])):
        folder = tmp_path / prefix
        write_planetoid(folder, prefix, test_offsets, num_allx=506)
        graph, split = planetoid_graph(folder, prefix)
        data = planetoid.read_planetoid_data(str(folder), prefix)
        assert torch.equal(graph.features, data.x)
        assert torch.equal(graph.labels, data.y)
        ours = set(map(tuple, graph.edge_index.T.tolist()))
        theirs = set(map(tuple, data.edge_index.T.tolist()))
        assert ours == theirs | {(j, i) for i, j in theirs}  # PyG keeps the stored directions
        assert torch.equal(split["test"], data.test_mask.nonzero().view(-1))
        assert torch.equal(split["train"], data.train_mask.nonzero().view(-1))


def test_planetoid_errors_name_the_missing_file(tmp_path):
    with pytest.raises(ValueError, match="Cora, CiteSeer, PubMed"):
        planetoid_graph(tmp_path, "reddit")
    with pytest.raises(DataNotFoundError, match=r"ind\.cora\.x not found") as error:
        planetoid_graph(tmp_path, "cora")
    assert error.value.install is None
    write_planetoid(tmp_path, "cora", [0, 1, 2, 3])
    (tmp_path / "ind.cora.ty").unlink()
    with pytest.raises(DataNotFoundError, match=r"ind\.cora\.ty not found.*kimiyoung/planetoid"):
        planetoid_graph(tmp_path, "Cora")


# ---------------------------------------------------------------------------------------------
# OGB: tiny csv.gz files in the layout of ogbn-arxiv's zip, written here


def write_csv_gz(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        handle.writelines(",".join(str(v) for v in np.atleast_1d(row)) + "\n" for row in rows)


def write_ogb(root: Path, split: str = "time") -> dict:
    rng = np.random.default_rng(1)
    features = rng.standard_normal((6, 3)).astype(np.float32).round(4)
    labels = [3, 0, 1, 3, 2, 0]
    # directed citations, one pair in both directions, one self loop; node 5 isolated
    edges = [[1, 0], [2, 0], [0, 2], [3, 3], [4, 1], [3, 2]]
    raw = root / "raw"
    write_csv_gz(raw / "edge.csv.gz", edges)
    write_csv_gz(raw / "node-feat.csv.gz", features)
    write_csv_gz(raw / "node-label.csv.gz", labels)
    write_csv_gz(raw / "num-node-list.csv.gz", [6])
    write_csv_gz(raw / "num-edge-list.csv.gz", [len(edges)])
    for stem, ids in (("train", [0, 1, 2]), ("valid", [3]), ("test", [4, 5])):
        write_csv_gz(root / "split" / split / f"{stem}.csv.gz", ids)
    return {"features": features, "labels": labels}


def test_ogb_reads_the_raw_format(tmp_path):
    written = write_ogb(tmp_path)
    graph, split = ogb_node_graph(tmp_path, "ogbn-arxiv")
    np.testing.assert_array_equal(graph.features.numpy(), written["features"])
    assert graph.features.dtype == torch.float32
    assert graph.labels.tolist() == written["labels"]
    expected = undirected({(0, 1), (0, 2), (1, 4), (2, 3)})
    assert set(map(tuple, graph.edge_index.T.tolist())) == expected
    assert_simple_undirected(graph.edge_index, 6)
    assert {k: v.tolist() for k, v in split.items()} == {
        "train": [0, 1, 2],
        "val": [3],
        "test": [4, 5],
    }
    write_ogb(tmp_path / "products", split="sales_ranking")
    _, split = ogb_node_graph(tmp_path / "products", "ogbn-products")
    assert split["val"].tolist() == [3]


def test_ogb_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="ogbn-arxiv"):
        ogb_node_graph(tmp_path, "ogbn-mag")
    with pytest.raises(DataNotFoundError, match=r"edge\.csv\.gz not found.*OGB"):
        ogb_node_graph(tmp_path, "ogbn-arxiv")
    write_ogb(tmp_path)
    with pytest.raises(DataNotFoundError, match=r"split/sales_ranking/train\.csv\.gz"):
        ogb_node_graph(tmp_path, "ogbn-arxiv", split="sales_ranking")
    write_csv_gz(tmp_path / "raw" / "num-node-list.csv.gz", [7])
    with pytest.raises(ValueError, match=r"num-node-list\.csv\.gz lists \[7\], read 6 nodes"):
        ogb_node_graph(tmp_path, "ogbn-arxiv")
    write_csv_gz(tmp_path / "raw" / "num-node-list.csv.gz", [6])
    write_csv_gz(tmp_path / "raw" / "edge.csv.gz", [[0, 6]])
    write_csv_gz(tmp_path / "raw" / "num-edge-list.csv.gz", [1])
    with pytest.raises(ValueError, match=r"node ids must lie in 0\.\.5"):
        ogb_node_graph(tmp_path, "ogbn-arxiv")
