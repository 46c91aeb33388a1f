"""The QCS solver: projected policy-gradient descent on the two-level Bernoulli relaxation.

Each outer step draws ``K`` coresets from the current policy (:mod:`qcs.policy`), trains the
LoRA adapters from the same initial state on each drawn, token-weighted coreset for
``inner.steps`` Adam steps (the same minibatch seed for all ``K``: common random numbers),
scores each by the validation loss, and moves ``s`` and ``π`` by Adam (or plain SGD) along the
hierarchical policy gradient; then ``s`` is projected onto the sequence budget
``{Σ s = k, s ∈ [δ, 1 − δ]}`` and each ``π_i`` onto its token ratio ``{Σ_t π_it = ρ T_i}``.
The final coreset is the ``k`` sequences of highest ``s``; in each, the ``round(ρ T_i)`` tokens
of highest ``π`` get weight ``1 − ε`` and the rest ``ε``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from qcs.lm import ResponseScorer
from qcs.policy import BASELINES, elastic_weights, hierarchical_gradient, project_budget
from qcs.policy import sample_policy as draw_policy
from qcs.selection import Selection, budget_count, seeded
from qcs.train import TrainConfig, finetune, load_lora_state, lora_state

__all__ = ["OPTIMIZERS", "QCSConfig", "run_qcs"]

# the paper states projected SGD; Adam (the default) follows the estimate's scale, which varies
# by orders of magnitude with the range of validation losses, where SGD's step must be retuned
OPTIMIZERS = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}

logger = logging.getLogger(__name__)


def _fraction(name: str, value, low_open: bool, high_open: bool, low=0.0, high=1.0) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    ok = ok and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")


@dataclass(frozen=True)
class QCSConfig:
    """Settings of :func:`run_qcs`.

    Attributes:
        budget: the sequence budget, a fraction of the pool in ``(0, 1]`` (the paper: 5%).
        token_ratio: ``ρ``, the share of each selected response's tokens kept at weight
            ``1 − ε`` (the paper: 0.5).
        epsilon: ``ε`` in ``[0, 0.5)``: the elastic token weights are ``{ε, 1 − ε}`` (the
            paper: 0.1).
        token_level: learn token weights; ``False`` is QCS at the sequence level only.
        outer_steps: policy updates.
        samples: ``K``, coresets drawn per update.
        optimizer: ``"adam"`` or ``"sgd"`` (plain projected SGD, as the paper states) on ``s``
            and ``π``, each step followed by the projections.
        lr: its learning rate on ``s``; ``token_lr``: on ``π``.
        baseline: the score-function baseline (``leave_one_out``, ``mean``, ``none``).
        inner: the LoRA training of each drawn coreset.
        clip: probabilities stay in ``[clip, 1 − clip]`` (the score needs ``0 < p < 1``).
    """

    budget: float = 0.05
    token_ratio: float = 0.5
    epsilon: float = 0.1
    token_level: bool = True
    outer_steps: int = 50
    samples: int = 4
    lr: float = 0.05
    token_lr: float = 0.05
    optimizer: str = "adam"
    baseline: str = "leave_one_out"
    inner: TrainConfig = field(default_factory=lambda: TrainConfig(steps=4, batch_size=16))
    clip: float = 1e-3

    def __post_init__(self) -> None:
        _fraction("budget", self.budget, low_open=True, high_open=False)
        _fraction("token_ratio", self.token_ratio, low_open=True, high_open=False)
        _fraction("epsilon", self.epsilon, low_open=False, high_open=True, high=0.5)
        _fraction("clip", self.clip, low_open=True, high_open=True, high=0.5)
        for name in ("outer_steps", "samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("lr", "token_lr"):
            _fraction(name, getattr(self, name), low_open=True, high_open=True, high=math.inf)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {tuple(OPTIMIZERS)}, got {self.optimizer!r}"
            )
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        if self.baseline == "leave_one_out" and self.samples < 2:
            raise ValueError("the leave-one-out baseline needs samples >= 2")
        if not isinstance(self.inner, TrainConfig):
            raise TypeError("inner must be a TrainConfig")


def _token_targets(lengths: torch.Tensor, ratio: float) -> list[int]:
    return [max(1, round(ratio * int(n))) for n in lengths]


def _feasible(total: float, count: int, low: float, high: float) -> float:
    """The projection's sum: a target the box cannot reach (every token kept, the whole pool)
    is held at the box's bound; the final rounding still takes the integer target."""
    return min(max(total, count * low), count * high)


