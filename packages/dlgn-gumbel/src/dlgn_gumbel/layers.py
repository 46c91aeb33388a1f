"""Logic layers, GroupSum, thermometer encoding and the full logic gate network.

A :class:`LogicLayer` neuron reads two fixed inputs ``(a, b)`` and holds 16 logits, one per
two-input Boolean function (order in :mod:`dlgn_gumbel.gates`). In training mode its output is the
gate mixture weighted by

* ``relaxation="softmax"``: ``softmax(w)`` (difflogic, Petersen et al. 2022);
* ``relaxation="gumbel"``: the hard one-hot ``one_hot(argmax(w + g))`` in the forward pass, with
  the gradient of ``softmax((w + g) / gumbel_tau)`` (straight-through), where ``g ~ Gumbel(0, 1)``
  is drawn once per neuron per forward pass and shared across the batch (Yousefi et al. 2025), or,
  with ``noise="per_example"``, drawn independently for every example and neuron;
* ``relaxation="dirichlet"``: a soft mixture weighted by a reparameterised sample of
  ``Dirichlet(softplus(w))`` (the third mode of the authors' later code).

In eval mode every neuron is its argmax gate, so Boolean inputs give exactly Boolean outputs.

Logits start ``N(0, 1)`` (``init="randn"``, difflogic and the paper's published code) or at
``init_sigma`` on the pass-through gate ``A`` and 0 elsewhere (``init="residual"``, the authors'
later code), so that a deep network starts close to passing its inputs through.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from dlgn_gumbel.choices import (
    CONNECTIONS,
    INITS,
    LAYOUTS,
    NOISES,
    RELAXATIONS,
    Connections,
    Init,
    Layout,
    Noise,
    Relaxation,
    check_choice,
)
from dlgn_gumbel.gates import gate_coefficients
from dlgn_gumbel.ops import check_index_range, logic_layer
from kernels_common.backend import Backend

__all__ = [
    "GroupSum",
    "LogicLayer",
    "LogicNet",
    "LogicNetConfig",
    "ThermometerEncoder",
    "difflogic_connections",
    "make_connections",
]

RESIDUAL_GATE = 3  # "A": the residual init's pass-through gate (difflogic's order)


def _check_noise(noise: str, relaxation: str) -> None:
    if noise == "per_example" and relaxation == "softmax":
        raise ValueError(
            "noise='per_example' needs a stochastic relaxation ('gumbel' or 'dirichlet'); the "
            "softmax relaxation draws no noise"
        )


def make_connections(
    in_dim: int, out_dim: int, kind: str, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Input indices ``(idx_a, idx_b)``, each ``(out_dim,)`` int64, of a layer's neurons.

    ``"random"`` is difflogic's scheme: ``2·out_dim`` slots filled with ``randperm % in_dim``
    through a random relabelling of the inputs (every input used when ``2·out_dim >= in_dim``).
    ``"unique"`` additionally guarantees ``a != b`` in every neuron and no two neurons reading the
    same unordered pair (while ``in_dim·(in_dim−1)/2 >= out_dim``); it needs ``2·out_dim >= in_dim``
    so that every input is read. ``"difflogic"`` is difflogic's own ``"unique"`` construction, the
    one the paper's code uses (see :func:`difflogic_connections`).
    """
    check_choice("connections", kind, CONNECTIONS)
    if kind == "difflogic":
        return difflogic_connections(in_dim, out_dim, generator)
    slots = torch.randperm(2 * out_dim, generator=generator) % in_dim
    slots = torch.randperm(in_dim, generator=generator)[slots]
    idx_a, idx_b = slots[:out_dim].clone(), slots[out_dim:].clone()
    if kind == "random":
        return idx_a, idx_b
    if 2 * out_dim < in_dim:
        raise ValueError(
            f"connections='unique' needs out_dim * 2 >= in_dim so every input is read; got "
            f"in_dim={in_dim}, out_dim={out_dim} (use connections='random' or a wider layer)"
        )
    if in_dim < 2:
        raise ValueError(f"connections='unique' needs in_dim >= 2, got {in_dim}")
    _make_pairs_unique(idx_a, idx_b, in_dim, generator)
    return idx_a, idx_b


