"""Graphs, operators, models, the condensed-graph format, class counts, coresets and coarsening,
each against an independent oracle (dense formulas, brute force, networkx, hand computation)."""

from __future__ import annotations

import itertools
import json

import networkx as nx
import numpy as np
import pytest
import torch

import gc4nc
from gc4nc.condense import class_counts
from gc4nc.graph import GraphData, Structure, induced_subgraph
from gc4nc.methods.coarsening import virtual_graph, weighted_kmeans
from gc4nc.methods.coreset import degree_centrality, herding, k_center, pagerank
from gc4nc.models import APPNP, GCN, SGC, ChebNet, GraphSAGE, build_model


def small_graph(n: int = 12, seed: int = 0) -> GraphData:
    g = torch.Generator().manual_seed(seed)
    pairs = {(i, j) for i, j in torch.randint(n, (30, 2), generator=g).tolist() if i != j}
    pairs |= {(j, i) for i, j in pairs}
    edge_index = torch.tensor(sorted(pairs)).t()
    y = torch.arange(n) % 3
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    for i in range(n):
        masks[i % 4 if i % 4 < 3 else 0][i] = True
    return GraphData(torch.randn(n, 5, generator=g), edge_index, y, *masks)


def dense_adjacency(graph: GraphData) -> torch.Tensor:
    a = torch.zeros(graph.num_nodes, graph.num_nodes)
    a[graph.edge_index[0], graph.edge_index[1]] = 1.0
    return a


def gcn_norm_dense(a: torch.Tensor) -> torch.Tensor:
    """The textbook formula D̃^-1/2 (A + I) D̃^-1/2, written independently of gc4nc."""
    a_tilde = a + torch.eye(a.shape[0])
    d = torch.diag(a_tilde.sum(1) ** -0.5)
    return d @ a_tilde @ d


# float32 products over <= 12 nodes: errors stay within a few ulps of the values (~1e-6)
ATOL = 1e-5


def test_operators_match_dense_formulas_for_sparse_and_dense_structures():
    graph = small_graph()
    a = dense_adjacency(graph)
    x = torch.randn(graph.num_nodes, 4)
    deg = a.sum(1)
    inv = torch.where(deg > 0, deg.clamp_min(1e-12) ** -0.5, torch.zeros_like(deg))
    expected = {
        "gcn": gcn_norm_dense(a) @ x,
        "mean": (a / deg.clamp_min(1e-12)[:, None]) @ x,
        "cheb": -(inv[:, None] * a * inv[None, :]) @ x,
    }
    for structure in (Structure.from_graph(graph), Structure.dense(a)):
        for kind, value in expected.items():
            torch.testing.assert_close(structure.propagate(x, kind), value, atol=ATOL, rtol=0)
    identity = Structure.identity(graph.num_nodes)
    assert torch.equal(identity.propagate(x, "gcn"), x)


def test_dense_operator_carries_gradients_to_the_adjacency():
    a = torch.rand(5, 5)
    a = ((a + a.t()) / 2).requires_grad_()
    x = torch.randn(5, 3)
    Structure.dense(a).propagate(x).sum().backward()
    b = a.detach().clone().requires_grad_()
    (gcn_norm_dense(b) @ x).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=ATOL, rtol=0)


def test_gcn_and_sgc_equal_the_dense_matrix_formula():
    graph = small_graph()
    p = gcn_norm_dense(dense_adjacency(graph))
    structure = Structure.from_graph(graph)
    gcn = GCN(5, 7, 3, dropout=0.0).eval()
    w1, b1 = gcn.lins[0].weight, gcn.lins[0].bias
    w2, b2 = gcn.lins[1].weight, gcn.lins[1].bias
    expected = p @ torch.relu(p @ graph.x @ w1.t() + b1) @ w2.t() + b2
    torch.testing.assert_close(gcn(graph.x, structure), expected, atol=ATOL, rtol=0)
    sgc = SGC(5, 3, hops=2)
    expected = p @ p @ (graph.x @ sgc.lin.weight.t() + sgc.lin.bias)  # GraphSlim: bias propagated
    torch.testing.assert_close(sgc(graph.x, structure), expected, atol=ATOL, rtol=0)


