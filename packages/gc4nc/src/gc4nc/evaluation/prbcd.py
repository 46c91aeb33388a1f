"""PRBCD: a gradient-based global structure attack (Geisler et al., "Robustness of Graph Neural
Networks at Scale", NeurIPS 2021), the attack GraphSlim runs under the name "metattack".

The attack flips at most `budget` undirected node pairs (adds a missing edge or removes an
existing one) to make a surrogate GCN misclassify. It relaxes each flip to a weight p ∈ [0, 1]
over a random *block* of candidate pairs: pair (i, j) then carries a + p·(1 − 2a) in the perturbed
adjacency (a ∈ {0, 1} the clean entry: p adds a missing edge, or removes an existing one). Each
epoch it

1. builds the perturbed graph and runs the (fixed, trained) surrogate on it;
2. takes the gradient of the tanh-margin loss mean(tanh(max_{c≠y} z_c − z_y)) over all nodes
   (training nodes with their true labels, every other node with the surrogate's clean
   prediction) with respect to p, and moves p up that gradient;
3. projects p onto {p ∈ [ε, 1 − ε]^b : Σ p ≤ budget} (a bisection for the shift μ with
   Σ clamp(p − μ, 0, 1) = budget, when the plain clamp exceeds the budget);
4. until the last `fine_tune_epochs`, resamples the block: keeps the largest weights (at most
   half the block) and draws fresh random pairs for the rest.

At the end p becomes discrete: the top-`budget` weights first, then Bernoulli(p) samples (those
flipping more than the budget are rejected), keeping the sample with the largest cross-entropy of
the surrogate on the validation nodes (against the same labels as the loss).

As the anchor (`graphslim/models/prbcd.py`, itself after Geisler et al.'s code): surrogate a
2-layer GCN, hidden 256, dropout 0, weight decay 5e-4; 400 epochs of which the last 100 fine-tune
the block; lr 0.1; block of 10,000,000 pairs (all pairs when there are fewer); up to 20 final
samples; ε = 1e-7; the tanh-margin loss; budget int(rate · undirected edges). The anchor recreates
its Adam optimiser every epoch, so every update is a fresh Adam's first step,
lr · g / (|g| + 1e-8) (a signed-gradient step): we apply that step directly.

Differences from the anchor (deliberate):
- the surrogate trains with `gc4nc.training.fit` (best-validation weights over `surrogate_epochs`)
  instead of deeprobust's patience-based early stopping;
- the top-k candidate of the final sampling takes only pairs with positive weight (the anchor's
  top-k can pick zero-weight pairs when fewer than `budget` are positive, flipping pairs the
  attack never chose);
- written on `gc4nc.graph.Structure` (no torch_sparse); the attack sees the unweighted topology.
  In the returned graph surviving edges keep their weights and added edges get weight 1.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from gc4nc.graph import GraphData, Structure, check_graph, num_classes
from gc4nc.models import GCN
from gc4nc.training import Split, fit

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PRBCDConfig:
    """PRBCD's schedule (GraphSlim's defaults).

    Attributes:
        epochs: attack epochs in total.
        fine_tune_epochs: the last epochs, in which the block is no longer resampled.
        lr: the step of each (signed-gradient) update of the flip weights.
        search_space_size: candidate pairs per block (capped at the number of node pairs).
        max_final_samples: discrete samples drawn at the end (the first is the top-k).
        eps: the floor of a flip weight (weights at or below it count as zero).
        surrogate_epochs: training epochs of the surrogate GCN.
        surrogate_hidden: its hidden width.
    """

    epochs: int = 400
    fine_tune_epochs: int = 100
    lr: float = 0.1
    search_space_size: int = 10_000_000
    max_final_samples: int = 20
    eps: float = 1e-7
    surrogate_epochs: int = 600
    surrogate_hidden: int = 256

    def __post_init__(self) -> None:
        if self.epochs < 1 or not 0 <= self.fine_tune_epochs <= self.epochs:
            raise ValueError(
                f"need epochs >= 1 and 0 <= fine_tune_epochs <= epochs, got "
                f"{self.epochs}, {self.fine_tune_epochs}"
            )
        if self.lr <= 0 or not 0 < self.eps < 0.5:
            raise ValueError(f"need lr > 0 and 0 < eps < 0.5, got {self.lr}, {self.eps}")
        if self.search_space_size < 1 or self.max_final_samples < 1:
            raise ValueError("search_space_size and max_final_samples must be >= 1")
        if self.surrogate_epochs < 1 or self.surrogate_hidden < 1:
            raise ValueError("surrogate_epochs and surrogate_hidden must be >= 1")


def pair_keys(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Sorted unique keys i·N + j (i < j) of the undirected pairs in `edge_index`, self loops
    dropped."""
    row, col = edge_index.long().cpu()
    low, high = torch.minimum(row, col), torch.maximum(row, col)
    keep = low != high
    return torch.unique(low[keep] * num_nodes + high[keep])