def run_qcs(
    pool: ResponseScorer,
    validation: ResponseScorer,
    config: QCSConfig = QCSConfig(),
    *,
    seed: int = 0,
    progress: bool | None = False,
) -> Selection:
    """Learn a coreset of ``pool.data`` that minimises the validation loss (see the module
    docstring). ``pool`` and ``validation`` must score with the same (peft) model, whose
    adapters are restored to their initial state on return.
    """
    if pool.model is not validation.model:
        raise ValueError("pool and validation scorers must share one model")
    start = time.perf_counter()
    n = len(pool.data)
    k = budget_count(config.budget, n)
    lengths = pool.data.response_lengths
    lo, hi = config.clip, 1 - config.clip
    k_box = _feasible(k, n, lo, hi)
    s = project_budget(torch.full((n,), k / n, dtype=torch.float64), k_box, lo, hi)
    targets = _token_targets(lengths, config.token_ratio)
    pi = None
    if config.token_level:
        pi = [torch.full((int(t),), min(max(target / int(t), lo), hi), dtype=torch.float64)
              for t, target in zip(lengths, targets, strict=True)]  # fmt: skip
    s_param = torch.nn.Parameter(s)
    optimizer = OPTIMIZERS[config.optimizer]
    optim_s = optimizer([s_param], lr=config.lr)
    pi_params = None if pi is None else [torch.nn.Parameter(p) for p in pi]
    optim_pi = None if pi_params is None else optimizer(pi_params, lr=config.token_lr)
    token_boxes = [_feasible(t, int(n), lo, hi) for t, n in zip(targets, lengths, strict=True)]
    generator = seeded(seed, "qcs-draws")
    initial = lora_state(pool.model)
    untrained = validation.mean_loss()
    trace = []
    try:
        for step in tqdm(range(config.outer_steps), disable=None if progress is None else
                         not progress, desc="QCS", mininterval=5):  # fmt: skip
            s_now = s_param.detach()
            pi_now = None if pi_params is None else [p.detach() for p in pi_params]
            draws = [draw_policy(s_now, pi_now, generator) for _ in range(config.samples)]
            values = []
            for draw in draws:
                chosen = draw.selected()
                if chosen.numel() == 0:  # nothing drawn: the adapters stay at their start
                    values.append(untrained)
                    continue
                weights = elastic_weights(draw.z if pi_now is not None else None, lengths,
                                          config.epsilon)  # fmt: skip
                load_lora_state(pool.model, initial)
                finetune(pool, chosen, config.inner, token_weights=weights, seed=seed + step)
                values.append(validation.mean_loss())
            value_tensor = torch.tensor(values, dtype=torch.float64)
            grad_s, grad_pi = hierarchical_gradient(value_tensor, draws, s_now, pi_now,
                                                    config.baseline)  # fmt: skip
            s_param.grad = grad_s
            optim_s.step()
            with torch.no_grad():
                s_param.copy_(project_budget(s_param, k_box, lo, hi))
            if optim_pi is not None:
                for param, grad in zip(pi_params, grad_pi, strict=True):
                    param.grad = grad
                optim_pi.step()
                with torch.no_grad():
                    for param, target in zip(pi_params, token_boxes, strict=True):
                        param.copy_(project_budget(param, target, lo, hi))
            trace.append({"step": step, "mean_val_loss": float(value_tensor.mean()),
                          "min_val_loss": float(value_tensor.min()),
                          "expected_size": float(s_param.detach().sum())})  # fmt: skip
            logger.debug("QCS step %d: %s", step, trace[-1])
    finally:
        load_lora_state(pool.model, initial)
    probabilities = s_param.detach()
    order = torch.argsort(probabilities, descending=True, stable=True)
    indices = torch.sort(order[:k]).values
    token_weights = None
    if pi_params is not None:
        token_weights = {}
        for i in indices.tolist():
            p = pi_params[i].detach()
            keep = torch.argsort(p, descending=True, stable=True)[: targets[i]]
            w = torch.full_like(p, config.epsilon, dtype=torch.float32)
            w[keep] = 1 - config.epsilon
            token_weights[i] = w
    settings = asdict(config) | {"seed": seed, "untrained_val_loss": untrained}
    return Selection(
        method="qcs" if config.token_level else "qcs-seq", indices=indices, scores=probabilities,
        budget=config.budget, token_weights=token_weights, trace=trace, settings=settings,
        seconds=time.perf_counter() - start,
    )  # fmt: skip
