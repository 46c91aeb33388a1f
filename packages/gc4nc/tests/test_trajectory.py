"""Trajectory matching (SFGC, GEOM): the unrolled functional GCN against torch.optim.SGD on an
nn.Module, the meta-gradient against finite differences, the matching loss and the curriculum
against hand computation / brute force, snapshot cadence against a recorded training loop, the
expert buffer's file format, and both methods end to end on a small CSBM."""

from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import gc4nc
from benchdata import csbm
from gc4nc.graph import GraphData, Structure
from gc4nc.methods.base import CondenseTask
from gc4nc.methods.experts import (
    ExpertBuffer,
    curriculum_fraction,
    curriculum_order,
    neighbourhood_entropy,
    train_expert,
    train_experts,
)
from gc4nc.methods.trajectory import (
    PRESETS,
    QUICK,
    FlatGCN,
    parameter_matching_loss,
    snapshot_pair,
    unroll,
    window_upper_bound,
)
from gc4nc.models import GCN


def hand_graph() -> GraphData:
    # 0-1-2-3 path, 3-4, 4-5, 5-0, 6 isolated, 7-2; a duplicated edge and a self loop
    pairs = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0), (7, 2), (0, 1), (4, 4)]
    src = [a for a, b in pairs] + [b for a, b in pairs]
    dst = [b for a, b in pairs] + [a for a, b in pairs]
    g = torch.Generator().manual_seed(0)
    y = torch.tensor([0, 1, 0, 2, 2, 1, 0, 1])
    train = torch.tensor([1, 1, 0, 1, 1, 0, 1, 1], dtype=torch.bool)
    return GraphData(
        torch.randn(8, 5, generator=g), torch.tensor([src, dst]), y, train, ~train, ~train
    )


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # these tensors are tiny: with 2 cores shared by other jobs, intra-op threads only spin-wait
    # (the end-to-end tests take ~1 s on one thread, ~20 s on two busy cores)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def small() -> GraphData:
    graph = csbm(300, num_classes=3, num_features=16, feature_signal=2.0, seed=0)
    return gc4nc.from_benchdata(graph, split="planetoid", per_class=10, num_val=60, num_test=120)


TINY = {
    "num_experts": 2,
    "teacher_epochs": 40,
    "expert_epochs": 20,
    "syn_steps": 4,
    "epochs": 25,
    "hidden": 16,
    "lr_teacher": 0.2,
}
TINY_SFGC = {**TINY, "start_epoch": 20}
TINY_GEOM = {**TINY, "T": 20, "max_start_epoch_s": 5, "max_start_epoch": 25, "lr_y": 0.01}


def module_vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


# ------------------------------------------------------------------------- student


@pytest.mark.parametrize("soft", [False, True])
def test_unroll_equals_module_trained_with_sgd(soft):
    graph = hand_graph()
    adjacency = torch.zeros(8, 8, dtype=torch.float64)
    adjacency[graph.edge_index[0], graph.edge_index[1]] = 1.0
    structure = Structure.dense(adjacency)  # float64 (the sparse operator is float32)
    x = graph.x.double()
    torch.manual_seed(1)
    model = GCN(5, 8, 3, dropout=0.0).double()
    theta0 = module_vector(model)
    targets = torch.randn(8, 3, dtype=torch.float64) if soft else graph.y

    def oracle_loss(logits):  # KL(p ‖ q) averaged over rows, written out
        if not soft:
            return F.cross_entropy(logits, targets)
        p = targets.softmax(-1)
        return (p * (p.log() - logits.log_softmax(-1))).sum(-1).mean()

    sgd = torch.optim.SGD(model.parameters(), lr=0.3)
    for _ in range(4):
        sgd.zero_grad()
        oracle_loss(model(x, structure)).backward()
        sgd.step()
    net = FlatGCN(5, 8, 3)
    final = unroll(net, theta0, x, structure, targets, torch.tensor(0.3, dtype=torch.float64), 4)
    # float64 throughout: both sides perform the same arithmetic up to summation order
    torch.testing.assert_close(final.detach(), module_vector(model), rtol=0, atol=1e-12)


def test_meta_gradient_matches_finite_differences():
    graph = hand_graph()
    structure = Structure.identity(4)
    torch.manual_seed(2)
    net = FlatGCN(3, 4, 2)
    theta_s = torch.randn(net.num_parameters, dtype=torch.float64)
    theta_t = torch.randn(net.num_parameters, dtype=torch.float64)
    labels = graph.y[:4] % 2

    def loss(x, lr):
        final = unroll(net, theta_s, x, structure, labels, lr, 2)
        return parameter_matching_loss(final, theta_s, theta_t, squared=False)

    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    lr = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    # central differences in float64: gradcheck's default eps 1e-6, atol 1e-5
    assert torch.autograd.gradcheck(loss, (x, lr))


