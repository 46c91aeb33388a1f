"""Shared machinery of gradient matching (GCond, DosCond, SGDD; used by GCDM too): GraphSlim's
matching distance, its PGE adjacency generator, its condensation models (SGC, GCN) with exact
real-graph forwards, the per-class matching loss, and checkpoint selection.

See `gc4nc.methods.gradient` for the methods, how they follow GraphSlim and where they differ.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gc4nc.graph import Structure
from gc4nc.methods.base import CondenseTask

log = logging.getLogger(__name__)

METRICS = ("ours", "mse", "cos")
COSINE_EPS = 1e-6  # GraphSlim's `distance_wb` / `match_loss` denominator guard


def match_distance(
    g_syn: Sequence[torch.Tensor], g_real: Sequence[torch.Tensor], metric: str = "ours"
) -> torch.Tensor:
    """GraphSlim's gradient-matching distance between two lists of per-parameter gradients.

    "ours": Σ over parameters with ≥ 2 dims (PyTorch's (out, in) weights, rows = output units) of
    Σ_rows 1 − ⟨g_syn, g_real⟩ / (‖g_syn‖‖g_real‖ + 1e-6); 1-D tensors (biases, norms) count 0.
    "mse": ‖vec(g_syn) − vec(g_real)‖² over all tensors; "cos": 1 − cosine of the concatenations.

    Args:
        g_syn: gradients on the synthetic graph (may carry an autograd graph).
        g_real: gradients on the real graph, same shapes.
        metric: "ours", "mse" or "cos".

    Returns:
        A scalar tensor.
    """
    if metric not in METRICS:
        raise ValueError(f"dis_metric must be one of {METRICS}, got {metric!r}")
    if len(g_syn) != len(g_real) or not g_syn:
        raise ValueError(
            f"need two equally long, non-empty gradient lists, got {len(g_syn)} and {len(g_real)}"
        )
    for gs, gr in zip(g_syn, g_real, strict=True):
        if gs.shape != gr.shape:
            raise ValueError(f"gradient shapes differ: {tuple(gs.shape)} vs {tuple(gr.shape)}")
    if metric == "ours":
        total = g_syn[0].new_zeros(())
        for gs, gr in zip(g_syn, g_real, strict=True):
            if gs.ndim < 2:
                continue
            gs, gr = gs.reshape(gs.shape[0], -1), gr.reshape(gr.shape[0], -1)
            cos = (gs * gr).sum(-1) / (gs.norm(dim=-1) * gr.norm(dim=-1) + COSINE_EPS)
            total = total + (1 - cos).sum()
        return total
    s = torch.cat([g.reshape(-1) for g in g_syn])
    r = torch.cat([g.reshape(-1) for g in g_real])
    if metric == "mse":
        return ((s - r) ** 2).sum()
    return 1 - (s * r).sum() / (s.norm() * r.norm() + COSINE_EPS)


def pair_linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`linear([x_i ‖ x_j])` for all n² ordered pairs (row i·n + j), computed as W_a x_i + W_b x_j
    + b without forming the (n², 2d) concatenation. x: (n, d); returns (n², out)."""
    d = x.shape[1]
    left = x @ linear.weight[:, :d].t()
    right = x @ linear.weight[:, d:].t()
    return (left[:, None, :] + right[None, :, :] + linear.bias).reshape(-1, left.shape[1])


def symmetric_sigmoid(scores: torch.Tensor) -> torch.Tensor:
    """(n, n) pair scores S -> sigmoid((S + Sᵀ)/2) with a zero diagonal."""
    adj = torch.sigmoid((scores + scores.t()) / 2)
    return adj - torch.diag_embed(torch.diagonal(adj))


class PGE(nn.Module):
    """GraphSlim's parametrized adjacency: an MLP on [x'_i ‖ x'_j] for every ordered pair,
    Linear(2d → h) → BN → ReLU → Linear(h → h) → BN → ReLU → Linear(h → 1), then
    A' = sigmoid((S + Sᵀ)/2) with a zero diagonal. Batch norm always uses the statistics of the n²
    pairs (GraphSlim never puts the PGE in eval mode).

    Example:
        >>> import torch
        >>> from gc4nc.methods.gradient import PGE
        >>> pge = PGE(16, hidden=32)
        >>> pge(torch.randn(5, 16)).shape
        torch.Size([5, 5])
    """

    inference_matches_forward = True  # batch statistics: `inference` is `forward` without grad

    def __init__(self, in_dim: int, hidden: int = 128, layers: int = 3) -> None:
        super().__init__()
        if layers < 2 or hidden < 1 or in_dim < 1:
            raise ValueError(
                f"PGE needs in_dim >= 1, hidden >= 1 and layers >= 2, got {in_dim}, "
                f"{hidden}, {layers}"
            )
        dims = [2 * in_dim] + [hidden] * (layers - 1)
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(dims))
        self.bns = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(layers - 1))
        self.out = nn.Linear(hidden, 1)

    def forward(self, x_syn: torch.Tensor) -> torch.Tensor:
        """x_syn: (n, d) with n >= 2 -> (n, n) symmetric adjacency in (0, 1), zero diagonal."""
        n = x_syn.shape[0]
        if n < 2:
            raise ValueError("PGE needs at least 2 synthetic nodes (batch norm over pairs)")
        self.train()  # batch statistics of the pairs, as GraphSlim
        h = pair_linear(self.lins[0], x_syn)
        for i, bn in enumerate(self.bns):
            if i:
                h = self.lins[i](h)
            h = F.relu(bn(h))
        return symmetric_sigmoid(self.out(h).reshape(n, n))

    @torch.no_grad()
    def inference(self, x_syn: torch.Tensor) -> torch.Tensor:
        """`forward` without autograd (what GraphSlim saves and trains the inner model on)."""
        return self.forward(x_syn)