def linear_to_pairs(linear: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows and columns (i < j) of positions `linear` in the row-major strict upper triangle of
    an (n, n) matrix (position 0 is (0, 1), position n − 2 is (0, n − 1), then row 1, ...)."""
    i = torch.arange(n, dtype=torch.long, device=linear.device)
    offsets = i * (2 * n - i - 1) // 2  # pairs before row i
    row = torch.searchsorted(offsets, linear, right=True) - 1
    return row, linear - offsets[row] + row + 1


def train_surrogate(
    graph: GraphData,
    *,
    hidden: int = 256,
    epochs: int = 600,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> GCN:
    """The attack's surrogate: a 2-layer GCN (dropout 0, weight decay 5e-4, lr 0.01) trained on
    `graph`'s training nodes with best-validation selection, in eval mode."""
    device = torch.device(device)
    torch.manual_seed(seed)
    model = GCN(graph.x.shape[1], hidden, num_classes(graph), dropout=0.0).to(device)
    train = Split.of(graph, graph.train_mask).to(device)
    fit(
        model,
        train.x,
        train.structure,
        train.y,
        train_index=train.index,
        val=Split.of(graph, graph.val_mask).to(device),
        epochs=epochs,
    )
    return model.eval()


def tanh_margin_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """mean over nodes of tanh(best other logit − logit of the label) (higher = more wrong)."""
    true = logits.gather(1, labels[:, None]).squeeze(1)
    others = logits.scatter(1, labels[:, None], float("-inf")).amax(1)
    return torch.tanh(others - true).mean()


def project_to_budget(weights: torch.Tensor, budget: int, eps: float) -> torch.Tensor:
    """The weights clamped to [eps, 1 − eps] after subtracting the shift μ ≥ 0 that brings
    Σ clamp(w − μ, 0, 1) down to `budget` (no shift when already within it)."""
    if weights.clamp(0, 1).sum() > budget:
        low, high = float(weights.min()) - 1, float(weights.max())
        for _ in range(64):  # the bracket halves each step: 64 steps reach float precision
            mid = (low + high) / 2
            if (weights - mid).clamp(0, 1).sum() > budget:
                low = mid
            else:
                high = mid
        weights = weights - high  # the side of the bracket that is within the budget
    return weights.clamp(eps, 1 - eps)


class PRBCD:
    """The attack on one graph (see the module docstring). `attack(budget)` returns the flipped
    pairs as keys i·N + j (i < j)."""

    def __init__(
        self,
        graph: GraphData,
        surrogate: torch.nn.Module,
        config: PRBCDConfig,
        *,
        generator: torch.Generator,
        device: torch.device,
    ) -> None:
        self.n, self.config = graph.num_nodes, config
        self.generator, self.device = generator, device
        self.num_pairs = self.n * (self.n - 1) // 2
        self.model = surrogate.eval()
        self.x = graph.x.to(device)
        self.clean_keys = pair_keys(graph.edge_index, self.n)
        row, col = self.clean_keys // self.n, self.clean_keys % self.n
        both = torch.cat([torch.stack([row, col]), torch.stack([col, row])], 1)
        self.clean_index = both.to(device)
        with torch.no_grad():
            ones = torch.ones(self.clean_index.shape[1], device=device)
            predicted = self.model(self.x, Structure(self.n, self.clean_index, ones)).argmax(1)
        labels = predicted.clone()
        labels[graph.train_mask.to(device)] = graph.y.to(device)[graph.train_mask.to(device)]
        self.labels = labels
        self.val_index = graph.val_mask.nonzero().flatten().to(device)

    def _layout(self, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The edge index of the clean edges followed by the block's pairs (both directions),
        and each block pair's sign: +1 on a non-edge (p adds it), −1 on an edge (p removes it)."""
        row, col = linear_to_pairs(block, self.n)
        existing = torch.isin(row * self.n + col, self.clean_keys.to(self.device))
        index = torch.cat([self.clean_index, torch.stack([row, col]), torch.stack([col, row])], 1)
        return index, 1.0 - 2.0 * existing.float()

    def _structure(
        self, layout: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor
    ) -> Structure:
        index, sign = layout
        delta = weights * sign
        ones = torch.ones(self.clean_index.shape[1], device=self.device)
        values = torch.cat([ones, delta, delta])
        return Structure(self.n, index, values)  # a fresh Structure: nothing cached across steps

    def _random_block(self, size: int) -> torch.Tensor:
        if size >= self.num_pairs:
            return torch.arange(self.num_pairs, device=self.device)
        draws = torch.randint(self.num_pairs, (size,), generator=self.generator)
        return torch.unique(draws).to(self.device)

    def _resample(
        self, block: torch.Tensor, weights: torch.Tensor, budget: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.argsort(weights)
        drop = max(int((weights <= self.config.eps).sum()), block.numel() // 2)
        kept, kept_weights = block[order[drop:]], weights[order[drop:]]
        for _ in range(self.config.max_final_samples):
            fresh = self._random_block(self.config.search_space_size - kept.numel())
            merged, inverse = torch.unique(torch.cat([kept, fresh]), return_inverse=True)
            new_weights = torch.full(merged.shape, self.config.eps, device=self.device)
            new_weights[inverse[: kept.numel()]] = kept_weights
            if merged.numel() > budget:
                return merged, new_weights
        raise RuntimeError("PRBCD could not draw a block larger than the budget; lower the rate")

    def _loss(self, structure: Structure) -> torch.Tensor:
        return tanh_margin_loss(self.model(self.x, structure), self.labels)

    def attack(self, budget: int) -> torch.Tensor:
        cfg = self.config
        if budget > self.num_pairs:
            raise ValueError(f"budget {budget} exceeds the {self.num_pairs} node pairs")
        block = self._random_block(min(cfg.search_space_size, self.num_pairs))
        if block.numel() < budget:
            raise ValueError(
                f"a block of {block.numel()} pairs cannot hold budget {budget}; "
                f"raise search_space_size"
            )
        weights = torch.full(block.shape, cfg.eps, device=self.device)
        layout = self._layout(block)
        for epoch in range(cfg.epochs):
            weights.requires_grad_(True)
            loss = self._loss(self._structure(layout, weights))
            (gradient,) = torch.autograd.grad(loss, weights)
            with torch.no_grad():
                weights = weights + cfg.lr * gradient / (gradient.abs() + 1e-8)
                weights = project_to_budget(weights.clamp_min(cfg.eps), budget, cfg.eps)
                if epoch < cfg.epochs - cfg.fine_tune_epochs - 1 and block.numel() < self.num_pairs:
                    block, weights = self._resample(block, weights, budget)
                    layout = self._layout(block)
            if epoch % 50 == 0:
                logger.debug("PRBCD epoch %d: tanh-margin loss %.4f", epoch, loss.item())
        return self._sample_final(block, weights.detach(), budget)

    @torch.no_grad()
    def _sample_final(
        self, block: torch.Tensor, weights: torch.Tensor, budget: int
    ) -> torch.Tensor:
        weights = torch.where(weights <= self.config.eps, torch.zeros_like(weights), weights)
        layout = self._layout(block)
        best_loss, best = -float("inf"), None
        for i in range(self.config.max_final_samples):
            if i == 0:
                positive = int((weights > 0).sum())
                chosen = torch.zeros_like(weights)
                chosen[torch.topk(weights, min(budget, positive)).indices] = 1
            else:
                chosen = torch.bernoulli(weights.cpu(), generator=self.generator).to(self.device)
                if chosen.sum() > budget:
                    continue
            logits = self.model(self.x, self._structure(layout, chosen))
            loss = torch.nn.functional.cross_entropy(
                logits[self.val_index], self.labels[self.val_index]
            ).item()
            if loss > best_loss:
                best_loss, best = loss, chosen
        row, col = linear_to_pairs(block[best.bool()], self.n)
        return torch.sort((row * self.n + col).cpu()).values


def flip_pairs(graph: GraphData, keys: torch.Tensor) -> GraphData:
    """`graph` with the undirected pairs `keys` (i·N + j, i < j) flipped: existing edges removed
    (both directions), missing ones added in both directions with weight 1. Self loops and the
    weights of untouched edges are kept."""
    n = graph.num_nodes
    keys = torch.as_tensor(keys, dtype=torch.long).cpu()
    row, col = graph.edge_index.long().cpu()
    edge_keys = torch.minimum(row, col) * n + torch.maximum(row, col)
    existing = pair_keys(graph.edge_index, n)
    removed = keys[torch.isin(keys, existing)]
    added = keys[~torch.isin(keys, existing)]
    keep = ~(torch.isin(edge_keys, removed) & (row != col))
    a, b = added // n, added % n
    edge_index = torch.cat(
        [graph.edge_index.cpu()[:, keep], torch.stack([a, b]), torch.stack([b, a])], 1
    )
    weight = graph.edge_weight
    if weight is not None:
        weight = torch.cat([weight.cpu()[keep], torch.ones(2 * added.numel(), dtype=weight.dtype)])
    return graph.clone(edge_index=edge_index, edge_weight=weight)


def prbcd_attack(
    graph: GraphData,
    rate: float,
    *,
    seed: int = 0,
    surrogate: torch.nn.Module | None = None,
    config: PRBCDConfig | None = None,
    train_only: torch.Tensor | None = None,
    device: str | torch.device = "cpu",
) -> GraphData:
    """`graph` attacked by PRBCD with budget int(rate · undirected edges) flips.

    Args:
        graph: the clean graph with its split (the surrogate trains on its training nodes).
        rate: the budget as a fraction of the undirected edges (GraphSlim's ptb_r), > 0.
        seed: seeds the surrogate's initialisation and the attack's sampling.
        surrogate: an already trained model to attack (`model(x, structure)`); a new
            `train_surrogate(graph)` when None.
        config: the schedule (`PRBCDConfig()`, GraphSlim's, when None).
        train_only: a (N,) bool mask; when given, only flips between two of its nodes are kept
            (GraphSlim's inductive setting attacks the whole graph and then keeps the subgraph
            induced by the training nodes).
        device: where to compute.

    Returns:
        A copy of `graph` with the flipped pairs applied symmetrically.

    Example:
        >>> attacked = prbcd_attack(graph, 0.25, config=PRBCDConfig(epochs=50))  # doctest: +SKIP
    """
    graph = check_graph(graph)
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    config = config or PRBCDConfig()
    device = torch.device(device)
    budget = int(rate * pair_keys(graph.edge_index, graph.num_nodes).numel())
    if budget == 0:
        return graph.clone()
    if surrogate is None:
        surrogate = train_surrogate(
            graph,
            hidden=config.surrogate_hidden,
            epochs=config.surrogate_epochs,
            seed=seed,
            device=device,
        )
    generator = torch.Generator().manual_seed(seed)
    keys = PRBCD(graph, surrogate, config, generator=generator, device=device).attack(budget)
    if train_only is not None:
        members = np.flatnonzero(train_only.cpu().numpy())
        n = graph.num_nodes
        inside = np.isin((keys // n).numpy(), members) & np.isin((keys % n).numpy(), members)
        keys = keys[torch.from_numpy(inside)]
    return flip_pairs(graph, keys)