def test_parameter_matching_loss_by_hand():
    final, start, target = (
        torch.tensor([1.0, 2.0]),
        torch.tensor([4.0, 4.0]),
        torch.tensor([1.0, 0.0]),
    )
    # ‖final − target‖ = 2, ‖start − target‖ = ‖(3, 4)‖ = 5
    assert parameter_matching_loss(final, start, target, squared=True).item() == pytest.approx(
        4 / 25
    )
    assert parameter_matching_loss(final, start, target, squared=False).item() == pytest.approx(0.4)


# ------------------------------------------------------------------------- experts


@pytest.mark.parametrize("optim", ["SGD", "Adam"])
def test_snapshot_cadence_against_recorded_training(optim):
    graph = hand_graph()
    structure = Structure.from_graph(graph)
    torch.manual_seed(3)
    model = GCN(5, 8, 3, dropout=0.0)
    twin = copy.deepcopy(model)
    nodes = torch.tensor([6, 0, 1, 3, 4, 7])

    def fraction(epoch):
        return 0.5 if epoch < 12 else 1.0

    snapshots = train_expert(
        model,
        graph.x,
        structure,
        graph.y,
        nodes,
        epochs=25,
        optim=optim,
        lr=0.1,
        weight_decay=5e-4,
        fraction=fraction,
    )
    kind = torch.optim.SGD if optim == "SGD" else torch.optim.Adam
    opt = kind(twin.parameters(), lr=0.1, weight_decay=5e-4)
    after = [module_vector(twin)]  # after[s] = parameters after s optimiser steps
    for epoch in range(25):
        used = nodes[:3] if epoch < 12 else nodes
        opt.zero_grad()
        F.cross_entropy(twin(graph.x, structure)[used], graph.y[used]).backward()
        opt.step()
        after.append(module_vector(twin))
    assert snapshots.shape == (3, module_vector(twin).numel())  # steps 0, 10, 20
    for k in range(3):
        torch.testing.assert_close(snapshots[k], after[10 * k], rtol=0, atol=0)


def test_snapshot_and_window_indices():
    assert snapshot_pair(0, 50, 6) == (0, 5)
    assert snapshot_pair(29, 50, 8) == (2, 7)  # epoch 29 starts at snapshot 2 (epoch 20)
    assert snapshot_pair(30, 59, 9) == (3, 8)
    with pytest.raises(ValueError, match="needs snapshot 8"):
        snapshot_pair(30, 50, 8)
    with pytest.raises(ValueError, match="expert_epochs must be >= 10"):
        snapshot_pair(0, 9, 8)
    assert [window_upper_bound(it, 5, 25) for it in (0, 1, 19, 20, 100)] == [5, 6, 24, 25, 25]


def test_experts_are_independently_initialised(small):
    task = make_task(small)
    buffer = train_experts(
        task,
        num_experts=3,
        teacher_epochs=20,
        lr_teacher=0.1,
        wd_teacher=0.0,
        optim="SGD",
        hidden=8,
    )
    assert (len(buffer), buffer.num_snapshots) == (3, 3)
    firsts = [t[0] for t in buffer.trajectories]
    for i in range(3):
        for j in range(i):
            assert not torch.equal(firsts[i], firsts[j])
        if i:  # not one continued run (GraphSlim's SFGC, bug B6)
            assert not torch.equal(firsts[i], buffer[i - 1][-1])


def make_task(graph: GraphData) -> CondenseTask:
    index = graph.train_mask.nonzero().flatten()
    return CondenseTask(
        graph,
        index,
        torch.tensor([2, 2, 2]),
        "transductive",
        0,
        torch.device("cpu"),
        torch.Generator().manual_seed(0),
    )


# ------------------------------------------------------------------------- curriculum


def brute_entropy(graph: GraphData, node: int, labelled: torch.Tensor) -> float:
    neighbours = {node} | {int(b) for a, b in graph.edge_index.t().tolist() if a == node}
    hist = Counter(int(graph.y[u]) for u in neighbours if labelled[u])
    total = sum(hist.values())
    return -sum(c / total * math.log(c / total) for c in hist.values())


def test_neighbourhood_entropy_against_brute_force():
    graph = hand_graph()
    nodes = torch.arange(8)
    labelled = graph.train_mask
    got = neighbourhood_entropy(graph.edge_index, graph.y, labelled, nodes, 3)
    want = torch.tensor([brute_entropy(graph, v, labelled) for v in range(8)], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)  # float64, exact logs
    # node 0: itself (0), 1 (1), 5 unlabelled -> {0: 1, 1: 1}: ln 2
    assert got[0].item() == pytest.approx(math.log(2))
    # an unlabelled node's label never enters (GraphSlim reads every label: a test-label leak)
    leaked = graph.clone(y=graph.y.clone())
    leaked.y[~labelled] = (leaked.y[~labelled] + 1) % 3
    again = neighbourhood_entropy(leaked.edge_index, leaked.y, labelled, nodes, 3)
    torch.testing.assert_close(again, got, rtol=0, atol=0)