def test_appnp_chebnet_and_sage_equal_their_recurrences():
    graph = small_graph()
    a = dense_adjacency(graph)
    p = gcn_norm_dense(a)
    structure = Structure.from_graph(graph)
    appnp = APPNP(5, 8, 3, hops=3, alpha=0.2, dropout=0.0).eval()
    h0 = appnp.mlp(graph.x)
    h = h0
    for _ in range(3):
        h = 0.8 * p @ h + 0.2 * h0
    torch.testing.assert_close(appnp(graph.x, structure), h, atol=ATOL, rtol=0)
    # ChebNet with order 2: T0 x W0 + b + T1 x W1, T1 = L̃ = 2L/2 - I = -D^-1/2 A D^-1/2
    cheb = ChebNet(5, 6, 3, order=2, dropout=0.0).eval()
    deg = a.sum(1)
    inv = torch.where(deg > 0, deg**-0.5, torch.zeros_like(deg))
    lap = -(inv[:, None] * a * inv[None, :])
    h = graph.x
    for i, lins in enumerate(cheb.convs):
        h = lins[0](h) + lins[1](lap @ h)
        h = torch.relu(h) if i == 0 else h
    torch.testing.assert_close(cheb(graph.x, structure), h, atol=ATOL, rtol=0)
    sage = GraphSAGE(5, 6, 3, dropout=0.0).eval()
    mean = a / deg.clamp_min(1)[:, None]
    h = graph.x
    for i, (ls, ln) in enumerate(zip(sage.self_lins, sage.neigh_lins, strict=True)):
        h = ls(h) + ln(mean @ h)
        h = torch.relu(h) if i == 0 else h
    torch.testing.assert_close(sage(graph.x, structure), h, atol=ATOL, rtol=0)


def test_build_model_refuses_unknown_names():
    with pytest.raises(ValueError, match="transformer"):
        build_model("transformer", 3, 2)


def test_class_counts_follow_gcond_rounding():
    # Cora: 7 classes x 20 training nodes -> 2, 5, 10 per class at 0.1, 0.25, 0.5
    cora = torch.arange(7).repeat_interleave(20)
    assert class_counts(cora, 0.1, 7).tolist() == [2] * 7
    assert class_counts(cora, 0.25, 7).tolist() == [5] * 7
    assert class_counts(cora, 0.5, 7).tolist() == [10] * 7
    # unbalanced, by hand: counts 3, 10, 50 at rate 0.1 -> max(1, 0), max(1, 1), 6 - 2 = 4
    labels = torch.tensor([2] * 50 + [0] * 3 + [1] * 10)
    assert class_counts(labels, 0.1, 4).tolist() == [1, 1, 4, 0]
    with pytest.raises(ValueError, match="reduction_rate"):
        class_counts(labels, 1.0, 4)
    with pytest.raises(ValueError, match="at least one"):
        class_counts(torch.tensor([0, 1, 2]), 0.2, 3)


def brute_force_herding(features: torch.Tensor, budget: int) -> list[int]:
    """Each step, the point whose addition brings the selected mean closest to the full mean."""
    chosen: list[int] = []
    mean = features.double().mean(0)
    for _ in range(budget):
        best, best_i = None, None
        for i in range(features.shape[0]):
            if i in chosen:
                continue
            avg = features[[*chosen, i]].double().mean(0)
            d = float(torch.linalg.vector_norm(avg - mean))
            if best is None or d < best - 1e-12:
                best, best_i = d, i
        chosen.append(best_i)
    return chosen


def brute_force_k_center(features: torch.Tensor, budget: int) -> list[int]:
    x = features.double().tolist()
    dist = lambda i, j: float(np.linalg.norm(np.subtract(x[i], x[j])))  # noqa: E731
    mean = np.mean(x, 0)
    chosen = [int(np.argmin([np.linalg.norm(np.subtract(p, mean)) for p in x]))]
    while len(chosen) < budget:
        scores = [min(dist(i, c) for c in chosen) if i not in chosen else -1 for i in range(len(x))]
        chosen.append(int(np.argmax(scores)))
    return chosen


@pytest.mark.parametrize("seed", range(3))
def test_herding_and_k_center_equal_brute_force_greedy(seed):
    features = torch.randn(15, 3, generator=torch.Generator().manual_seed(seed))
    assert herding(features, 6).tolist() == brute_force_herding(features, 6)
    assert k_center(features, 6).tolist() == brute_force_k_center(features, 6)


def test_degree_and_pagerank_equal_networkx():
    graph = small_graph(20, seed=1)
    g = nx.Graph()
    g.add_nodes_from(range(graph.num_nodes))
    g.add_edges_from(graph.edge_index.t().tolist())
    structure = Structure.from_graph(graph)
    degree = degree_centrality(structure)
    assert degree.tolist() == [float(g.degree(i)) for i in range(graph.num_nodes)]
    reference = nx.pagerank(g, alpha=0.85, tol=1e-13, max_iter=10_000)
    # float64 power iteration to a 1e-10 L1 change; float32 output: ~1e-8 absolute
    torch.testing.assert_close(
        pagerank(structure),
        torch.tensor([reference[i] for i in range(graph.num_nodes)], dtype=torch.float32),
        atol=1e-7,
        rtol=0,
    )