def _make_pairs_unique(
    idx_a: torch.Tensor, idx_b: torch.Tensor, in_dim: int, generator: torch.Generator
) -> None:
    """Swap ``idx_b`` entries between neurons (keeping every input's use count) until no neuron has
    ``a == b`` and no unordered pair repeats; pairs may repeat only when there are too few."""
    n = idx_a.shape[0]
    allow_repeats = in_dim * (in_dim - 1) // 2 < n
    a, b = idx_a.tolist(), idx_b.tolist()
    counts: dict[tuple[int, int], int] = {}
    for i in range(n):
        key = (min(a[i], b[i]), max(a[i], b[i]))
        counts[key] = counts.get(key, 0) + 1

    def bad(i: int) -> bool:
        key = (min(a[i], b[i]), max(a[i], b[i]))
        return a[i] == b[i] or (not allow_repeats and counts[key] > 1)

    def move(i: int, new_b: int, delta: int) -> None:
        key = (min(a[i], new_b), max(a[i], new_b))
        counts[key] = counts.get(key, 0) + delta

    pending = [i for i in range(n) if bad(i)]
    draws = torch.randint(0, n, (64 * n + 1024,), generator=generator).tolist()
    for j in draws:
        pending = [i for i in pending if bad(i)]
        if not pending:
            break
        i = pending[-1]
        move(i, b[i], -1)
        move(j, b[j], -1)
        b[i], b[j] = b[j], b[i]
        move(i, b[i], +1)
        move(j, b[j], +1)
        if bad(i) or bad(j):  # undo a swap that does not help
            move(i, b[i], -1)
            move(j, b[j], -1)
            b[i], b[j] = b[j], b[i]
            move(i, b[i], +1)
            move(j, b[j], +1)
    if any(bad(i) for i in range(n)):
        raise RuntimeError("could not draw unique connections; use connections='random'")
    idx_b.copy_(torch.tensor(b, dtype=idx_b.dtype))