def test_curriculum_order_sorts_training_nodes_by_entropy():
    graph = hand_graph()
    task = CondenseTask(
        graph,
        graph.train_mask.nonzero().flatten(),
        torch.tensor([1, 1, 1]),
        "transductive",
        0,
        torch.device("cpu"),
        torch.Generator(),
    )
    order = curriculum_order(task).tolist()
    labelled = graph.train_mask
    scores = {v: brute_entropy(graph, v, labelled) for v in task.train_index.tolist()}
    assert sorted(order) == sorted(scores)
    assert [scores[v] for v in order] == sorted(scores.values())


@pytest.mark.parametrize(
    ("scheduler", "lam", "t", "expected"),
    [
        ("linear", 0.5, 0.5, 0.75),  # λ + (1 − λ)·t/T
        ("root", 0.6, 0.5, math.sqrt(0.68)),  # sqrt(λ² + (1 − λ²)·t/T) = sqrt(0.36 + 0.32)
        ("geom", 0.25, 0.5, 0.5),  # λ^(1 − t/T) = 0.25^0.5
        ("geom", 0.75, 0.0, 0.75),
        ("linear", 0.5, 1.5, 1.0),  # capped at 1 after T
        ("root", 0.8, 2.0, 1.0),
        ("geom", 0.75, 1.0, 1.0),
    ],
)
def test_schedulers_closed_forms(scheduler, lam, t, expected):
    assert curriculum_fraction(scheduler, lam, t * 40, 40) == pytest.approx(expected, abs=1e-12)


# ------------------------------------------------------------------------- buffer file


def test_buffer_round_trip_and_errors(tmp_path):
    g = torch.Generator().manual_seed(4)
    buffer = ExpertBuffer(
        [torch.randn(3, 7, generator=g), torch.randn(5, 7, generator=g)], {"optim": "SGD"}
    )
    path = buffer.save(tmp_path / "sub" / "experts.safetensors")
    loaded = ExpertBuffer.load(path)
    assert (len(loaded), loaded.num_snapshots) == (2, 3)
    assert loaded.metadata == {"optim": "SGD"}
    for a, b in zip(loaded.trajectories, buffer.trajectories, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(FileNotFoundError, match="no expert buffer"):
        ExpertBuffer.load(tmp_path / "missing.safetensors")
    (tmp_path / "garbage").write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        ExpertBuffer.load(tmp_path / "garbage")
    (tmp_path / "cut").write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ValueError, match="not a readable safetensors"):
        ExpertBuffer.load(tmp_path / "cut")
    flipped = bytearray(path.read_bytes())
    flipped[-3] ^= 0xFF  # inside the last snapshot's float32 bytes: a readable file, wrong data
    (tmp_path / "flipped").write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="do not match the recorded sha256"):
        ExpertBuffer.load(tmp_path / "flipped")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "other"))
    with pytest.raises(ValueError, match="not a gc4nc expert buffer"):
        ExpertBuffer.load(tmp_path / "other")
    with pytest.raises(ValueError, match="different parameter counts"):
        ExpertBuffer([torch.zeros(2, 3), torch.zeros(2, 4)])
    with pytest.raises(ValueError, match="at least one"):
        ExpertBuffer([])
    assert "2 experts" in repr(buffer)


# ------------------------------------------------------------------------- end to end


def test_sfgc_end_to_end_deterministic_with_reusable_buffer(small, tmp_path):
    path = tmp_path / "sfgc.safetensors"
    a = gc4nc.condense(small, "sfgc", 0.5, seed=3, save_buffer=path, **TINY_SFGC)
    b = gc4nc.condense(small, "sfgc", 0.5, seed=3, **TINY_SFGC)
    # the same seed, or the saved experts: the same condensed graph
    c = gc4nc.condense(small, "sfgc", 0.5, seed=3, buffer=path, **TINY_SFGC)
    d = gc4nc.condense(small, "sfgc", 0.5, seed=4, **TINY_SFGC)
    assert torch.equal(a.x, b.x)
    assert torch.equal(a.x, c.x)
    assert not torch.equal(a.x, d.x)
    assert a.adjacency is None
    assert a.x.shape == (15, 16)
    assert a.y.tolist() == [0] * 5 + [1] * 5 + [2] * 5
    start = gc4nc.condense(small, "random", 0.5, seed=3)  # the initialisation (same generator)
    assert not torch.allclose(a.x, start.x)
    info = a.metadata["info"]
    assert [it for it, _ in info["loss_curve"]] == [0, 10, 20, 24]
    # start epochs 0, 10, 20 of 40 (5 snapshots), target 20 epochs later: all three used
    assert set(info["start_snapshots"]) == {0, 1, 2}
    assert info["target_offset"] == 2
    assert (info["experts"]["experts"], info["experts"]["snapshots"]) == (2, 5)


