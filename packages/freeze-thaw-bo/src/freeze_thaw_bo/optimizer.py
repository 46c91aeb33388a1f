"""Ask/tell freeze-thaw optimization: trials are paused (frozen) and resumed (thawed) by epochs.

Every method (CFBO and the baselines) shares this state machine and differs only in `_choose`,
which picks the trial to thaw next and says whether the method's stopping rule fires:

    opt = CFBO(space, Utility(alpha=2**-4), budget=300, max_epochs=50)
    while True:
        trial_id, epoch = opt.ask()
        if trial_id is None:  # the stopping rule fired, or the budget is spent
            break
        value = train_one_more_epoch(opt.config(trial_id))
        opt.tell(trial_id, epoch, value)

Invariants the state machine enforces (and the tests check with hypothesis): a trial is told its
epochs in prefix order (1, 2, ... with no gaps or repeats), a finished trial (max_epochs observed)
or a pending one is never suggested, the budget is never exceeded, values are finite. Several
workers can hold suggestions at once: a suggested trial is pending until its epoch is told.

The budget is counted in epochs (each `tell` spends one unit) or, with `budget_unit="cost"`, in the
`cost` each `tell` reports (e.g. seconds); the utility's b is that spent budget.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from freeze_thaw_bo.space import SearchSpace
from freeze_thaw_bo.surrogates.base import CurveObservations
from freeze_thaw_bo.utility import Utility

__all__ = ["FreezeThawOptimizer", "Suggestion", "load_optimizer"]

BUDGET_UNITS = ("epoch", "cost")
STATE_FILE = "optimizer.json"
TENSOR_FILE = "optimizer.safetensors"
_REGISTRY: dict[str, type[FreezeThawOptimizer]] = {}


class Suggestion(NamedTuple):
    """Train `trial_id` up to `epoch` (one more epoch), or stop when `trial_id` is None."""

    trial_id: int | None
    epoch: int | None

    @property
    def stop(self) -> bool:
        return self.trial_id is None


STOP = Suggestion(None, None)


class FreezeThawOptimizer(ABC):
    """The shared ask/tell state machine over a finite pool of candidate configurations.

    Args:
        space: the search space (encodes configurations for the surrogate).
        budget: B, the total budget (epochs, or cost units with `budget_unit="cost"`).
        max_epochs: T, the most epochs one trial can be trained for.
        utility: the cost/performance trade-off; its budget must equal `budget`. Defaults to
            α = 0 (cost-blind). Baselines use it only for the stopping rule.
        candidates: the pool of configurations (e.g. a benchmark's table); by default
            `num_candidates` configurations sampled from `space` with `seed`.
        stopping: "threshold" (stop when the estimated regret reaches `threshold`, the baselines'
            rule in the paper), "beta" (CFBO's adaptive threshold) or "none".
        budget_unit: "epoch" or "cost".
        seed: seeds the candidate sample and the method's randomness.
    """

    method: ClassVar[str] = "base"
    default_stopping: ClassVar[str] = "threshold"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "method" in cls.__dict__:
            _REGISTRY[cls.method] = cls

    def __init__(
        self,
        space: SearchSpace,
        *,
        budget: float,
        max_epochs: int,
        utility: Utility | None = None,
        candidates: list[dict[str, Any]] | None = None,
        num_candidates: int = 256,
        stopping: str | None = None,
        threshold: float = 0.2,
        budget_unit: str = "epoch",
        seed: int = 0,
    ) -> None:
        if not isinstance(space, SearchSpace):
            raise TypeError(f"space must be a SearchSpace, got {type(space).__name__}")
        if not (math.isfinite(budget) and budget > 0):
            raise ValueError(f"budget must be a finite number > 0, got {budget}")
        if int(max_epochs) != max_epochs or max_epochs < 1:
            raise ValueError(f"max_epochs must be an integer >= 1, got {max_epochs}")
        if budget_unit not in BUDGET_UNITS:
            raise ValueError(f"budget_unit must be one of {BUDGET_UNITS}, got {budget_unit!r}")
        stopping = self.default_stopping if stopping is None else stopping
        if stopping not in ("threshold", "beta", "none"):
            raise ValueError(f"stopping must be 'threshold', 'beta' or 'none', got {stopping!r}")
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        utility = Utility(alpha=0.0, budget=budget) if utility is None else utility
        if not math.isclose(utility.budget, budget):
            raise ValueError(
                f"the utility's budget ({utility.budget}) differs from the optimizer's ({budget})"
            )
        self.space = space
        self.budget = float(budget)
        self.max_epochs = int(max_epochs)
        self.utility = utility
        self.stopping = stopping
        self.threshold = float(threshold)
        self.budget_unit = budget_unit
        self.seed = int(seed)
        if candidates is None:
            candidates = space.sample(num_candidates, seed=seed)
        if len(candidates) < 1:
            raise ValueError("the candidate pool is empty")
        self.candidates = [dict(c) for c in candidates]
        self.x = space.encode(self.candidates)
        self.rng = np.random.default_rng(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.values: list[list[float]] = [[] for _ in self.candidates]
        self.costs: list[list[float]] = [[] for _ in self.candidates]
        self.pending: dict[int, int] = {}
        self.history: list[tuple[int, int, float, float]] = []
        self.budget_spent = 0.0
        self.u_max = -math.inf
        self.u_min = math.inf
        self.stop_budget: float | None = None

    # ----------------------------------------------------------------------- the public API

    @property
    def num_candidates(self) -> int:
        return len(self.candidates)

    @property
    def incumbent(self) -> float:
        """The best value observed so far (−∞ before the first `tell`)."""
        return max((v for vs in self.values for v in vs), default=-math.inf)

    @property
    def best_trial(self) -> int | None:
        best = None
        for trial, vs in enumerate(self.values):
            if vs and (best is None or max(vs) > max(self.values[best])):
                best = trial
        return best

    @property
    def current_utility(self) -> float:
        """U_p = U(spent budget, incumbent)."""
        if not self.history:
            return -math.inf
        return float(self.utility(self.budget_spent, self.incumbent))

    @property
    def stopped(self) -> bool:
        """Whether the stopping rule has fired (at `stop_budget`)."""
        return self.stop_budget is not None

    def config(self, trial_id: int) -> dict[str, Any]:
        self._check_trial(trial_id)
        return dict(self.candidates[trial_id])

    def observations(self) -> CurveObservations:
        return CurveObservations(self.x, tuple(np.asarray(v) for v in self.values), self.max_epochs)

    def estimated_regret(self) -> float:
        """R̂ = (Û_max − U_p) / (Û_max − Û_min), as the authors estimate it online.

        Û_max is the best utility reached so far, Û_min = U(B, first observed value); −∞ while
        the two coincide (nothing to compare yet).
        """
        if not self.history or np.isclose(self.u_max, self.u_min):  # the authors' test
            return -math.inf
        return (self.u_max - self.current_utility) / (self.u_max - self.u_min)

    def ask(self, *, ignore_stop: bool = False) -> Suggestion:
        """The trial to train for one more epoch, or a stop signal (trial_id None).

        With `ignore_stop=True` the stopping rule is recorded in `stop_budget` but suggestions
        continue until the budget or the pool runs out (for regret-versus-budget curves).
        """
        if self.stopped and not ignore_stop:
            return STOP
        if self._committed() + self._next_cost_estimate() > self.budget + 1e-9:
            return STOP
        if not self._available().any():
            return STOP
        trial, stop = self._choose()
        if stop and self.history and self.stop_budget is None:
            self.stop_budget = self.budget_spent
        if (stop and not ignore_stop) or trial is None:
            return STOP
        if not self._available()[trial]:
            raise RuntimeError(f"{self.method} chose trial {trial}, which is finished or pending")
        epoch = len(self.values[trial]) + 1
        self.pending[trial] = epoch
        return Suggestion(int(trial), epoch)

    def tell(self, trial_id: int, epoch: int, value: float, cost: float | None = None) -> None:
        """Record `value` (higher is better, in [0, 1] for the default surrogate) after `epoch`."""
        self._check_trial(trial_id)
        expected = len(self.values[trial_id]) + 1
        if int(epoch) != epoch or epoch != expected:
            raise ValueError(
                f"trial {trial_id}: epoch {epoch} is out of order; {expected - 1} epochs are "
                f"observed, so the next one is {expected}"
            )
        if epoch > self.max_epochs:
            raise ValueError(f"trial {trial_id} is finished ({self.max_epochs} epochs)")
        if not math.isfinite(value):
            raise ValueError(f"trial {trial_id}, epoch {epoch}: value must be finite, got {value}")
        if self.budget_unit == "cost":
            if cost is None or not math.isfinite(cost) or cost < 0:
                raise ValueError(f"budget_unit='cost' needs a finite cost >= 0, got {cost}")
            spend = float(cost)
        else:
            if cost is not None and not (math.isfinite(cost) and cost >= 0):
                raise ValueError(f"cost must be finite and >= 0, got {cost}")
            spend = 1.0
        if self.budget_spent + spend > self.budget + 1e-9:
            raise ValueError(
                f"this observation would spend {self.budget_spent + spend:g} of a budget of "
                f"{self.budget:g}"
            )
        self.pending.pop(trial_id, None)
        self.values[trial_id].append(float(value))
        self.costs[trial_id].append(spend if cost is None else float(cost))
        self.budget_spent += spend
        self.history.append((int(trial_id), int(epoch), float(value), spend))
        if len(self.history) == 1:
            self.u_min = float(self.utility(self.budget, float(value)))
        self.u_max = max(self.u_max, self.current_utility)

    # ----------------------------------------------------------------------- for subclasses

    @abstractmethod
    def _choose(self) -> tuple[int | None, bool]:
        """(trial to thaw among `self._available()`, whether the stopping rule fires)."""

    def settings(self) -> dict[str, Any]:
        """The method's own constructor arguments (JSON-able), saved with the state."""
        return {}

    def extra_state(self) -> dict[str, Any]:
        """Method state beyond the observations (JSON-able), saved and restored with them."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what `extra_state` returned."""
        if state:
            raise ValueError(f"{self.method} keeps no extra state, got {sorted(state)}")

    def lengths(self) -> np.ndarray:
        """(N,) int64: epochs observed per trial."""
        return np.array([len(v) for v in self.values], dtype=np.int64)

    def _available(self) -> np.ndarray:
        """(N,) bool: trials that may be thawed (not finished, not pending)."""
        available = self.lengths() < self.max_epochs
        for trial in self.pending:
            available[trial] = False
        return available

    def step_costs(self) -> np.ndarray:
        """(N,) the budget one more epoch of each trial is expected to cost.

        1 in epoch units; in cost units, the trial's mean observed cost per epoch, or the mean over
        every observation for a trial never trained (1 before any observation).
        """
        if self.budget_unit == "epoch":
            return np.ones(self.num_candidates)
        overall = np.mean([h[3] for h in self.history]) if self.history else 1.0
        return np.array([np.mean(c) if c else overall for c in self.costs])

    def _next_cost_estimate(self) -> float:
        if self.budget_unit == "epoch":
            return 1.0
        return 0.0  # a cost is only known once told; `tell` refuses what overspends

    def _committed(self) -> float:
        """Spent budget plus what pending suggestions are expected to cost."""
        if not self.pending:
            return self.budget_spent
        costs = self.step_costs()
        return self.budget_spent + float(sum(costs[t] for t in self.pending))

    def _threshold_stop(self, probability: float | None = None) -> bool:
        """The stopping rule: estimated regret >= threshold (fixed, or CFBO's adaptive one)."""
        if self.stopping == "none":
            return False
        regret = self.estimated_regret()
        if self.stopping == "beta":
            from freeze_thaw_bo.cfbo import adaptive_threshold

            gamma = math.log(self.threshold, 0.5)  # the authors' γ = −log2(threshold)
            p = 0.0 if probability is None else probability
            return regret >= adaptive_threshold(p, gamma=gamma)
        return regret >= self.threshold

    def _check_trial(self, trial_id: int) -> None:
        if not isinstance(trial_id, int | np.integer) or not 0 <= trial_id < self.num_candidates:
            raise ValueError(f"unknown trial {trial_id!r}; trials are 0..{self.num_candidates - 1}")

    # ----------------------------------------------------------------------- save / resume

    def save(self, path: str | Path) -> Path:
        """Write the state to the folder `path` (JSON + safetensors); see `load_optimizer`."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        state = {
            "method": self.method,
            "settings": self.settings(),
            "space": self.space.to_dict(),
            "candidates": self.candidates,
            "budget": self.budget,
            "max_epochs": self.max_epochs,
            "utility": {"alpha": self.utility.alpha, "c": self.utility.c},
            "stopping": self.stopping,
            "threshold": self.threshold,
            "budget_unit": self.budget_unit,
            "seed": self.seed,
            "values": self.values,
            "costs": self.costs,
            "pending": {str(k): v for k, v in self.pending.items()},
            "history": self.history,
            "budget_spent": self.budget_spent,
            "u_max": self.u_max,
            "u_min": self.u_min,
            "stop_budget": self.stop_budget,
            "numpy_rng": self.rng.bit_generator.state,
            "extra": self.extra_state(),
        }
        (folder / STATE_FILE).write_text(json.dumps(state, indent=1))
        save_file(
            {"torch_rng": self.generator.get_state(), "x": torch.from_numpy(self.x)},
            str(folder / TENSOR_FILE),
        )
        return folder


def load_optimizer(path: str | Path, **overrides: Any) -> FreezeThawOptimizer:
    """Resume an optimizer saved with `save`; `overrides` pass objects JSON cannot hold: a
    surrogate other than the default must be passed again (`surrogate=`). With the same
    surrogate, the next `ask` gives the same suggestion the saved one would have."""
    folder = Path(path)
    state_file, tensor_file = folder / STATE_FILE, folder / TENSOR_FILE
    for file in (state_file, tensor_file):
        if not file.is_file():
            raise FileNotFoundError(f"no saved optimizer state at {file}")
    try:
        state = json.loads(state_file.read_text())
        tensors = load_file(str(tensor_file))
    except (json.JSONDecodeError, OSError, RuntimeError) as err:
        raise ValueError(f"the optimizer state in {folder} is corrupt: {err}") from None
    from freeze_thaw_bo.methods import method_class

    try:
        cls = method_class(state.get("method"))
    except ValueError as err:
        raise ValueError(f"{folder}: {err}") from None
    utility = Utility(budget=state["budget"], **state["utility"])
    opt = cls(
        SearchSpace.from_dict(state["space"]),
        budget=state["budget"],
        utility=utility,
        max_epochs=state["max_epochs"],
        candidates=state["candidates"],
        stopping=state["stopping"],
        threshold=state["threshold"],
        budget_unit=state["budget_unit"],
        seed=state["seed"],
        **{**state["settings"], **overrides},
    )
    if not np.array_equal(opt.x, tensors["x"].numpy()):
        raise ValueError(f"{folder}: the saved encodings do not match the candidates")
    opt.values = [list(map(float, v)) for v in state["values"]]
    opt.costs = [list(map(float, c)) for c in state["costs"]]
    opt.pending = {int(k): int(v) for k, v in state["pending"].items()}
    opt.history = [tuple(h) for h in state["history"]]
    opt.budget_spent = float(state["budget_spent"])
    opt.u_max, opt.u_min = float(state["u_max"]), float(state["u_min"])
    opt.stop_budget = state["stop_budget"]
    opt.rng.bit_generator.state = state["numpy_rng"]
    opt.generator.set_state(tensors["torch_rng"])
    opt.load_extra_state(state.get("extra", {}))
    return opt
