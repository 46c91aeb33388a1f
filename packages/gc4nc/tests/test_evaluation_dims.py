"""The GC4NC evaluation dimensions beyond plain performance: privacy (membership inference),
denoising (random corruptions, PRBCD), NAS, transferability, graph properties, efficiency, and the
`evaluate` dispatcher. Every number is checked against an independent oracle: brute force,
networkx / scipy, or a closed form."""

from __future__ import annotations

import contextlib
import itertools
import json

import networkx as nx
import numpy as np
import pytest
import scipy.optimize
import scipy.stats
import torch
from scipy.sparse.csgraph import laplacian

import benchdata
import gc4nc
import gc4nc._measure
from gc4nc.condensed import CondensedGraph
from gc4nc.evaluation import DIMENSIONS, evaluate
from gc4nc.evaluation.denoising import add_random_edges, corrupt, feature_noise
from gc4nc.evaluation.efficiency import condensation_cost, loglog_slope, scaling_sweep
from gc4nc.evaluation.nas import (
    ALPHAS,
    HIDDEN,
    HOPS,
    NAS_ACTIVATIONS,
    descending_min_rank,
    nas_correlation,
    pearson,
    sample_architectures,
    search_space,
)
from gc4nc.evaluation.performance import EvalConfig, condensed_accuracy, train_on_condensed
from gc4nc.evaluation.prbcd import (
    PRBCDConfig,
    linear_to_pairs,
    pair_keys,
    prbcd_attack,
    project_to_budget,
    tanh_margin_loss,
    train_surrogate,
)
from gc4nc.evaluation.privacy import attack_accuracy, membership_inference
from gc4nc.evaluation.properties import (
    NOT_AVAILABLE,
    gini,
    graph_properties,
)
from gc4nc.evaluation.transfer import grid, thresholded, transferability
from gc4nc.graph import GraphData, Structure, induced_subgraph
from gc4nc.models import ACTIVATIONS
from gc4nc.training import Split, accuracy

TINY = EvalConfig(epochs=15, runs=1, hidden=32)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # the machine's cores are shared; one thread is faster for these tiny graphs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def graph() -> GraphData:
    data = benchdata.csbm(150, num_classes=3, average_degree=6, seed=0)
    return gc4nc.from_benchdata(data, split="random", train=0.3, val=0.2)


@pytest.fixture(scope="module")
def condensed(graph) -> CondensedGraph:
    return gc4nc.condense(graph, "random", 0.5)


def directed_pairs(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.t().tolist()))