def test_geom_end_to_end_soft_labels_and_window(small):
    a = gc4nc.condense(small, "geom", 0.5, seed=5, beta=0.1, **TINY_GEOM)
    b = gc4nc.condense(small, "geom", 0.5, seed=5, beta=0.1, **TINY_GEOM)
    assert torch.equal(a.x, b.x)
    assert torch.equal(a.y, b.y)
    assert a.adjacency is None
    assert a.y.shape == (15, 3)
    assert bool((a.y >= 0).all())
    torch.testing.assert_close(a.y.sum(1), torch.ones(15), rtol=0, atol=1e-6)  # float32 softmax
    starts = a.metadata["info"]["start_snapshots"]
    for it, s in enumerate(starts):  # start epoch < min(5 + it, 25): snapshot <= (bound - 1) // 10
        assert s <= (window_upper_bound(it, 5, 25) - 1) // 10
    assert starts[:6] == [0] * 6  # bound <= 10 for it <= 5
    assert max(starts) >= 1
    hard = gc4nc.condense(small, "geom", 0.5, seed=5, soft_label=False, **TINY_GEOM)
    assert hard.y.dtype == torch.int64
    assert hard.y.tolist() == [0] * 5 + [1] * 5 + [2] * 5
    assert hard.metadata["info"]["experts"]["curriculum"] == "geom(lam=0.75, T=20)"


def test_bad_inputs(small, tmp_path):
    with pytest.raises(ValueError, match="teacher_epochs to >= 40"):
        gc4nc.condense(small, "sfgc", 0.5, **{**TINY_SFGC, "teacher_epochs": 30})
    with pytest.raises(ValueError, match="teacher_epochs to >= 50"):  # start epoch 30 possible
        gc4nc.condense(small, "geom", 0.5, **{**TINY_GEOM, "max_start_epoch": 31})
    with pytest.raises(ValueError, match="optim"):
        gc4nc.condense(small, "sfgc", 0.5, **{**TINY_SFGC, "optim": "rmsprop"})
    with pytest.raises(ValueError, match="scheduler"):
        gc4nc.condense(small, "geom", 0.5, **{**TINY_GEOM, "scheduler": "cosine"})
    with pytest.raises(ValueError, match="lam"):
        gc4nc.condense(small, "geom", 0.5, **{**TINY_GEOM, "lam": 1.5})
    with pytest.raises(ValueError, match="syn_steps must be a finite number > 0"):
        gc4nc.condense(small, "sfgc", 0.5, **{**TINY_SFGC, "syn_steps": 0})
    with pytest.raises(ValueError, match="init must be a coreset method"):
        gc4nc.condense(small, "sfgc", 0.5, init="gcond", **TINY_SFGC)
    with pytest.raises(FileNotFoundError):
        gc4nc.condense(small, "sfgc", 0.5, buffer=tmp_path / "none.safetensors", **TINY_SFGC)
    narrow = ExpertBuffer([torch.zeros(5, 10)])
    with pytest.raises(ValueError, match="10 parameters"):
        gc4nc.condense(small, "sfgc", 0.5, buffer=narrow, **TINY_SFGC)
    short = ExpertBuffer([torch.zeros(3, 16 * 16 + 16 + 16 * 3 + 3)])
    with pytest.raises(ValueError, match="3 snapshots"):
        gc4nc.condense(small, "sfgc", 0.5, buffer=short, **TINY_SFGC)


def test_presets_cover_every_dataset_and_fit_their_trajectories():
    for method in ("sfgc", "geom"):
        spec = gc4nc.METHODS[method]
        assert set(PRESETS[method]) == {"cora", "citeseer", "pubmed", "arxiv", "flickr", "reddit"}
        assert spec.defaults["num_experts"] == 20
        for preset in [*PRESETS[method].values(), {**PRESETS[method]["cora"], **QUICK[method]}]:
            assert set(preset) <= set(spec.defaults)
            snapshots = 1 + preset["teacher_epochs"] // 10
            last = preset.get("start_epoch", preset.get("max_start_epoch", 0) - 1)
            snapshot_pair(last, preset["expert_epochs"], snapshots)  # raises if too short
