"""GCDM and SGDD: the embedding distances, the class-mean GCDM loss against an independent dense
forward, the random pairing against a replayed draw, the Sinkhorn normalisation by hand, the
Laplacian-energy OT term against numpy / scipy pseudo-inverses and matrix square roots, the IGNR
generator against a hand-written forward, and both methods end to end on a small CSBM."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np
import pytest
import scipy.linalg
import torch
from matching_fixtures import assert_close, dense_gcn_operator, make_task

import gc4nc
from benchdata import csbm
from gc4nc.condense import class_counts
from gc4nc.graph import GraphData
from gc4nc.methods.distribution import (
    PRESETS as GCDM_PRESETS,
)
from gc4nc.methods.distribution import (
    GCDMConfig,
    distribution_loss,
    embedding_distance,
    real_embeddings,
)
from gc4nc.methods.matching import CondensationGCN, RealGraph
from gc4nc.methods.sgdd import (
    IGNR,
    LaplacianEnergyOT,
    adjacency_block,
    grid_coordinates,
    normalized_laplacian,
    sinkhorn,
)
from gc4nc.methods.sgdd import (
    PRESETS as SGDD_PRESETS,
)


@pytest.fixture(scope="module")
def graph() -> GraphData:
    g = csbm(200, num_classes=4, num_features=16, homophily=0.9, seed=0)
    return gc4nc.from_benchdata(g, per_class=20, num_val=40, num_test=80)


# ------------------------------------------------------------------------------------ GCDM


def test_embedding_distances_by_hand():
    a = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
    b = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    # differences (-1, 2), (0, -2)
    assert embedding_distance(a, b, "l1").item() == pytest.approx(5.0)
    assert embedding_distance(a, b, "mse").item() == pytest.approx(9.0)
    assert embedding_distance(a, b, "l1_mean").item() == pytest.approx(1.5 + 1.0)
    # rows: cos((1,2),(2,0)) = 2/(√5·2); cos((0,1),(0,3)) = 1
    cos = (1 - 2 / (math.sqrt(5) * 2 + 1e-6)) + (1 - 3 / (3 + 1e-6))
    assert embedding_distance(a, b, "cos").item() == pytest.approx(cos, abs=1e-6)
    assert embedding_distance(a[0], b[0], "l1").item() == pytest.approx(3.0)  # one row
    with pytest.raises(ValueError, match="dis_metric"):
        embedding_distance(a, b, "ours")
    with pytest.raises(ValueError, match="shapes differ"):
        embedding_distance(a, b[:1])


def test_gcdm_class_mean_loss_against_dense_forward(graph):
    task = make_task(graph)
    torch.manual_seed(0)
    model = CondensationGCN(graph.x.shape[1], 8, 4)
    x_syn = torch.randn(task.num_synthetic, graph.x.shape[1])
    config = GCDMConfig(pairing="mean", dis_metric="mse")
    h_real = real_embeddings(model, RealGraph(task), task)
    got = distribution_loss(model, h_real, task, x_syn, config)
    # oracle: relu(ÂXWᵀ + b) over all nodes with a dense Â, class means of the training nodes
    first = model.lins[0]
    with torch.no_grad():
        h_all = torch.relu(dense_gcn_operator(graph) @ graph.x @ first.weight.t() + first.bias)
        h_syn = torch.relu(x_syn @ first.weight.t() + first.bias)
    y_syn, expected = task.synthetic_labels(), 0.0
    for c in range(4):
        members = graph.train_mask & (graph.y == c)
        gap = h_all[members].mean(0) - h_syn[y_syn == c].mean(0)
        expected += int((y_syn == c).sum()) / len(y_syn) * float((gap**2).sum())
    # float32 means over 20 nodes of 8-wide O(1) embeddings
    assert got.item() == pytest.approx(expected, rel=1e-5)


def test_gcdm_random_pairing_against_replayed_draws(graph):
    task = make_task(graph, seed=7)
    torch.manual_seed(0)
    model = CondensationGCN(graph.x.shape[1], 8, 4)
    x_syn = torch.randn(task.num_synthetic, graph.x.shape[1])
    state = task.generator.get_state()
    got = distribution_loss(
        model, real_embeddings(model, RealGraph(task), task), task, x_syn, GCDMConfig()
    )
    replay = torch.Generator().set_state(state)
    first = model.lins[0]
    with torch.no_grad():
        h_all = torch.relu(dense_gcn_operator(graph) @ graph.x @ first.weight.t() + first.bias)
        h_syn = torch.relu(x_syn @ first.weight.t() + first.bias)
    y_syn, expected = task.synthetic_labels(), 0.0
    for c in range(4):
        members = (graph.train_mask & (graph.y == c)).nonzero().flatten()  # ascending node ids
        k = int((y_syn == c).sum())
        picked = members[torch.randperm(members.numel(), generator=replay)[:k]]
        expected += k / len(y_syn) * float((h_all[picked] - h_syn[y_syn == c]).abs().sum())
    assert got.item() == pytest.approx(expected, rel=1e-5)


def test_gcdm_runs_structure_free_and_deterministic(graph):
    kw = {"epochs": 3, "outer_loop": 2, "inner_loop": 1, "lr_feat": 0.01, "hidden": 16}
    a = gc4nc.condense(graph, "gcdm", 0.25, seed=2, **kw)
    b = gc4nc.condense(graph, "gcdm", 0.25, seed=2, **kw)
    c = gc4nc.condense(graph, "gcdm", 0.25, seed=2, **kw, pairing="mean")
    counts = class_counts(graph.y[graph.train_mask], 0.25, 4)
    assert a.adjacency is None
    assert a.x.shape == (int(counts.sum()), 16)
    assert torch.equal(torch.bincount(a.y, minlength=4), counts)
    assert torch.equal(a.x, b.x)
    assert not torch.equal(a.x, c.x)
    assert all(math.isfinite(v) for v in a.metadata["info"]["loss_curve"])
    assert "gcdmx" not in gc4nc.METHODS  # GraphSlim's GCDMX is the same code


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"pairing": "nearest"}, "pairing"),
        ({"dis_metric": "ours"}, "dis_metric"),
        ({"lr_feat": -1.0}, "lr_feat"),
        ({"inner_loop": -2}, "inner_loop"),
        ({"epochs": 0}, "epochs"),
    ],
)
def test_gcdm_bad_hyperparameters(graph, changes, match):
    with pytest.raises(ValueError, match=match):
        gc4nc.condense(graph, "gcdm", 0.25, **changes)


def test_gcdm_presets():
    assert GCDM_PRESETS["pubmed"]["epochs"] == 2000
    assert GCDM_PRESETS["flickr"]["inner_loop"] == 2
    for row in GCDM_PRESETS.values():
        GCDMConfig(**row)


# ------------------------------------------------------------------------------------- SGDD


def test_sinkhorn_by_hand():
    p = torch.tensor([[1.0, -2.0], [3.0, 4.0]], dtype=torch.float64)
    # |p| rows: (1/3, 2/3), (3/7, 4/7); column sums 16/21, 26/21
    expected = torch.tensor([[7 / 16, 7 / 13], [9 / 16, 6 / 13]], dtype=torch.float64)
    assert_close(sinkhorn(p, 1), expected, rtol=1e-12, atol=0)
    assert_close(sinkhorn(p, 0), p.abs(), rtol=0, atol=0)
    # a rank-one positive matrix u vᵀ is balanced in one round: every entry 1/m (columns sum 1)
    q = torch.outer(torch.tensor([1.0, 2.0, 5.0]), torch.tensor([3.0, 0.5]))
    assert_close(sinkhorn(q, 3), torch.full((3, 2), 1 / 3), rtol=1e-6, atol=0)


def test_normalized_laplacian_against_networkx():
    g = nx.Graph([(0, 1), (1, 2), (2, 0), (2, 3)])
    g.add_node(4)  # isolated
    adj = torch.tensor(nx.to_numpy_array(g, nodelist=range(5)))
    expected = nx.normalized_laplacian_matrix(g, nodelist=range(5)).toarray()
    assert_close(normalized_laplacian(adj), torch.from_numpy(expected), rtol=1e-12, atol=1e-12)


def test_ot_distance_against_scipy():
    gen = torch.Generator().manual_seed(0)
    block = torch.zeros(7, 7)
    for i, j in [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 0), (1, 4)]:  # connected
        block[i, j] = block[j, i] = 1.0
    ot = LaplacianEnergyOT(block, 4, sinkhorn_iter=3, scale=2.0, generator=gen)
    a = torch.rand(4, 4, generator=gen, dtype=torch.float64)
    a = (a + a.t()) / 2 * (1 - torch.eye(4, dtype=torch.float64))
    got = ot.distance(a)
    # oracle: numpy pseudo-inverses (one zero eigenvalue each) and scipy's matrix square root
    lx_pinv = np.linalg.pinv(normalized_laplacian(block.double()).numpy(), rcond=1e-10)
    ly_pinv = np.linalg.pinv(normalized_laplacian(a).numpy(), rcond=1e-10)
    root = np.real(scipy.linalg.sqrtm(ly_pinv))
    p = sinkhorn(ot.p.detach(), 3).double().numpy()
    eig = np.linalg.eigvalsh(root @ p.T @ lx_pinv @ p @ root)
    expected = abs(4 * np.trace(ly_pinv) - 2 * np.sqrt(np.clip(eig, 0, None)).sum())
    # float64 throughout; sqrtm and the zero eigenvalue's square root limit agreement to ~1e-7
    assert got.item() == pytest.approx(expected, rel=1e-6)
    assert ot(a.float()).item() == pytest.approx(2.0 * expected, rel=1e-6)
    # gradients reach both the adjacency and the coupling, and are finite
    a.requires_grad_(True)
    ot.distance(a).backward()
    assert bool(torch.isfinite(a.grad).all())
    assert bool(torch.isfinite(ot.p.grad).all())
    assert float(ot.p.grad.abs().sum()) > 0


def test_grid_and_block():
    expected = [[-1, -1], [-1, 0], [-1, 1], [0, -1], [0, 0], [0, 1], [1, -1], [1, 0], [1, 1]]
    assert grid_coordinates(3).tolist() == expected
    g = csbm(60, num_classes=2, num_features=4, seed=1)
    data = gc4nc.from_benchdata(g, per_class=5, num_val=10, num_test=10)
    task = make_task(data, rate=0.5)
    dense = nx.to_numpy_array(nx.Graph(data.edge_index.t().tolist()), nodelist=range(60))
    assert_close(adjacency_block(task, 25), torch.from_numpy(dense[:25, :25]).float(), 0, 0)
    assert adjacency_block(task, 1000).shape == (60, 60)  # capped at the graph size


def ignr_by_hand(ignr: IGNR, x: torch.Tensor) -> torch.Tensor:
    """The fusion written out with explicit pair concatenation and batch-statistics BN."""
    n = x.shape[0]

    def block(seq, h):
        lin, bn = seq[0], seq[1]
        h = h @ lin.weight.t() + lin.bias
        h = (h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + bn.eps)
        return torch.relu(h * bn.weight + bn.bias)

    pairs = torch.stack([torch.cat([x[i], x[j]]) for i, j in itertools.product(range(n), repeat=2)])
    coords = torch.tensor(
        [
            [2 * i / (n - 1) - 1, 2 * j / (n - 1) - 1]
            for i, j in itertools.product(range(n), repeat=2)
        ]
    )
    c1 = block(ignr.feature[0], pairs)
    g1 = block(ignr.graphon[0], coords) * c1
    c2 = block(ignr.feature[1], c1)
    g2 = block(ignr.graphon[1], g1) * c2
    last_g, last_c = ignr.graphon[2], ignr.feature[2]
    s = (1 - ignr.ep_ratio) * (g2 @ last_g.weight.t() + last_g.bias)
    s = (s + ignr.ep_ratio * (c2 @ last_c.weight.t() + last_c.bias)).reshape(n, n)
    return torch.sigmoid((s + s.t()) / 2) * (1 - torch.eye(n))


def test_ignr_against_hand_forward():
    torch.manual_seed(0)
    ignr = IGNR(5, hidden=8, ep_ratio=0.3)
    x = torch.randn(4, 5)
    adj = ignr(x)
    assert_close(adj, ignr_by_hand(ignr, x), rtol=1e-5, atol=1e-6)
    assert torch.equal(adj, adj.t())
    assert bool((torch.diagonal(adj) == 0).all())
    # inference: eval-mode batch norm on the running statistics, so generally a different graph
    before = [bn.running_mean.clone() for bn in (ignr.feature[0][1], ignr.graphon[0][1])]
    inferred = ignr.inference(x)
    assert ignr.training  # back in training mode
    assert torch.equal(inferred, inferred.t())
    assert all(
        torch.equal(b, bn.running_mean)  # inference leaves the statistics alone
        for b, bn in zip(before, (ignr.feature[0][1], ignr.graphon[0][1]), strict=True)
    )
    with pytest.raises(ValueError, match="ep_ratio"):
        IGNR(5, ep_ratio=1.5)


def test_sgdd_runs_and_is_deterministic(graph):
    kw = {
        "epochs": 2,
        "outer_loop": 2,
        "inner_loop": 2,
        "hidden": 16,
        "ignr_hidden": 16,
        "mx_size": 30,
        "opt_scale": 1e-3,
    }
    a = gc4nc.condense(graph, "sgdd", 0.25, seed=1, **kw)
    b = gc4nc.condense(graph, "sgdd", 0.25, seed=1, **kw)
    off = gc4nc.condense(graph, "sgdd", 0.25, seed=1, **{**kw, "opt_scale": 0.0})
    counts = class_counts(graph.y[graph.train_mask], 0.25, 4)
    assert a.x.shape == (int(counts.sum()), 16)
    assert torch.equal(torch.bincount(a.y, minlength=4), counts)
    assert torch.equal(a.x, b.x)
    assert torch.equal(a.adjacency, b.adjacency)
    adj = a.adjacency
    assert torch.equal(adj, adj.t())
    assert bool((torch.diagonal(adj) == 0).all())
    assert bool((adj < 1).all())
    # the OT term enters the loss (and its coupling moves the structure's optimiser state)
    assert a.metadata["info"]["loss_curve"] != off.metadata["info"]["loss_curve"]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"opt_scale": -1e-9}, "opt_scale"),
        ({"mx_size": 1}, "mx_size"),
        ({"ep_ratio": 2.0}, "ep_ratio"),
        ({"sinkhorn_iter": -1}, "sinkhorn_iter"),
        ({"dis_metric": "l1"}, "dis_metric"),
        ({"lr_adj": -0.01}, "lr_adj"),
    ],
)
def test_sgdd_bad_hyperparameters(graph, changes, match):
    with pytest.raises(ValueError, match=match):
        gc4nc.condense(graph, "sgdd", 0.25, **changes)


def test_sgdd_presets():
    assert SGDD_PRESETS["cora"]["opt_scale"] == 1e-11
    assert SGDD_PRESETS["arxiv"]["mx_size"] == 1000
    assert SGDD_PRESETS["reddit"]["lr_adj"] == 0.001
    for row in SGDD_PRESETS.values():
        assert set(row) <= set(gc4nc.METHODS["sgdd"].defaults)