def undirected_set(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return {(min(a, b), max(a, b)) for a, b in edge_index.t().tolist() if a != b}


# ----------------------------------------------------------------------------- privacy


def brute_force_attack(members: np.ndarray, nonmembers: np.ndarray) -> float:
    """GraphSlim's scan: every observed score as δ, both groups recounted each time."""
    best = 0.5
    for delta in np.concatenate([members, nonmembers]):
        tpr = np.mean(members >= delta)
        tnr = np.mean(nonmembers < delta)
        best = max(best, 0.5 * (tpr + tnr))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_attack_accuracy_matches_brute_force_scan(seed):
    rng = np.random.default_rng(seed)
    m, k = rng.integers(1, 40, size=2)
    # rounding to one decimal makes many ties, within and across the groups
    members = np.round(rng.beta(3, 1, m), 1)
    nonmembers = np.round(rng.beta(1.5, 1.5, k), 1)
    expected = brute_force_attack(members, nonmembers)
    assert attack_accuracy(members, nonmembers) == pytest.approx(expected, abs=1e-12)
    # thresholds between or beyond the observed scores never do better (the scan is complete)
    grid_values = np.linspace(-0.05, 1.05, 221)
    dense = max(
        0.5, *(0.5 * (np.mean(members >= d) + np.mean(nonmembers < d)) for d in grid_values)
    )
    assert dense <= expected + 1e-12


def test_attack_accuracy_hand_cases():
    assert attack_accuracy(np.array([0.9, 0.8]), np.array([0.1, 0.85])) == 0.75
    assert attack_accuracy(np.array([0.9, 0.95]), np.array([0.1, 0.2])) == 1.0
    # members below non-members: the best threshold is no better than chance (the 0.5 floor)
    assert attack_accuracy(np.array([0.1]), np.array([0.9])) == 0.5
    with pytest.raises(ValueError, match="at least one member"):
        attack_accuracy(np.array([]), np.array([0.5]))


@pytest.mark.parametrize("setting", ["transductive", "inductive"])
def test_membership_inference_scores_train_vs_test_nodes(graph, setting):
    condensed = gc4nc.condense(graph, "random", 0.5, setting)
    result = membership_inference(condensed, graph, TINY, runs=1)
    # the oracle: the same target model (same seed), confidences read off its softmax by hand,
    # members on the full / train-induced graph, non-members on the full / test-induced graph
    model, _ = train_on_condensed(condensed, graph, TINY, seed=0)
    model.eval()
    scores = []
    for mask in (graph.train_mask, graph.test_mask):
        part = graph if setting == "transductive" else induced_subgraph(graph, mask)
        local = mask if setting == "transductive" else torch.ones(int(mask.sum()), dtype=bool)
        with torch.no_grad():
            p = model(part.x, Structure.from_graph(part)).softmax(-1)
        scores.append(p[local, part.y[local]].double().numpy())
    assert result["condensed"].mean == pytest.approx(brute_force_attack(*scores), abs=1e-9)
    assert 0.5 <= result["original"].mean <= 1.0


# ----------------------------------------------------------------------------- properties


def random_condensed_adjacency(n: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    a = rng.random((n, n)) * (rng.random((n, n)) < 0.4)
    a = np.triu(a, 1)
    a = a + a.T + np.diag(rng.random(n))  # self loops must be ignored
    return torch.from_numpy(a).float()


def nx_reference(binary: np.ndarray, weights: np.ndarray, labels: np.ndarray) -> dict:
    g = nx.from_numpy_array(binary)
    rows, cols = np.nonzero(binary)
    degrees = binary.sum(1)
    return {
        "num_edges": g.number_of_edges(),
        "density": nx.density(g),
        "homophily": float(np.mean(labels[rows] == labels[cols])),
        "clustering": nx.average_clustering(g),
        "spectral_radius": float(np.linalg.eigvalsh(laplacian(weights, normed=True))[-1]),
        "degree_max": int(degrees.max()),
        "degree_mean": float(degrees.mean()),
    }


def assert_matches(props: dict, ref: dict, spectral_tol: float = 1e-9) -> None:
    # float64 on both sides: 1e-9 leaves room only for summation order
    assert props["num_edges"] == ref["num_edges"]
    for key in ("density", "homophily", "clustering"):
        assert props[key] == pytest.approx(ref[key], abs=1e-9), key
    assert props["spectral_radius"] == pytest.approx(ref["spectral_radius"], abs=spectral_tol)
    assert props["degree"]["max"] == ref["degree_max"]
    assert props["degree"]["mean"] == pytest.approx(ref["degree_mean"], abs=1e-12)


@pytest.mark.parametrize(("seed", "threshold"), [(0, 0.0), (1, 0.0), (2, 0.3)])
def test_condensed_properties_match_networkx_and_scipy(seed, threshold):
    n = 14
    adjacency = random_condensed_adjacency(n, seed)
    labels = torch.from_numpy(np.random.default_rng(seed).integers(0, 3, n))
    a = adjacency.double().numpy()
    weights = np.where((a > 0) & (a >= threshold), a, 0.0)
    np.fill_diagonal(weights, 0.0)
    condensed = CondensedGraph(torch.randn(n, 4), adjacency, labels)
    original = GraphData(torch.zeros(2, 1), torch.tensor([[0, 1], [1, 0]]), torch.zeros(2).long())
    props = graph_properties(condensed, original, threshold=threshold)["condensed"]
    assert_matches(props, nx_reference((weights > 0).astype(float), weights, labels.numpy()))


@pytest.mark.parametrize("dense_limit", [4096, 0])  # 0: the Lanczos (eigsh) path
def test_original_graph_properties_match_networkx_and_scipy(dense_limit):
    g = nx.gnp_random_graph(40, 0.12, seed=3)
    g.add_node(40)  # an isolated node: its Laplacian row is 0, as scipy's
    edges = np.array(list(g.edges())).T
    edge_index = torch.from_numpy(np.concatenate([edges, edges[::-1]], 1))
    labels = torch.from_numpy(np.random.default_rng(3).integers(0, 2, 41))
    data = GraphData(torch.randn(41, 3), edge_index, labels)
    binary = nx.to_numpy_array(g, nodelist=range(41))
    condensed = CondensedGraph(torch.zeros(1, 3), None, torch.zeros(1).long())
    props = graph_properties(condensed, data, dense_limit=dense_limit)["original"]
    # Lanczos stops at relative residual 1e-8 on an eigenvalue in [1, 2]: 1e-6 is ample
    assert_matches(
        props,
        nx_reference(binary, binary, labels.numpy()),
        spectral_tol=1e-9 if dense_limit else 1e-6,
    )


def test_structure_free_and_edgeless_graphs_report_not_available(graph, condensed):
    free = CondensedGraph(condensed.x, None, condensed.y)
    props = graph_properties(free, graph)
    for key in ("num_edges", "density", "homophily", "spectral_radius", "clustering", "degree"):
        assert props["condensed"][key] == NOT_AVAILABLE
    assert props["original"]["homophily"] == pytest.approx(
        benchdata.edge_homophily(graph.edge_index, graph.y), abs=1e-9
    )
    edgeless = CondensedGraph(
        condensed.x, torch.zeros(condensed.num_nodes, condensed.num_nodes), condensed.y
    )
    assert graph_properties(edgeless, graph)["condensed"]["homophily"] == NOT_AVAILABLE


def test_gini_matches_mean_absolute_difference():
    rng = np.random.default_rng(0)
    for x in (rng.integers(0, 9, 30), np.ones(5), rng.exponential(size=50)):
        # Gini = Σ_i Σ_j |x_i − x_j| / (2 n² mean)
        expected = np.abs(x[:, None] - x[None, :]).sum() / (2 * x.size**2 * x.mean())
        assert gini(x) == pytest.approx(expected, abs=1e-12)


# ----------------------------------------------------------------------------- denoising


@pytest.mark.parametrize(("rate", "seed"), [(0.5, 0), (0.2, 1)])
def test_add_random_edges_adds_exactly_the_budget(graph, rate, seed):
    before = undirected_set(graph.edge_index)
    noisy = add_random_edges(graph, rate, seed)
    after = undirected_set(noisy.edge_index)
    assert before <= after
    assert len(after - before) == int(rate * len(before))
    pairs = directed_pairs(noisy.edge_index)
    assert pairs == {(b, a) for a, b in pairs}  # symmetric
    assert all(a != b for a, b in after - before)
    # every new pair appears exactly twice (no duplicate draws)
    assert noisy.edge_index.shape[1] == graph.edge_index.shape[1] + 2 * len(after - before)
    assert torch.equal(add_random_edges(graph, rate, seed).edge_index, noisy.edge_index)


def test_add_random_edges_inductive_and_scarce_cases(graph):
    train = set(graph.train_mask.nonzero().flatten().tolist())
    before = undirected_set(graph.edge_index)
    noisy = add_random_edges(graph, 0.5, 0, setting="inductive")
    new = undirected_set(noisy.edge_index) - before
    inside = [e for e in before if e[0] in train and e[1] in train]
    assert len(new) == int(0.5 * len(inside))
    assert all(a in train and b in train for a, b in new)

    def small_graph(pairs):
        pairs = np.array(pairs).T
        index = torch.from_numpy(np.concatenate([pairs, pairs[::-1]], 1))
        return GraphData(torch.zeros(6, 1), index, torch.zeros(6, dtype=torch.long))

    # K6 minus one edge: 14 edges, a budget of 7, but a single non-edge
    k6 = [p for p in itertools.combinations(range(6), 2) if p != (0, 1)]
    with pytest.raises(ValueError, match="only 1 node pairs are not edges"):
        add_random_edges(small_graph(k6), 0.5, 0)
    # a 6-cycle at rate 1: 6 of its 9 non-edges, scarce enough to be enumerated
    cycle = [(i, (i + 1) % 6) for i in range(6)]
    before = undirected_set(small_graph(cycle).edge_index)
    after = undirected_set(add_random_edges(small_graph(cycle), 1.0, 0).edge_index)
    assert before <= after
    assert len(after) == 12


@pytest.mark.parametrize("setting", ["transductive", "inductive"])
def test_feature_noise_masks_exactly_the_columns(graph, setting):
    rate = 0.3
    noisy = feature_noise(graph, rate, 0, setting=setting)
    rows = graph.train_mask if setting == "inductive" else torch.ones(graph.num_nodes, dtype=bool)
    changed = (noisy.x != graph.x).any(0)
    assert int(changed.sum()) == int(rate * graph.x.shape[1])
    assert bool((noisy.x[rows][:, changed] == 0).all())
    assert torch.equal(noisy.x[:, ~changed], graph.x[:, ~changed])
    assert torch.equal(noisy.x[~rows], graph.x[~rows])
    gaussian = feature_noise(graph, rate, 0, kind="gaussian", setting=setting)
    assert int((gaussian.x != graph.x).any(1).sum()) == int(rate * int(rows.sum()))
    with pytest.raises(ValueError, match="kind must be"):
        feature_noise(graph, rate, kind="salt")
    with pytest.raises(ValueError, match="attack must be one of"):
        corrupt(graph, "nettack", rate)


def test_prbcd_pieces_match_their_oracles():
    n = 7
    rows, cols = np.triu_indices(n, k=1)  # row-major strict upper triangle
    r, c = linear_to_pairs(torch.arange(rows.size), n)
    assert np.array_equal(r.numpy(), rows)
    assert np.array_equal(c.numpy(), cols)
    rng = np.random.default_rng(0)
    w = torch.from_numpy(rng.uniform(-0.5, 1.5, 50))
    projected = project_to_budget(w, 5, 1e-7)
    # the shift μ that brings Σ clip(w − μ, 0, 1) to the budget, found by a root finder
    mu = scipy.optimize.brentq(lambda m: np.clip(w.numpy() - m, 0, 1).sum() - 5, -2, 2, xtol=1e-12)
    assert np.allclose(projected.numpy(), np.clip(w.numpy() - mu, 1e-7, 1 - 1e-7), atol=1e-9)
    logits = torch.from_numpy(rng.normal(size=(9, 4)))
    labels = torch.from_numpy(rng.integers(0, 4, 9))
    margins = [
        max(v for j, v in enumerate(row) if j != y) - row[y]
        for row, y in zip(logits.tolist(), labels.tolist(), strict=True)
    ]
    assert float(tanh_margin_loss(logits, labels)) == pytest.approx(np.tanh(margins).mean())


def test_prbcd_respects_budget_and_beats_random_edges():
    graph = gc4nc.from_benchdata(
        benchdata.csbm(150, num_classes=2, average_degree=6, seed=0),
        split="random",
        train=0.3,
        val=0.2,
    )
    surrogate = train_surrogate(graph, hidden=32, epochs=60)
    config = PRBCDConfig(epochs=40, fine_tune_epochs=10)
    rate = 0.2
    attacked = prbcd_attack(graph, rate, surrogate=surrogate, config=config)
    budget = int(rate * pair_keys(graph.edge_index, 150).numel())
    flips = undirected_set(attacked.edge_index) ^ undirected_set(graph.edge_index)
    assert 0 < len(flips) <= budget
    pairs = directed_pairs(attacked.edge_index)
    assert pairs == {(b, a) for a, b in pairs}
    assert all(a != b for a, b in pairs)
    assert torch.equal(
        prbcd_attack(graph, rate, surrogate=surrogate, config=config).edge_index,
        attacked.edge_index,
    )  # seeded
    # a block smaller than the 11,175 pairs: the resampling path, same guarantees
    small_block = PRBCDConfig(epochs=20, fine_tune_epochs=5, search_space_size=500)
    resampled = prbcd_attack(graph, rate, surrogate=surrogate, config=small_block)
    flips = undirected_set(resampled.edge_index) ^ undirected_set(graph.edge_index)
    assert 0 < len(flips) <= budget
    pairs = directed_pairs(resampled.edge_index)
    assert pairs == {(b, a) for a, b in pairs}
    randomised = add_random_edges(graph, rate, 0)
    every = torch.ones(150, dtype=torch.bool)

    def margin_loss(data):
        with torch.no_grad():
            return float(tanh_margin_loss(surrogate(data.x, Structure.from_graph(data)), data.y))

    # the same budget: gradient-chosen flips hurt the attacked model more than random additions
    # (measured: accuracy 0.80 vs 0.90, well apart; the margin loss moves the same way)
    assert accuracy(surrogate, Split.of(attacked, every)) < accuracy(
        surrogate, Split.of(randomised, every)
    )
    assert margin_loss(attacked) > margin_loss(randomised)


# ----------------------------------------------------------------------------- NAS


def test_search_space_has_480_distinct_architectures():
    space = search_space()
    assert len(space) == len(set(space)) == 480 == len(HOPS) * len(HIDDEN) * len(ALPHAS) * 8
    assert {a.activation for a in space} == set(NAS_ACTIVATIONS)
    assert set(NAS_ACTIVATIONS) <= set(ACTIVATIONS)  # relu6 included
    subset = sample_architectures(20, seed=3)
    assert len(set(subset)) == 20
    assert set(subset) <= set(space)
    assert subset == sample_architectures(20, seed=3)


@pytest.mark.parametrize("seed", range(3))
def test_correlations_match_scipy(seed):
    rng = np.random.default_rng(seed)
    a = np.round(rng.random(40), 1)  # ties
    b = np.round(a + rng.normal(0, 0.3, 40), 1)
    assert np.array_equal(descending_min_rank(a), scipy.stats.rankdata(-a, method="min"))
    assert pearson(a, b) == pytest.approx(scipy.stats.pearsonr(a, b)[0], abs=1e-12)
    ranks = scipy.stats.rankdata(-a, method="min"), scipy.stats.rankdata(-b, method="min")
    assert pearson(descending_min_rank(a), descending_min_rank(b)) == pytest.approx(
        scipy.stats.pearsonr(*ranks)[0], abs=1e-12
    )
    assert pearson(np.ones(5), rng.random(5)) is None


def test_nas_correlation_small_search(graph, condensed):
    result = nas_correlation(
        condensed,
        graph,
        TINY,
        num_architectures=3,
        condensed_epochs=5,
        original_epochs=5,
        test_runs=1,
        test_epochs=5,
    )
    val_c, val_o = result["val_condensed"], result["val_original"]
    assert len(val_c) == len(val_o) == 3
    expected = scipy.stats.pearsonr(val_c, val_o)[0] if np.ptp(val_c) * np.ptp(val_o) else None
    assert result["pearson_accuracy"] == (None if expected is None else pytest.approx(expected))
    assert result["best_on_condensed"] == result["architectures"][int(np.argmax(val_c))]
    assert set(result["test"]) == {
        "best_on_condensed_trained_on_original",
        "best_on_original_trained_on_original",
        "best_on_condensed_trained_on_condensed",
    }


# ----------------------------------------------------------------------------- transferability


def test_transfer_grid_and_threshold(graph, condensed):
    sizes = {"gcn": 16, "sage": 16, "mlp": 16, "cheby": 16, "sgc": 4, "appnp": 64, "gat": 24}
    for model, size in sizes.items():
        settings = grid(model)
        assert len(settings) == size
        assert len({json.dumps(s, sort_keys=True) for s in settings}) == size  # distinct
    weighted = CondensedGraph(condensed.x, torch.full((condensed.num_nodes,) * 2, 0.3), condensed.y)
    assert float(thresholded(weighted, 0.5).adjacency.abs().sum()) == 0.0
    assert torch.equal(thresholded(weighted, 0.2).adjacency, weighted.adjacency)


def test_transfer_grid_search_keeps_the_best_validation(graph, condensed):
    config = EvalConfig(epochs=8, runs=1)
    result = transferability(condensed, graph, config, models=("sgc",), grid_search=True)
    # the oracle: each grid setting re-run, the best mean validation accuracy picked by hand
    val = Split.of(graph, graph.val_mask)
    scores = []
    for setting in grid("sgc"):
        trial = EvalConfig(model="sgc", epochs=8, runs=1, **setting)
        model, _ = train_on_condensed(condensed, graph, trial, seed=0)
        scores.append(accuracy(model, val))
    assert result["sgc"]["val_mean"] == pytest.approx(max(scores))
    assert result["sgc"]["hyperparameters"] == grid("sgc")[int(np.argmax(scores))]


# ----------------------------------------------------------------------------- efficiency


def test_loglog_slope_recovers_power_laws():
    sizes = np.array([100, 200, 400, 800, 1600])
    assert loglog_slope(sizes, 3e-5 * sizes**1.7)[0] == pytest.approx(1.7, abs=1e-12)
    noisy = 2e-4 * sizes**1.2 * np.exp(np.random.default_rng(0).normal(0, 0.1, 5))
    fit = scipy.stats.linregress(np.log(sizes), np.log(noisy))
    assert loglog_slope(sizes, noisy) == pytest.approx((fit.slope, fit.intercept), abs=1e-10)
    with pytest.raises(ValueError, match="positive"):
        loglog_slope([1, 2], [0.0, 1.0])


def test_scaling_sweep_fits_the_measured_times(monkeypatch):
    # condense() reads its clock from gc4nc._measure.measure: a fake one reports 1e-4 · n^1.5
    current = {}

    @contextlib.contextmanager
    def fake_measure(device="cpu", **_):
        result = gc4nc._measure.Measurement(source="synthetic")
        yield result
        result.seconds = 1e-4 * current["n"] ** 1.5
        result.peak_bytes = 8 * current["n"]

    def make_graph(n):
        current["n"] = n
        data = benchdata.csbm(n, num_classes=2, average_degree=4, seed=n)
        return gc4nc.from_benchdata(data, split="random", train=0.3, val=0.2)

    monkeypatch.setattr(gc4nc._measure, "measure", fake_measure)
    sweep = scaling_sweep(make_graph, [60, 120, 240], "random", 0.5, repeats=2)
    assert sweep["slope"] == pytest.approx(1.5, abs=1e-9)
    assert sweep["peak_memory_bytes"] == [480, 960, 1920]


def test_condensation_cost_reads_the_metadata(graph, condensed):
    cost = condensation_cost(condensed, graph)
    assert cost["seconds"] == condensed.metadata["seconds"]
    expected = 4 * condensed.x.numel() + 4 * condensed.adjacency.numel() + 8 * condensed.y.numel()
    assert cost["condensed_bytes"] == expected
    with pytest.raises(ValueError, match="lacks"):
        condensation_cost(CondensedGraph(condensed.x, None, condensed.y))


# ----------------------------------------------------------------------------- evaluate


def test_evaluate_returns_every_dimension(graph, condensed):
    options = {
        "privacy": {"runs": 1},
        "nas": {
            "num_architectures": 2,
            "condensed_epochs": 5,
            "original_epochs": 5,
            "test_runs": 1,
            "test_epochs": 5,
        },
        "transferability": {"models": ("sgc", "mlp")},
    }
    report = evaluate(condensed, graph, DIMENSIONS, TINY, options=options)
    assert set(DIMENSIONS) <= set(report)
    json.dumps(report, allow_nan=False)  # strict JSON
    assert report["performance"]["condensed"]["mean"] == pytest.approx(
        condensed_accuracy(condensed, graph, TINY).mean
    )
    assert (
        report["properties"]["condensed"]["num_edges"]
        == graph_properties(condensed, graph)["condensed"]["num_edges"]
    )
    # the clean side of denoising reuses the condensed graph with the same schedule and seeds
    denoising = report["denoising"]
    assert denoising["methods"]["random"]["clean"] == report["performance"]["condensed"]
    assert denoising["whole"]["clean"] == report["performance"]["whole"]
    assert set(denoising["methods"]) == {"random"}
    assert set(report["transferability"]) == {"sgc", "mlp"}


def test_evaluate_rejects_unknown_dimensions(graph, condensed):
    with pytest.raises(ValueError, match=r"unknown evaluation dimension\(s\) \['speed'\]"):
        evaluate(condensed, graph, ("performance", "speed"))
    with pytest.raises(ValueError, match="options for unknown"):
        evaluate(condensed, graph, ("properties",), options={"nsa": {}})