def test_weighted_kmeans_recovers_separated_clusters_and_weights_pull_centres():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    points = torch.cat([c + 0.1 * torch.randn(20, 2, generator=g) for c in centres])
    weights = torch.ones(60)
    assign, found = weighted_kmeans(points, weights, 3, generator=g)
    groups = [set(assign[i * 20 : (i + 1) * 20].tolist()) for i in range(3)]
    assert all(len(s) == 1 for s in groups)
    assert len(set.union(*groups)) == 3
    # one cluster whose first point weighs 99x: its centre is the weighted mean
    weights[0] = 99.0
    assign, found = weighted_kmeans(points, weights, 3, generator=g)
    cluster = assign[0]
    members = assign == cluster
    expected = (weights[members, None] * points[members]).sum(0) / weights[members].sum()
    torch.testing.assert_close(found[cluster], expected, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def digits():
    import benchdata

    graph = benchdata.image_knn_graph("digits", k=10)
    return gc4nc.from_benchdata(graph, split="planetoid", num_val=300, num_test=1000)


def test_random_coreset_is_an_induced_subgraph_of_training_nodes(digits):
    c = gc4nc.condense(digits, "random", 0.25, seed=3)
    chosen = torch.tensor(c.metadata["info"]["selected"])
    assert bool(digits.train_mask[chosen].all())
    assert torch.equal(c.x, digits.x[chosen])
    assert torch.equal(c.y, digits.y[chosen])
    mask = torch.zeros(digits.num_nodes, dtype=torch.bool)
    mask[chosen] = True
    sub = induced_subgraph(digits, mask)  # node order, not selection order
    order = chosen.argsort()
    torch.testing.assert_close(c.adjacency[order][:, order], dense_adjacency(sub))
    assert c.metadata["class_counts"] == [5] * 10


@pytest.mark.parametrize(
    "method", ["random", "degree", "pagerank", "averaging", "herding", "kcenter", "vng"]
)
def test_methods_are_deterministic_under_a_seed(digits, method):
    hparams = {"epochs": 20} if method in ("herding", "kcenter", "vng") else {}
    a = gc4nc.condense(digits, method, 0.1, seed=5, **hparams)
    b = gc4nc.condense(digits, method, 0.1, seed=5, **hparams)
    assert torch.equal(a.x, b.x)
    assert torch.equal(a.y, b.y)


def test_averaging_gives_class_means(digits):
    c = gc4nc.condense(digits, "averaging", 0.1)
    train = digits.train_mask
    for cls in range(10):
        mean = digits.x[train & (digits.y == cls)].mean(0)
        rows = c.x[c.y == cls]
        assert rows.shape[0] == 2
        torch.testing.assert_close(rows, mean.expand(2, -1))
    assert c.adjacency is None


def test_vng_gives_symmetric_nonnegative_structure(digits):
    c = gc4nc.condense(digits, "vng", 0.25, epochs=50)
    a = c.adjacency
    assert torch.equal(a, a.t())
    assert bool((a >= 0).all())
    assert bool((a.diagonal() == 0).all())
    assert c.num_nodes == 50
    assert c.y.shape == (50,)


def test_virtual_graph_equals_a_numpy_reference():
    graph = small_graph(12, seed=2)
    g = np.random.default_rng(0)
    h = torch.from_numpy(g.normal(size=(12, 4)))
    assign = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 0, 1])
    weight = torch.from_numpy(g.uniform(0.5, 2.0, size=12))
    y = torch.tensor([0, 0, 1, 0, 1, 1, 2, 1, 2, 2, 0, 1])
    x_vr, a_vr, labels = virtual_graph(graph.x.double(), graph.edge_index, h, assign, weight, y, 3)
    # reference: loops over clusters and the dense adjacency
    a = dense_adjacency(graph).double().numpy()
    e = np.zeros((3, 12))
    for i, c in enumerate(assign.tolist()):
        e[c, i] = weight[i].item()
    e /= e.sum(1, keepdims=True)
    hn = h.numpy()
    ref = (e @ a @ hn) @ np.linalg.pinv(e @ hn)
    ref = np.maximum((ref + ref.T) / 2, 0.0)
    np.fill_diagonal(ref, 0.0)
    # float64 least squares on a 3 x 4 system: agreement to ~1e-12
    np.testing.assert_allclose(a_vr.numpy(), ref, atol=1e-10)
    np.testing.assert_allclose(x_vr.numpy(), e @ graph.x.double().numpy(), atol=1e-12)
    votes = [[0] * 3 for _ in range(3)]
    for i in range(12):
        votes[int(assign[i])][int(y[i])] += 1
    assert labels.tolist() == [v.index(max(v)) for v in votes]  # ties: the lower class