def difflogic_connections(
    in_dim: int, out_dim: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """difflogic's ``"unique"`` connections (also those of the paper's code): the input pairs
    ``(0, 1), (2, 3), ...``, then ``(1, 2), (3, 4), ...``, then every ``(i, i + d)`` for offsets
    ``d = 2, 3, ...`` in turn, cut at ``out_dim`` pairs and handed to the neurons in a random order.

    Deterministic pairs mean neighbouring inputs (with a threshold-major thermometer code, the same
    threshold of neighbouring pixels) meet first. Needs ``2·out_dim >= in_dim`` (every input read)
    and at most ``in_dim·(in_dim−1)/2`` neurons (every pair used once).
    """
    if 2 * out_dim < in_dim:
        raise ValueError(
            f"connections='difflogic' needs out_dim * 2 >= in_dim so every input is read; got "
            f"in_dim={in_dim}, out_dim={out_dim}"
        )
    if out_dim > in_dim * (in_dim - 1) // 2:
        raise ValueError(
            f"connections='difflogic' pairs each two inputs at most once: out_dim={out_dim} "
            f"exceeds the {in_dim * (in_dim - 1) // 2} pairs of in_dim={in_dim}"
        )
    x = torch.arange(in_dim)
    n0 = in_dim // 2  # (0, 1), (2, 3), ...
    n1 = (in_dim - 1) // 2  # (1, 2), (3, 4), ...
    firsts, seconds = [x[0 : 2 * n0 : 2], x[1 : 2 * n1 + 1 : 2]], [x[1 : 2 * n0 : 2]]
    seconds.append(x[2 : 2 * n1 + 2 : 2])
    count, offset = n0 + n1, 2
    while count < out_dim:  # offsets 2, 3, ...: every (i, i + offset)
        firsts.append(x[: in_dim - offset])
        seconds.append(x[offset:])
        count += in_dim - offset
        offset += 1
    order = torch.randperm(out_dim, generator=generator)
    idx_a = torch.cat(firsts)[:out_dim][order]
    idx_b = torch.cat(seconds)[:out_dim][order]
    return idx_a.contiguous(), idx_b.contiguous()


class _GradFactor(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``factor`` (difflogic's ``grad_factor``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def _sample_gumbel(shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) samples ``-log(-log(U))``, ``U ~ U(0, 1)`` (clamped away from 0, so every
    sample is finite; ``torch.rand`` never returns 1). 10x faster on a CPU than
    ``exponential_``."""
    u = torch.rand(shape, device=like.device, dtype=like.dtype)
    return u.clamp_(min=torch.finfo(like.dtype).tiny).log_().neg_().log_().neg_()


class LogicLayer(nn.Module):
    """One layer of ``out_dim`` two-input logic-gate neurons.

    Args:
        in_dim: width of the input.
        out_dim: number of neurons.
        connections: ``"random"``, ``"unique"`` or ``"difflogic"`` (see
            :func:`make_connections`).
        relaxation: ``"softmax"``, ``"gumbel"`` or ``"dirichlet"``.
        gumbel_tau: temperature of the Gumbel-softmax gradient (the paper uses 1).
        grad_factor: multiplies the gradient flowing to the layer's input (difflogic; ~2 helps
            deep nets).
        init: ``"randn"`` (logits ``N(0, 1)``) or ``"residual"`` (``init_sigma`` on gate ``A``,
            0 on the other 15).
        init_sigma: the residual init's logit of gate ``A`` (5.0 in the authors' code).
        noise: ``"shared"`` (one draw per neuron per forward pass, as the paper) or
            ``"per_example"`` (one draw per neuron and example) for the stochastic relaxations;
            the softmax relaxation has no noise.
        seed: seeds the connections and the N(0, 1) logits; ``None`` uses torch's global RNG.
        backend: logic-layer backend (``None``/``"auto"``, ``"reference"``, ``"triton"``,
            ``"interpreter"``).

    Shapes: input ``(B, in_dim)`` float32 in ``[0, 1]`` -> output ``(B, out_dim)`` float32.

    Example:
        >>> layer = LogicLayer(6, 4, seed=0, backend="reference").eval()
        >>> layer(torch.randint(0, 2, (3, 6)).float()).shape
        torch.Size([3, 4])
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        connections: Connections = "random",
        relaxation: Relaxation = "softmax",
        gumbel_tau: float = 1.0,
        grad_factor: float = 1.0,
        init: Init = "randn",
        init_sigma: float = 5.0,
        noise: Noise = "shared",
        seed: int | None = None,
        backend: str | Backend | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_dim", in_dim), ("out_dim", out_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        check_choice("relaxation", relaxation, RELAXATIONS)
        check_choice("init", init, INITS)
        check_choice("noise", noise, NOISES)
        if not gumbel_tau > 0:
            raise ValueError(f"gumbel_tau must be > 0, got {gumbel_tau}")
        if not grad_factor > 0:
            raise ValueError(f"grad_factor must be > 0, got {grad_factor}")
        if not math.isfinite(init_sigma):
            raise ValueError(f"init_sigma must be finite, got {init_sigma}")
        _check_noise(noise, relaxation)
        self.in_dim, self.out_dim = in_dim, out_dim
        self.connections, self.relaxation = connections, relaxation
        self.gumbel_tau, self.grad_factor = float(gumbel_tau), float(grad_factor)
        self.init, self.init_sigma, self.noise = init, float(init_sigma), noise
        self.backend = backend
        generator = torch.Generator()
        generator.manual_seed(seed if seed is not None else int(torch.randint(2**62, ()).item()))
        idx_a, idx_b = make_connections(in_dim, out_dim, connections, generator)
        self.register_buffer("idx_a", idx_a)
        self.register_buffer("idx_b", idx_b)
        if init == "randn":
            weights = torch.randn(out_dim, 16, generator=generator)
        else:  # the authors' "resid": zeros, sigma on the pass-through gate A
            weights = torch.zeros(out_dim, 16)
            weights[:, RESIDUAL_GATE] = self.init_sigma
        self.weights = nn.Parameter(weights)

    def gate_weights(self, batch: int | None = None) -> torch.Tensor:
        """Weights of the gates in this forward pass (mode-dependent): ``(out_dim, 16)``, or
        ``(out_dim, batch, 16)`` for a stochastic relaxation with ``noise="per_example"`` in
        training mode (then ``batch`` is required)."""
        w = self.weights
        if not self.training:
            return nn.functional.one_hot(w.argmax(1), 16).to(w.dtype)
        if self.relaxation == "softmax":
            return torch.softmax(w, dim=1)
        if self.noise == "per_example":
            if batch is None:
                raise ValueError("noise='per_example' needs the batch size")
            w = w[:, None, :].expand(w.shape[0], batch, 16)
        if self.relaxation == "dirichlet":
            alpha = nn.functional.softplus(w)
            return torch.distributions.Dirichlet(alpha).rsample()
        perturbed = w + _sample_gumbel(w.shape, w)
        soft = torch.softmax(perturbed / self.gumbel_tau, dim=-1)
        hard = nn.functional.one_hot(perturbed.argmax(-1), 16).to(w.dtype)
        # forward value: exactly `hard` (soft - soft is exactly 0); gradient: that of `soft`
        return hard + (soft - soft.detach())

    def gate_distribution(self) -> torch.Tensor:
        """``(out_dim, 16)`` probabilities of each neuron's gates under its logits, without
        noise: ``softmax(w)`` for the softmax and Gumbel relaxations (for Gumbel, exactly the
        distribution of the sampled gate ``argmax(w + g)``), the mean ``softplus(w) / sum`` of
        the Dirichlet relaxation's samples."""
        w = self.weights
        if self.relaxation == "dirichlet":
            alpha = nn.functional.softplus(w)
            return alpha / alpha.sum(1, keepdim=True)
        return torch.softmax(w, dim=1)

    def gates(self) -> torch.Tensor:
        """``(out_dim,)`` int64 argmax gate of each neuron (the discretized network)."""
        return self.weights.detach().argmax(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_dim:
            raise ValueError(
                f"LogicLayer expects input of shape (batch, {self.in_dim}), got {tuple(x.shape)}"
            )
        return self.forward_features(x.t().contiguous()).t()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The layer on feature-major activations: ``(in_dim, B)`` -> ``(out_dim, B)``."""
        if self.training and self.grad_factor != 1.0:
            x = _GradFactor.apply(x, self.grad_factor)
        coeffs = gate_coefficients(self.gate_weights(x.shape[1]))
        if coeffs.dim() == 3:  # per-example gates (N, B, 4) -> (N, 4, B), batch contiguous
            coeffs = coeffs.transpose(1, 2).contiguous()
        # the indices were checked when built or loaded: no per-call device synchronisation
        return logic_layer(
            x, self.idx_a, self.idx_b, coeffs, backend=self.backend, check_indices=False
        )

    def _load_from_state_dict(self, state_dict, prefix, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        for name in ("idx_a", "idx_b"):
            check_index_range(f"{prefix}{name}", getattr(self, name), self.in_dim)

    def extra_repr(self) -> str:
        return (
            f"in_dim={self.in_dim}, out_dim={self.out_dim}, connections={self.connections!r}, "
            f"relaxation={self.relaxation!r}, gumbel_tau={self.gumbel_tau}, init={self.init!r}, "
            f"noise={self.noise!r}"
        )


class GroupSum(nn.Module):
    """Split the last dimension into ``k`` equal class groups, sum each, divide by ``tau``.

    Shapes: ``(B, N)`` with ``N % k == 0`` -> ``(B, k)``.
    """

    def __init__(self, k: int, tau: float = 1.0) -> None:
        super().__init__()
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        if not tau > 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        self.k, self.tau = k, float(tau)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] % self.k:
            raise ValueError(
                f"GroupSum(k={self.k}) expects (batch, N) with N divisible by {self.k}, got "
                f"{tuple(x.shape)}"
            )
        return group_scores(x.reshape(x.shape[0], self.k, -1).sum(-1), self.tau)

    def extra_repr(self) -> str:
        return f"k={self.k}, tau={self.tau}"


def group_scores(counts: torch.Tensor, tau: float) -> torch.Tensor:
    """``counts / tau``: the one division shared by :class:`GroupSum` and the compiled network, so
    that both round identically."""
    return counts / tau


class ThermometerEncoder(nn.Module):
    """Thermometer code: each feature becomes ``[x > t_1, ..., x > t_T]`` (float 0/1).

    Args:
        thresholds: strictly increasing thresholds ``(T,)``.
        layout: ``"feature"`` (feature-major, ``out[:, f·T + j] = x_f > t_j``: a pixel's bits
            side by side) or ``"threshold"`` (threshold-major, ``out[:, j·F + f]``: one whole
            image per threshold, the paper's code's layout).

    Shapes: ``(B, *F)`` -> ``(B, prod(F) · T)``.

    Example:
        >>> ThermometerEncoder([0.25, 0.5, 0.75])(torch.tensor([[0.3, 0.9]]))
        tensor([[1., 0., 0., 1., 1., 1.]])
    """

    def __init__(
        self, thresholds: Sequence[float] | torch.Tensor, layout: Layout = "feature"
    ) -> None:
        super().__init__()
        check_choice("layout", layout, LAYOUTS)
        self.layout = layout
        t = torch.as_tensor(thresholds, dtype=torch.float32).flatten()
        if t.numel() == 0 or not torch.isfinite(t).all():
            raise ValueError("thresholds must be a non-empty sequence of finite numbers")
        if (t[1:] <= t[:-1]).any():
            raise ValueError(f"thresholds must be strictly increasing, got {t.tolist()}")
        self.register_buffer("thresholds", t)

    @classmethod
    def uniform(
        cls, num_thresholds: int, low: float = 0.0, high: float = 1.0, layout: Layout = "feature"
    ) -> ThermometerEncoder:
        """``num_thresholds`` evenly spaced thresholds strictly inside ``(low, high)``:
        ``low + (high - low)·(j + 1)/(T + 1)``, as the paper's code (``(j + 1)/32`` for 31)."""
        if num_thresholds < 1 or not high > low:
            raise ValueError(f"need num_thresholds >= 1 and high > low, got {num_thresholds}")
        steps = torch.arange(1, num_thresholds + 1, dtype=torch.float64) / (num_thresholds + 1)
        return cls((low + (high - low) * steps).float(), layout=layout)

    @property
    def num_thresholds(self) -> int:
        return self.thresholds.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 1:
            raise ValueError("ThermometerEncoder expects (batch, *features)")
        flat = x.reshape(x.shape[0], -1).float()
        if self.layout == "threshold":
            return (flat[:, None, :] > self.thresholds[:, None]).reshape(x.shape[0], -1).float()
        return (flat[:, :, None] > self.thresholds).reshape(x.shape[0], -1).float()

    def extra_repr(self) -> str:
        return f"num_thresholds={self.num_thresholds}, layout={self.layout!r}"


@dataclass(frozen=True)
class LogicNetConfig:
    """Architecture of a :class:`LogicNet` (saved with checkpoints)."""

    in_dim: int
    layer_sizes: tuple[int, ...]
    num_classes: int
    tau: float = 10.0
    connections: Connections = "random"
    relaxation: Relaxation = "softmax"
    gumbel_tau: float = 1.0
    grad_factor: float = 1.0
    seed: int | None = 0
    init: Init = "randn"
    init_sigma: float = 5.0
    noise: Noise = "shared"

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_sizes", tuple(int(s) for s in self.layer_sizes))
        if not self.layer_sizes or any(s < 1 for s in self.layer_sizes):
            raise ValueError(f"layer_sizes must be non-empty positive ints, got {self.layer_sizes}")
        if self.in_dim < 1 or self.num_classes < 1:
            raise ValueError(
                f"in_dim and num_classes must be >= 1, got {self.in_dim}, {self.num_classes}"
            )
        if self.layer_sizes[-1] % self.num_classes:
            raise ValueError(
                f"the last layer width {self.layer_sizes[-1]} must be divisible by num_classes="
                f"{self.num_classes} (GroupSum splits it into equal class groups)"
            )
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        check_choice("connections", self.connections, CONNECTIONS)
        check_choice("relaxation", self.relaxation, RELAXATIONS)
        check_choice("init", self.init, INITS)
        check_choice("noise", self.noise, NOISES)
        _check_noise(self.noise, self.relaxation)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "layer_sizes": list(self.layer_sizes)}


