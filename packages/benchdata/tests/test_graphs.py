import math

import numpy as np
import pytest
import torch

from benchdata import csbm, edge_homophily, image_knn_graph, knn_graph


def assert_simple_undirected(edge_index, num_nodes):
    source, target = edge_index
    assert edge_index.dtype == torch.int64
    assert (source != target).all(), "self loop"
    assert int(edge_index.min()) >= 0
    assert int(edge_index.max()) < num_nodes
    keys = source * num_nodes + target
    assert torch.equal(keys, torch.unique(keys)), "duplicate or unsorted edges"
    assert torch.equal(torch.sort(target * num_nodes + source).values, keys), "not symmetric"


@pytest.mark.parametrize("homophily", [0.0, 0.1, 0.35, 0.5, 0.8, 0.95, 1.0])
@pytest.mark.parametrize("num_classes", [2, 5])
def test_csbm_homophily_is_what_was_asked(homophily, num_classes):
    graph = csbm(1000, num_classes=num_classes, homophily=homophily, average_degree=6, seed=3)
    assert abs(edge_homophily(graph.edge_index, graph.labels) - homophily) <= 0.05
    assert_simple_undirected(graph.edge_index, 1000)
    assert graph.edge_index.shape[1] == 2 * 3000  # average degree 6 over 1,000 nodes
    assert np.bincount(graph.labels.numpy()).tolist() == [1000 // num_classes] * num_classes


def test_csbm_edges_pick_partners_uniformly():
    graph = csbm(400, num_classes=2, homophily=0.5, average_degree=20, seed=0)
    degree = torch.bincount(graph.edge_index[0], minlength=400).double()
    # each node is an endpoint of Binomial-like many edges: mean 20, variance about 20
    assert degree.mean().item() == pytest.approx(20.0)
    assert 10 < degree.var().item() < 40


def test_csbm_features_separate_classes_as_the_closed_form_says():
    signal = 2.0
    graph = csbm(4000, num_classes=2, num_features=32, feature_signal=signal, seed=5)
    x, y = graph.features.double(), graph.labels
    train, test = slice(0, 2000), slice(2000, 4000)
    means = torch.stack([x[train][y[train] == c].mean(0) for c in (0, 1)])
    predicted = torch.cdist(x[test], means).argmin(1)
    accuracy = (predicted == y[test]).double().mean().item()
    # Bayes accuracy for two unit-variance Gaussians whose means lie signal·√2 apart: Φ(Δ/2)
    bayes = 0.5 * (1 + math.erf(signal * math.sqrt(2) / 2 / math.sqrt(2)))
    assert accuracy == pytest.approx(bayes, abs=0.03)  # 2,000 test nodes: 4σ ≈ 0.025


def test_csbm_is_seeded():
    first, again = csbm(200, seed=1), csbm(200, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first.edge_index, csbm(200, seed=2).edge_index)


def test_csbm_refuses_impossible_requests():
    with pytest.raises(ValueError, match="homophily"):
        csbm(100, homophily=1.5)
    with pytest.raises(ValueError, match="do not fit"):
        csbm(10, num_classes=2, homophily=1.0, average_degree=8)
    with pytest.raises(ValueError, match="num_features"):
        csbm(100, num_classes=5, num_features=3)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_knn_graph_equals_scikit_learn(metric):
    from sklearn.neighbors import NearestNeighbors

    features = torch.randn(300, 7, generator=torch.Generator().manual_seed(0))
    edge_index = knn_graph(features, 5, metric=metric, block_size=64)
    assert_simple_undirected(edge_index, 300)
    neighbours = NearestNeighbors(n_neighbors=6, metric=metric).fit(features.numpy())
    chosen = neighbours.kneighbors(features.numpy(), return_distance=False)[:, 1:]
    expected = {(i, int(j)) for i in range(300) for j in chosen[i]}
    expected |= {(j, i) for i, j in expected}
    assert set(map(tuple, edge_index.T.tolist())) == expected


def test_knn_graph_breaks_ties_towards_the_lower_index():
    """Oracle: exact integer distances and a stable sort, on features full of ties."""
    ints = np.random.default_rng(0).integers(0, 3, (120, 4))
    edge_index = knn_graph(torch.from_numpy(ints).float(), 4, block_size=50)
    squared = ((ints[:, None, :] - ints[None, :, :]) ** 2).sum(-1).astype(float)
    np.fill_diagonal(squared, np.inf)
    chosen = np.argsort(squared, axis=1, kind="stable")[:, :4]
    expected = {(i, int(j)) for i in range(120) for j in chosen[i]}
    expected |= {(j, i) for i, j in expected}
    assert set(map(tuple, edge_index.T.tolist())) == expected


def test_knn_graph_over_real_digits_is_homophilous():
    graph = image_knn_graph("digits", k=10)
    assert graph.num_nodes == 1797
    assert graph.features.shape == (1797, 64)
    assert float(graph.features.max()) == 1.0
    assert_simple_undirected(graph.edge_index, 1797)
    # handwritten digits cluster by class: most nearest neighbours share the label
    assert edge_homophily(graph.edge_index, graph.labels) > 0.9
    subset = image_knn_graph("digits", k=3, num_nodes=200, seed=1)
    assert subset.num_nodes == 200


def test_knn_and_homophily_errors():
    with pytest.raises(ValueError, match="k must be"):
        knn_graph(torch.zeros(5, 2), 5)
    with pytest.raises(ValueError, match=r"\(N, F\)"):
        knn_graph(torch.zeros(5), 1)
    with pytest.raises(ValueError, match="dataset must be"):
        image_knn_graph("cora")
    with pytest.raises(ValueError, match="without edges"):
        edge_homophily(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(3))