def normalized(adjacency: torch.Tensor | None) -> torch.Tensor | None:
    """D̃^-1/2 (A + I) D̃^-1/2 of a dense adjacency (None, the identity, stays None)."""
    return None if adjacency is None else Structure.dense(adjacency).operator("gcn")


class RealGraph:
    """The real side of matching: features X, the GCN-normalised Â of the condensation graph in CSR
    form, Â^k X and Â^k 1 (computed once per k), and exact computation trees."""

    def __init__(self, task: CondenseTask) -> None:
        op = task.structure.operator("gcn")  # coalesced COO: indices sorted by row, then column
        self.op = op
        row, self.col = op.indices()
        self.val = op.values()
        per_row = torch.bincount(row, minlength=op.shape[0])
        self.crow = torch.cat([per_row.new_zeros(1), per_row.cumsum(0)])
        self.x = task.x.float()
        self._powers = {0: (self.x, torch.ones(self.x.shape[0], device=self.x.device))}

    def propagated(self, hops: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(Â^hops X, Â^hops 1): (N, d) and (N,)."""
        if hops not in self._powers:
            x, ones = self.propagated(hops - 1)
            both = torch.sparse.mm(self.op, torch.cat([x, ones[:, None]], 1))
            self._powers[hops] = (both[:, :-1], both[:, -1])
        return self._powers[hops]

    def rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The non-zero columns `cols` of Â[rows] and the sparse block Â[rows, cols]."""
        start, counts = self.crow[rows], self.crow[rows + 1] - self.crow[rows]
        device = rows.device
        local_row = torch.repeat_interleave(torch.arange(rows.numel(), device=device), counts)
        first = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        index = (
            torch.repeat_interleave(start, counts)
            + torch.arange(int(counts.sum()), device=device)
            - first
        )
        cols, local_col = torch.unique(self.col[index], return_inverse=True)
        block = torch.sparse_coo_tensor(
            torch.stack([local_row, local_col]),
            self.val[index],
            (rows.numel(), cols.numel()),
            check_invariants=False,
        ).coalesce()
        return cols, block

    def tree(self, batch: torch.Tensor, hops: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Node sets S_0 = batch, S_k = neighbours of S_{k-1} (Â has self loops, so S_k ⊇ S_{k-1})
        and blocks Â[S_{k-1}, S_k], k = 1..hops: the exact `hops`-hop computation tree."""
        sets, blocks = [batch], []
        for _ in range(hops):
            cols, block = self.rows(sets[-1])
            sets.append(cols)
            blocks.append(block)
        return sets, blocks


class CondensationSGC(nn.Module):
    """GraphSlim's condensation SGC: `ntrans` linear layers (ReLU between), then `hops`
    propagations Â^hops (the bias before propagation)."""

    def __init__(
        self, in_dim: int, hidden: int, out_dim: int, *, ntrans: int = 1, hops: int = 2
    ) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (ntrans - 1) + [out_dim]
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(dims))
        self.hops = hops

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        for i, lin in enumerate(self.lins):
            x = lin(x) if i == 0 else lin(F.relu(x))
        return x

    def forward(self, x: torch.Tensor, adj: torch.Tensor | None) -> torch.Tensor:
        """Logits on a dense normalised adjacency `adj` (None: the identity)."""
        h = self.transform(x)
        for _ in range(self.hops if adj is not None else 0):
            h = adj @ h
        return h

    def forward_real(self, real: RealGraph, batch: torch.Tensor) -> torch.Tensor:
        """Exact logits of the real nodes `batch`."""
        if len(self.lins) == 1:  # linear in Â^K X and Â^K 1, both computed once
            x, ones = real.propagated(self.hops)
            lin = self.lins[0]
            return x[batch] @ lin.weight.t() + ones[batch, None] * lin.bias
        sets, blocks = real.tree(batch, self.hops)
        h = self.transform(real.x[sets[-1]])
        for block in reversed(blocks):
            h = torch.sparse.mm(block, h)
        return h


class CondensationGCN(nn.Module):
    """GraphSlim's GCN: H ← Â H W + b per layer, ReLU between layers, dropout 0."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, *, layers: int = 2) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(dims))

    def forward(self, x: torch.Tensor, adj: torch.Tensor | None) -> torch.Tensor:
        for i, lin in enumerate(self.lins):
            h = (x if i == 0 else F.relu(x)) @ lin.weight.t()
            x = (h if adj is None else adj @ h) + lin.bias
        return x

    def first_layer_real(self, real: RealGraph, nodes: torch.Tensor) -> torch.Tensor:
        """Pre-activation of the first layer on real `nodes`: (ÂX)[nodes] Wᵀ + b."""
        lin = self.lins[0]
        return real.propagated(1)[0][nodes] @ lin.weight.t() + lin.bias

    def forward_real(self, real: RealGraph, batch: torch.Tensor) -> torch.Tensor:
        """Exact logits of the real nodes `batch` (ÂX once, then exact hops)."""
        sets, blocks = real.tree(batch, len(self.lins) - 1)
        x = self.first_layer_real(real, sets[-1])
        for lin, block in zip(self.lins[1:], reversed(blocks), strict=True):
            x = torch.sparse.mm(block, F.relu(x) @ lin.weight.t()) + lin.bias
        return x


def real_batches(task: CondenseTask, size: int) -> list[tuple[int, torch.Tensor]]:
    """For each class with synthetic nodes: up to `size` random training nodes of the class."""
    out = []
    for c, k in enumerate(task.counts.tolist()):
        if k:
            members = task.class_members(c)
            pick = torch.randperm(members.numel(), generator=task.generator)[:size]
            out.append((c, members[pick].to(task.device)))
    return out


def matching_loss(
    model: nn.Module,
    real: RealGraph,
    real_y: torch.Tensor,
    batches: list[tuple[int, torch.Tensor]],
    x_syn: torch.Tensor,
    adj_syn: torch.Tensor | None,
    y_syn: torch.Tensor,
    metric: str,
) -> torch.Tensor:
    """Σ_c (n'_c / n') · D(∇θ ℓ_syn(c), ∇θ ℓ_real(c)), differentiable in x_syn and adj_syn.

    Args:
        model: the condensation model (`CondensationSGC` / `CondensationGCN`).
        real: the real graph.
        real_y: (N,) labels of the real graph.
        batches: (class, real node indices) pairs (`real_batches`).
        x_syn: (n, d) synthetic features.
        adj_syn: (n, n) normalised synthetic adjacency, or None for the identity.
        y_syn: (n,) synthetic labels.
        metric: the `match_distance` metric.

    Returns:
        A scalar tensor.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    logits_syn = model(x_syn, adj_syn)
    total = x_syn.new_zeros(())
    for c, batch in batches:
        loss_real = F.cross_entropy(model.forward_real(real, batch), real_y[batch])
        g_real = [g.detach() for g in torch.autograd.grad(loss_real, params)]
        mine = y_syn == c
        loss_syn = F.cross_entropy(logits_syn[mine], y_syn[mine])
        g_syn = torch.autograd.grad(loss_syn, params, create_graph=True)
        total = total + int(mine.sum()) / y_syn.numel() * match_distance(g_syn, g_real, metric)
    return total


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore the global torch / numpy / random states afterwards (a checkpoint evaluation seeds
    them; condensation's own random stream must not depend on whether it ran)."""
    states = random.getstate(), np.random.get_state()  # noqa: NPY002 (seed_everything's)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(states[0])
    np.random.set_state(states[1])  # noqa: NPY002


class Checkpoints:
    """GraphSlim's checkpoint selection: every `every` epochs (and at the last), train
    `runs` GCNs for `epochs` epochs on the current condensed graph, score them on the validation
    nodes of the condensation graph, and keep the graph with the best mean (strict improvement)."""

    def __init__(self, task: CondenseTask, every: int, epochs: int, runs: int) -> None:
        graph = task.graph
        if every and (graph.val_mask is None or not bool(graph.val_mask.any())):
            raise ValueError(
                "checkpoint_every needs validation nodes in the condensation graph: "
                "use the transductive setting (the inductive one hides them)"
            )
        self.task, self.every, self.epochs, self.runs = task, every, epochs, runs
        self.best: tuple[float, int, torch.Tensor, torch.Tensor | None] | None = None
        self.history: list[tuple[int, float]] = []

    def due(self, epoch: int, total: int) -> bool:
        return bool(self.every) and ((epoch + 1) % self.every == 0 or epoch == total - 1)

    def offer(self, epoch: int, x: torch.Tensor, adj: torch.Tensor | None, y: torch.Tensor) -> None:
        from gc4nc.condensed import CondensedGraph
        from gc4nc.evaluation.performance import EvalConfig, train_on_condensed
        from gc4nc.training import Split, accuracy

        task = self.task
        condensed = CondensedGraph(x.detach().clone(), None if adj is None else adj.clone(), y)
        val = Split.of(task.graph, task.graph.val_mask).to(task.device)
        config = EvalConfig(epochs=self.epochs, runs=1)
        scores = []
        with preserved_rng():
            for run in range(self.runs):
                model, _ = train_on_condensed(
                    condensed,
                    task.graph,
                    config,
                    seed=task.seed + run,
                    setting="transductive",
                    device=task.device,
                )
                scores.append(accuracy(model, val))
        score = float(np.mean(scores))
        self.history.append((epoch, score))
        log.info("checkpoint at epoch %d: validation accuracy %.4f", epoch, score)
        if self.best is None or score > self.best[0]:
            self.best = (score, epoch, condensed.x, condensed.adjacency)


def thresholded(adj: torch.Tensor, threshold: float) -> torch.Tensor:
    return torch.where(adj < threshold, torch.zeros_like(adj), adj)