class LogicNet(nn.Module):
    """A stack of :class:`LogicLayer` followed by :class:`GroupSum`.

    Args mirror :class:`LogicNetConfig`; layer ``i`` is seeded with ``seed + i``.

    Shapes: ``(B, in_dim)`` float32 in ``[0, 1]`` (e.g. thermometer bits) -> ``(B, num_classes)``
    class scores (logits for cross-entropy).

    Example:
        >>> net = LogicNet(12, [16, 8], num_classes=2, tau=2.0, backend="reference")
        >>> net(torch.rand(5, 12)).shape
        torch.Size([5, 2])
    """

    def __init__(
        self,
        in_dim: int,
        layer_sizes: Sequence[int],
        num_classes: int,
        tau: float = 10.0,
        *,
        connections: Connections = "random",
        relaxation: Relaxation = "softmax",
        gumbel_tau: float = 1.0,
        grad_factor: float = 1.0,
        seed: int | None = 0,
        init: Init = "randn",
        init_sigma: float = 5.0,
        noise: Noise = "shared",
        backend: str | Backend | None = None,
    ) -> None:
        super().__init__()
        self.config = LogicNetConfig(
            in_dim,
            tuple(layer_sizes),
            num_classes,
            tau,
            connections,
            relaxation,
            gumbel_tau,
            grad_factor,
            seed,
            init,
            init_sigma,
            noise,
        )
        widths = (in_dim, *self.config.layer_sizes)
        self.layers = nn.ModuleList(
            LogicLayer(
                widths[i],
                widths[i + 1],
                connections=connections,
                relaxation=relaxation,
                gumbel_tau=gumbel_tau,
                grad_factor=grad_factor,
                init=init,
                init_sigma=init_sigma,
                noise=noise,
                seed=None if seed is None else seed + i,
                backend=backend,
            )
            for i in range(len(widths) - 1)
        )
        self.group_sum = GroupSum(num_classes, tau)

    @classmethod
    def from_config(cls, config: LogicNetConfig, **kwargs: Any) -> LogicNet:
        fields = config.to_dict()
        return cls(
            fields.pop("in_dim"),
            fields.pop("layer_sizes"),
            fields.pop("num_classes"),
            fields.pop("tau"),
            **fields,
            **kwargs,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.config.in_dim:
            raise ValueError(
                f"LogicNet expects input of shape (batch, {self.config.in_dim}), got "
                f"{tuple(x.shape)}"
            )
        h = x.t().contiguous()  # feature-major inside the network
        for layer in self.layers:
            h = layer.forward_features(h)
        return self.group_sum(h.t())
