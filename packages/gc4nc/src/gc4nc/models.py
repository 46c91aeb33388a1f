"""The GNNs condensation trains and evaluation compares: GCN, SGC, APPNP, ChebNet, GraphSAGE, GAT
and an MLP, all called as `model(x, structure)` with a `gc4nc.graph.Structure`, so one model
trains on a condensed graph (dense weighted adjacency, or none) and is tested on the original
(sparse) graph.

GCN, SGC, APPNP, ChebNet and GraphSAGE are written on the propagation operators of `Structure`
(dense or sparse matrix products, differentiable in a dense adjacency); GAT uses PyG's `GATConv`
on the edge list (attention ignores edge weights: a condensed adjacency enters GAT through its
non-zero pattern only).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gc4nc._pyg import import_pyg
from gc4nc.graph import Structure

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "elu": F.elu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "leaky_relu": F.leaky_relu,
    "linear": lambda x: x,
    "softplus": F.softplus,
    "relu6": F.relu6,
    "identity": lambda x: x,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


class _LayerStack(nn.Module):
    """`layers` linear maps in_dim → hidden → ... → out_dim, an activation and a dropout rate."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        *,
        layers: int = 2,
        dropout: float = 0.5,
        act: str = "relu",
    ) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(dims))
        self.dropout, self.act = dropout, activation(act)


class MLP(_LayerStack):
    """Linear → act → dropout → ... → Linear; ignores the structure."""

    def forward(self, x: torch.Tensor, structure: Structure | None = None) -> torch.Tensor:
        for i, lin in enumerate(self.lins):
            x = lin(F.dropout(x, self.dropout, self.training) if i else x)
            if i < len(self.lins) - 1:
                x = self.act(x)
        return x


class GCN(_LayerStack):
    """Kipf & Welling's GCN: H_{l+1} = act(Â H_l W_l + b_l), Â = D̃^-1/2 (A + I) D̃^-1/2, dropout
    before every layer but the first, no activation after the last."""

    def forward(self, x: torch.Tensor, structure: Structure) -> torch.Tensor:
        for i, lin in enumerate(self.lins):
            if i:
                x = F.dropout(x, self.dropout, self.training)
            x = structure.propagate(x @ lin.weight.t(), "gcn") + lin.bias
            if i < len(self.lins) - 1:
                x = self.act(x)
        return x


class SGC(nn.Module):
    """Wu et al.'s SGC as GraphSlim writes it: Â^K (X W + b) (one linear layer, then K
    propagations; the bias is propagated too)."""

    def __init__(self, in_dim: int, out_dim: int, *, hops: int = 2, **_: object) -> None:
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim)
        self.hops = hops

    def forward(self, x: torch.Tensor, structure: Structure) -> torch.Tensor:
        x = self.lin(x)
        for _ in range(self.hops):
            x = structure.propagate(x, "gcn")
        return x


class APPNP(nn.Module):
    """Klicpera et al.'s APPNP: an MLP, then K steps of H ← (1 − α) Â H + α H₀."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        *,
        hops: int = 10,
        alpha: float = 0.1,
        dropout: float = 0.5,
        act: str = "relu",
        layers: int = 2,
    ) -> None:
        super().__init__()
        self.mlp = MLP(in_dim, hidden, out_dim, layers=layers, dropout=dropout, act=act)
        self.hops, self.alpha = hops, alpha

    def forward(self, x: torch.Tensor, structure: Structure) -> torch.Tensor:
        h0 = h = self.mlp(x)
        for _ in range(self.hops):
            h = (1 - self.alpha) * structure.propagate(h, "gcn") + self.alpha * h0
        return h


class ChebNet(nn.Module):
    """Defferrard et al.'s ChebNet (K-th order Chebyshev filters of L̃ = −D^-1/2 A D^-1/2)."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        *,
        order: int = 2,
        layers: int = 2,
        dropout: float = 0.5,
        act: str = "relu",
    ) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.convs = nn.ModuleList(
            nn.ModuleList(nn.Linear(a, b, bias=k == 0) for k in range(order))
            for a, b in itertools.pairwise(dims)
        )
        self.dropout, self.act = dropout, activation(act)

    def forward(self, x: torch.Tensor, structure: Structure) -> torch.Tensor:
        for i, lins in enumerate(self.convs):
            if i:
                x = F.dropout(x, self.dropout, self.training)
            t_prev, t = x, structure.propagate(x, "cheb")
            out = lins[0](t_prev)
            for k in range(1, len(lins)):
                out = out + lins[k](t)
                t_prev, t = t, 2 * structure.propagate(t, "cheb") - t_prev
            x = self.act(out) if i < len(self.convs) - 1 else out
        return x


class GraphSAGE(nn.Module):
    """Hamilton et al.'s GraphSAGE, mean aggregator: H' = W_s H + W_n (D^-1 A H)."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        *,
        layers: int = 2,
        dropout: float = 0.5,
        act: str = "relu",
    ) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        pairs = list(itertools.pairwise(dims))
        self.self_lins = nn.ModuleList(nn.Linear(a, b) for a, b in pairs)
        self.neigh_lins = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in pairs)
        self.dropout, self.act = dropout, activation(act)

    def forward(self, x: torch.Tensor, structure: Structure) -> torch.Tensor:
        for i, (ls, ln) in enumerate(zip(self.self_lins, self.neigh_lins, strict=True)):
            if i:
                x = F.dropout(x, self.dropout, self.training)
            neigh = x if structure.is_identity else structure.propagate(x, "mean")
            x = ls(x) + ln(neigh)
            if i < len(self.self_lins) - 1:
                x = self.act(x)
        return x


class GAT(nn.Module):
    """Veličković et al.'s GAT (PyG `GATConv`) as GraphSlim builds it: `heads` heads of width
    `hidden`, concatenated, ELU, then one output head. Edge weights are not used (attention
    replaces them)."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        *,
        heads: int = 8,
        dropout: float = 0.5,
        **_: object,
    ) -> None:
        super().__init__()
        GATConv = import_pyg().nn.GATConv

        self.conv1 = GATConv(in_dim, hidden, heads=heads, dropout=dropout)
        self.conv2 = GATConv(hidden * heads, out_dim, heads=1, dropout=dropout)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, structure: Structure) -> torch.Tensor:
        edge_index, _ = structure.edges()
        edge_index = edge_index.to(x.device)
        x = F.elu(self.conv1(F.dropout(x, self.dropout, self.training), edge_index))
        return self.conv2(F.dropout(x, self.dropout, self.training), edge_index)


MODELS = {
    "gcn": GCN,
    "sgc": SGC,
    "appnp": APPNP,
    "cheby": ChebNet,
    "sage": GraphSAGE,
    "gat": GAT,
    "mlp": MLP,
}


def build_model(name: str, in_dim: int, out_dim: int, *, hidden: int = 256, **kwargs) -> nn.Module:
    """One of `MODELS` by name ("gcn", "sgc", "appnp", "cheby", "sage", "gat", "mlp")."""
    key = name.lower()
    if key not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
    if key == "sgc":
        return SGC(in_dim, out_dim, **kwargs)
    return MODELS[key](in_dim, hidden, out_dim, **kwargs)