def test_condensed_graph_round_trip_and_refusals(digits, tmp_path):
    c = gc4nc.condense(digits, "random", 0.25)
    c.save(tmp_path / "g")
    back = gc4nc.CondensedGraph.load(tmp_path / "g")
    assert torch.equal(back.x, c.x)
    assert torch.equal(back.y, c.y)
    assert torch.equal(back.adjacency, c.adjacency)
    assert back.metadata["method"] == "random"
    assert back.metadata["reduction_rate"] == 0.25
    with pytest.raises(gc4nc.CondensedGraphError, match="missing"):
        gc4nc.CondensedGraph.load(tmp_path / "nowhere")
    blob = bytearray((tmp_path / "g" / "graph.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (tmp_path / "g" / "graph.safetensors").write_bytes(bytes(blob))
    with pytest.raises(gc4nc.CondensedGraphError, match="corrupt"):
        gc4nc.CondensedGraph.load(tmp_path / "g")
    (tmp_path / "g" / "meta.json").write_text("{not json")
    with pytest.raises(gc4nc.CondensedGraphError, match="JSON"):
        gc4nc.CondensedGraph.load(tmp_path / "g")
    soft = gc4nc.CondensedGraph(torch.randn(3, 2), None, torch.softmax(torch.randn(3, 4), 1))
    soft.save(tmp_path / "s")
    back = gc4nc.CondensedGraph.load(tmp_path / "s")
    assert back.adjacency is None
    assert back.soft_labels
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["format"] == 1


def test_bad_input_gets_clear_errors(digits):
    with pytest.raises(ValueError, match="reduction_rate"):
        gc4nc.condense(digits, "random", 0.0)
    with pytest.raises(ValueError, match="unknown method"):
        gc4nc.condense(digits, "gcond2", 0.5)
    with pytest.raises(ValueError, match="no hyperparameter"):
        gc4nc.condense(digits, "random", 0.5, lr_feat=0.1)
    with pytest.raises(ValueError, match="setting"):
        gc4nc.condense(digits, "random", 0.5, setting="semi")
    no_split = GraphData(digits.x, digits.edge_index, digits.y)
    with pytest.raises(ValueError, match="train_mask"):
        gc4nc.condense(no_split, "random", 0.5)
    with pytest.raises(ValueError, match="integer"):
        gc4nc.check_graph(digits.clone(y=digits.y.float()))
    with pytest.raises(ValueError, match=r"\(N,\)"):
        gc4nc.check_graph(digits.clone(y=digits.y[:-1]))
    with pytest.raises(ValueError, match="outside"):
        gc4nc.check_graph(digits.clone(edge_index=digits.edge_index + digits.num_nodes))
    with pytest.raises(ValueError, match="directed"):
        gc4nc.check_graph(digits.clone(edge_index=digits.edge_index[:, :1]))
    with pytest.raises(ValueError, match="overlap"):
        gc4nc.check_graph(digits.clone(val_mask=digits.train_mask))
    with pytest.raises(ValueError, match="NaN"):
        gc4nc.check_graph(digits.clone(x=torch.full_like(digits.x, float("nan"))))
    with pytest.raises(TypeError, match="GraphData"):
        gc4nc.check_graph({"x": 1})
    with pytest.raises(ValueError, match=r"\(n, n\)"):
        gc4nc.CondensedGraph(torch.randn(3, 2), torch.zeros(2, 2), torch.zeros(3, dtype=torch.long))


def test_splits_are_seeded_disjoint_and_sized(digits):
    a = gc4nc.planetoid_split(digits, seed=1, num_val=300, num_test=1000)
    b = gc4nc.planetoid_split(digits, seed=1, num_val=300, num_test=1000)
    assert torch.equal(a.train_mask, b.train_mask)
    assert int(a.train_mask.sum()) == 200
    assert int(a.val_mask.sum()) == 300
    assert int(a.test_mask.sum()) == 1000
    for m1, m2 in itertools.combinations((a.train_mask, a.val_mask, a.test_mask), 2):
        assert not bool((m1 & m2).any())
    assert torch.bincount(digits.y[a.train_mask]).tolist() == [20] * 10
    r = gc4nc.random_split(digits, train=0.5, val=0.25, seed=0)
    assert int(r.train_mask.sum()) + int(r.val_mask.sum()) + int(r.test_mask.sum()) == 1797


def test_pyg_data_is_accepted():
    from gc4nc._pyg import import_pyg

    graph = small_graph()
    data = graph.to_pyg()
    assert isinstance(data, import_pyg().data.Data)
    back = gc4nc.check_graph(data)
    assert torch.equal(back.x, graph.x)
    assert torch.equal(back.train_mask, graph.train_mask)
