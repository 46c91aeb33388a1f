"""NanoAdam: Adam that updates only the smallest-magnitude entries of each tensor.

Every ``mask_interval`` steps (and at the first step) each parameter tensor's update mask becomes
its ``k = ceil(density·numel)`` entries of smallest ``|θ|``, chosen without gradients. Adam's
moments exist only for the selected entries (flat ``int32`` indices, two moment ``k``-vectors
and an ``int32`` step count per selected entry: 16 bytes per entry in float32), so the optimizer
state grows with the density; there is no error feedback, gradients of unselected entries are
dropped. At a refresh, entries that stay selected keep their moments and step counts, new ones
start at zero. Bias correction uses each entry's own step count, so an entry that joins the mask
late takes Adam's first steps (``≈ lr``), not steps scaled by a tensor-wide counter (which would
give it up to ~6.5·lr with the default betas while its moments warm up).

Example:
    >>> w = torch.nn.Parameter(torch.tensor([0.1, -2.0, 0.01, 3.0]))
    >>> opt = NanoAdam([w], lr=0.1, density=0.5)
    >>> w.grad = torch.ones(4)
    >>> opt.step()
    >>> (w.detach() != torch.tensor([0.1, -2.0, 0.01, 3.0])).tolist()
    [True, False, True, False]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch.optim import Optimizer

_BIAS_STEPS = 2**17


def bottom_k_indices(values: torch.Tensor, density: float) -> torch.Tensor:
    """Sorted flat indices of the ``ceil(density·numel)`` entries of smallest ``|values|``
    (``int32`` when the tensor has fewer than 2³¹ entries, else ``int64``)."""
    k = max(1, math.ceil(density * values.numel()))
    flat = values.detach().reshape(-1).abs()
    dtype = torch.int32 if flat.numel() < 2**31 else torch.int64
    if k >= flat.numel():
        return torch.arange(flat.numel(), device=values.device, dtype=dtype)
    return torch.topk(flat, k, largest=False, sorted=False).indices.sort().values.to(dtype)


class NanoAdam(Optimizer):
    """Adam(W) restricted to the bottom-``density`` fraction of ``|θ|`` per tensor.

    Args:
        params: parameters or parameter groups.
        lr: learning rate, as ``torch.optim.AdamW``'s.
        betas: moment decay rates, as ``torch.optim.AdamW``'s.
        eps: denominator term, as ``torch.optim.AdamW``'s.
        weight_decay: decoupled weight decay, as ``torch.optim.AdamW``'s but applied to the
            selected entries only; ``weight_decay=0`` is Adam.
        density: fraction of each tensor updated (``0 < density <= 1``).
        mask_interval: steps between mask refreshes (``m``; paper ablation: 131).
        density_schedule: optional ``step -> density`` used at each refresh instead of ``density``.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        density: float = 0.1,
        mask_interval: int = 131,
        density_schedule: Callable[[int], float] | None = None,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr!r}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas!r}")
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {density!r}")
        if not isinstance(mask_interval, int) or mask_interval < 1:
            raise ValueError(f"mask_interval must be a positive integer, got {mask_interval!r}")
        if eps < 0 or weight_decay < 0:
            raise ValueError(f"eps and weight_decay must be >= 0, got {eps!r}, {weight_decay!r}")
        if density_schedule is not None and not callable(density_schedule):
            raise TypeError("density_schedule must be a callable step -> density")
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "density": density,
            "mask_interval": mask_interval,
        }
        super().__init__(params, defaults)
        self.density_schedule = density_schedule
        self.global_step = 0

    def current_density(self, group: dict) -> float:
        if self.density_schedule is None:
            return group["density"]
        density = float(self.density_schedule(self.global_step))
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density_schedule({self.global_step}) = {density}, not in (0, 1]")
        return density

    @torch.no_grad()
    def refresh_masks(self, groups: list[dict] | None = None) -> None:
        """Re-select every tensor's entries by ``|θ|`` (no gradients needed), keeping the moments
        of entries that stay selected. ``groups``: the parameter groups to refresh (default all).
        """
        for group in self.param_groups if groups is None else groups:
            density = self.current_density(group)
            for p in group["params"]:
                state = self.state[p]
                indices = bottom_k_indices(p, density)
                exp_avg = torch.zeros(len(indices), dtype=p.dtype, device=p.device)
                exp_avg_sq = torch.zeros_like(exp_avg)
                steps = torch.zeros(len(indices), dtype=torch.int32, device=p.device)
                if "indices" in state:
                    old = state["indices"]
                    position = torch.searchsorted(old, indices).clamp(max=len(old) - 1)
                    kept = old[position] == indices
                    exp_avg[kept] = state["exp_avg"][position[kept]]
                    exp_avg_sq[kept] = state["exp_avg_sq"][position[kept]]
                    steps[kept] = state["entry_steps"][position[kept]]
                state.update(
                    indices=indices, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq, entry_steps=steps
                )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        due = [  # each group refreshes on its own interval (and whenever a tensor has no mask)
            g
            for g in self.param_groups
            if self.global_step % g["mask_interval"] == 0
            or any("indices" not in self.state[p] for p in g["params"])
        ]
        if due:
            self.refresh_masks(due)
        self.global_step += 1
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            # 1 - β^t for every count t an entry can have (counts <= global_step); beyond
            # _BIAS_STEPS both corrections are 1 to double precision for any β <= 0.9995
            counts = torch.arange(min(self.global_step, _BIAS_STEPS) + 1, dtype=torch.float64)
            bias1_table = (1 - beta1**counts).float()
            bias2_sqrt_table = (1 - beta2**counts).sqrt().float()
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise TypeError("NanoAdam does not support sparse gradients")
                state = self.state[p]
                indices = state["indices"]
                state["entry_steps"] += 1
                grad = p.grad.reshape(-1).index_select(0, indices)
                state["exp_avg"].lerp_(grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                # per-entry bias correction, looked up from the group's float64 tables
                steps = state["entry_steps"]
                if self.global_step > _BIAS_STEPS:
                    steps = steps.clamp(max=_BIAS_STEPS)
                bias1 = bias1_table.to(p.device).index_select(0, steps)
                bias2_sqrt = bias2_sqrt_table.to(p.device).index_select(0, steps)
                # otherwise the same operations as torch.optim.Adam's single-tensor path
                denom = (state["exp_avg_sq"].sqrt() / bias2_sqrt).add_(group["eps"])
                update = state["exp_avg"] / denom / bias1
                flat = p.view(-1)
                if group["weight_decay"]:
                    decay = -group["lr"] * group["weight_decay"]
                    flat.index_add_(0, indices, flat.index_select(0, indices), alpha=decay)
                flat.index_add_(0, indices, update, alpha=-group["lr"])
        return loss

    def state_bytes(self) -> int:
        """Bytes held by the optimizer state tensors (indices and moments)."""
        return sum(
            t.numel() * t.element_size()
            for state in self.state.values()
            for t in state.values()
            if isinstance(t, torch.Tensor)
        )

    def moment_elements(self) -> int:
        """Number of stored first-moment entries (= number of selected entries)."""
        return sum(len(state["exp_avg"]) for state in self.state.values() if "exp_avg" in state)
