"""Model-free baselines: random search, successive halving, Hyperband and ASHA, one epoch per ask.

Under the freeze-thaw contract every `ask` thaws one trial for one more epoch, so "evaluate
configuration θ at r epochs" becomes successive asks of the same trial until it has r epochs; the
schedules below are otherwise the published ones. New configurations are drawn from the candidate
pool uniformly at random without replacement (`self.rng`). All stop by the base class's fixed
threshold rule, so their stopping points compare with CFBO's.

Rungs (Li et al., 2018, "Hyperband"): with maximum budget R = `max_epochs`, reduction factor η
and minimum budget r_min, s_max = max{s : r_min·η^s ≤ R}. Bracket s starts
n_s = ⌈(s_max + 1)/(s + 1)·η^s⌉ configurations and its rung i (i = 0..s) holds n_i = ⌊n_s·η^(−i)⌋
of them at r_i = R·η^(i−s) epochs, rounded half up to an integer (R = 9, η = 3: rungs 1, 3, 9 with
9, 3, 1 configurations). Successive halving runs bracket s_max again and again; Hyperband cycles
s = s_max, …, 0; ASHA uses bracket s_max's rungs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from freeze_thaw_bo.optimizer import FreezeThawOptimizer

__all__ = ["ASHA", "Hyperband", "RandomSearch", "SuccessiveHalving", "draw_untried"]


def draw_untried(
    opt: FreezeThawOptimizer, size: int, reserved: set[int] | frozenset[int] = frozenset()
) -> list[int]:
    """Up to `size` trials never trained, not pending and not `reserved`, drawn with `opt.rng`."""
    fresh = (int(t) for t in np.flatnonzero(opt.lengths() == 0))
    pool = [t for t in fresh if t not in opt.pending and t not in reserved]
    size = min(size, len(pool))
    if size == 0:
        return []
    return [int(t) for t in opt.rng.choice(np.asarray(pool), size=size, replace=False)]


class RandomSearch(FreezeThawOptimizer):
    """Random search: train a random untried configuration to `max_epochs`, then draw the next.

    Trials are continued in the order they were started; a pending trial (held by another worker)
    is skipped, so with several workers several trials are in progress at once.

    Example:
        >>> from freeze_thaw_bo import Float, SearchSpace
        >>> opt = RandomSearch(SearchSpace({"lr": Float(0.0, 1.0)}), budget=6, max_epochs=3)
        >>> trial, epoch = opt.ask()
    """

    method = "random"

    def _choose(self) -> tuple[int | None, bool]:
        available = self._available()
        started = dict.fromkeys(trial for trial, epoch, *_ in self.history if epoch == 1)
        for trial in started:
            if available[trial]:
                return trial, self._threshold_stop()
        drawn = draw_untried(self, 1)
        return (drawn[0] if drawn else None), self._threshold_stop()


def _rounded_ratio(numerator: int, denominator: int) -> int:
    """numerator / denominator rounded half up, in exact integer arithmetic."""
    return (2 * numerator + denominator) // (2 * denominator)


class _Halving(FreezeThawOptimizer):
    """η and r_min, validated, and Li et al.'s bracket shapes."""

    def __init__(self, space, *, eta: int = 3, min_epochs: int = 1, **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        if int(eta) != eta or eta < 2:
            raise ValueError(f"eta must be an integer >= 2, got {eta}")
        if int(min_epochs) != min_epochs or not 1 <= min_epochs <= self.max_epochs:
            raise ValueError(
                f"min_epochs must be an integer in [1, max_epochs={self.max_epochs}], "
                f"got {min_epochs}"
            )
        self.eta = int(eta)
        self.min_epochs = int(min_epochs)
        self.max_bracket = 0
        while self.min_epochs * self.eta ** (self.max_bracket + 1) <= self.max_epochs:
            self.max_bracket += 1

    def settings(self) -> dict[str, Any]:
        return {"eta": self.eta, "min_epochs": self.min_epochs}

    def bracket_shape(self, s: int) -> tuple[list[int], list[int]]:
        """(epochs r_i, sizes n_i) of the rungs i = 0..s of Hyperband's bracket s."""
        if not 0 <= s <= self.max_bracket:
            raise ValueError(f"bracket s must be in [0, {self.max_bracket}], got {s}")
        eta, top = self.eta, self.max_epochs
        n = -(-(self.max_bracket + 1) * eta**s // (s + 1))  # ⌈(s_max + 1)·η^s / (s + 1)⌉
        epochs = [_rounded_ratio(top * eta**i, eta**s) for i in range(s + 1)]
        return epochs, [n // eta**i for i in range(s + 1)]


class SuccessiveHalving(_Halving):
    """Successive halving (Jamieson & Talwalkar; Li et al.'s most aggressive bracket), repeated.

    A bracket draws n_0 = η^s_max configurations and trains each to r_0 epochs (one trial at a
    time, in draw order); when every one has, the best ⌊n_0/η⌋ by their value at epoch r_0 go on
    to r_1 (best first), and so on up to `max_epochs`. A finished bracket is followed by a fresh
    one until the budget or the pool runs out. With several workers, a worker that finds the
    current bracket waiting on pending trials starts (or continues) the next bracket. When the pool
    runs short, a bracket starts with fewer configurations and keeps max(1, ⌊n_i/η⌋) at each rung
    (at most the planned n_(i+1)).

    Args:
        eta: the reduction factor η.
        min_epochs: r_min, the least epochs of a rung.
        **kwargs: the `FreezeThawOptimizer` arguments (`budget`, `max_epochs`, ...).

    Example:
        >>> from freeze_thaw_bo import Float, SearchSpace
        >>> opt = SuccessiveHalving(SearchSpace({"lr": Float(0.0, 1.0)}), budget=30, max_epochs=9)
        >>> opt.bracket_shape(opt.max_bracket)  # (epochs per rung, configurations per rung)
        ([1, 3, 9], [9, 3, 1])
    """

    method = "sh"

    def __init__(self, space, *, eta: int = 3, min_epochs: int = 1, **kwargs: Any) -> None:
        super().__init__(space, eta=eta, min_epochs=min_epochs, **kwargs)
        #: open brackets, oldest first: {"epochs": [r_i], "sizes": [n_i], "rungs": [[trial]]}
        self.brackets: list[dict[str, list]] = []
        self.brackets_started = 0

    def next_bracket(self) -> int:
        """s of the bracket to start next."""
        return self.max_bracket

    def extra_state(self) -> dict[str, Any]:
        return {"brackets": self.brackets, "brackets_started": self.brackets_started}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.brackets = [
            {"epochs": b["epochs"], "sizes": b["sizes"], "rungs": [list(r) for r in b["rungs"]]}
            for b in state["brackets"]
        ]
        self.brackets_started = int(state["brackets_started"])

    def _choose(self) -> tuple[int | None, bool]:
        stop = self._threshold_stop()
        for bracket in list(self.brackets):
            trial = self._advance(bracket)
            if trial is not None:
                return trial, stop
        # every open bracket is done or waits on pending trials: open the next one
        epochs, sizes = self.bracket_shape(self.next_bracket())
        reserved = {t for b in self.brackets for t in b["rungs"][0]}
        drawn = draw_untried(self, sizes[0], reserved)
        if not drawn:
            return None, stop
        self.brackets.append({"epochs": epochs, "sizes": sizes, "rungs": [drawn]})
        self.brackets_started += 1
        return drawn[0], stop  # a fresh bracket trains its first draw first

    def _advance(self, bracket: dict[str, list]) -> int | None:
        """The next trial this bracket trains (promoting finished rungs), or None while it waits."""
        lengths = self.lengths()
        while True:
            level = len(bracket["rungs"]) - 1
            target, members = bracket["epochs"][level], bracket["rungs"][level]
            if all(lengths[t] >= target for t in members):
                if level == len(bracket["epochs"]) - 1:
                    self.brackets.remove(bracket)
                    return None
                keep = min(bracket["sizes"][level + 1], max(1, len(members) // self.eta))
                ranked = sorted(members, key=lambda t: -self.values[t][target - 1])  # stable
                bracket["rungs"].append(ranked[:keep])
                continue
            available = self._available()
            for trial in members:
                if lengths[trial] < target and available[trial]:
                    return int(trial)
            return None


class Hyperband(SuccessiveHalving):
    """Hyperband (Li et al., 2018): successive halving over brackets s = s_max, …, 0, cycled.

    Bracket s trades many configurations at few epochs (s = s_max, successive halving) against
    few at full training (s = 0, random search); the brackets run in that order and start over
    until the budget ends. Scheduling within a bracket is `SuccessiveHalving`'s.

    Example:
        >>> from freeze_thaw_bo import Float, SearchSpace
        >>> opt = Hyperband(SearchSpace({"lr": Float(0.0, 1.0)}), budget=90, max_epochs=9)
        >>> [opt.bracket_shape(s) for s in (2, 1, 0)]
        [([1, 3, 9], [9, 3, 1]), ([3, 9], [5, 1]), ([9], [3])]
    """

    method = "hyperband"

    def next_bracket(self) -> int:
        return self.max_bracket - self.brackets_started % (self.max_bracket + 1)


class ASHA(_Halving):
    """Asynchronous successive halving (Li et al., MLSys 2020), promotion variant.

    Rungs are bracket s_max's epochs r_0 < … < r_K = `max_epochs`. Each ask first continues a
    job in progress (a trial still short of the rung it was sent to; the oldest job first). Else,
    for k = K − 1 down to 0, a trial in rung k (every trial that reached r_k epochs) is promoted
    to r_(k+1) when it is among the best ⌊|rung k|/η⌋ by its value at epoch r_k and was not
    promoted before (the best such one); if no rung has one, a new random configuration starts
    towards r_0.

    Example:
        >>> from freeze_thaw_bo import Float, SearchSpace
        >>> opt = ASHA(SearchSpace({"lr": Float(0.0, 1.0)}), budget=30, max_epochs=9)
        >>> opt.rung_epochs
        [1, 3, 9]
    """

    method = "asha"

    def __init__(self, space, *, eta: int = 3, min_epochs: int = 1, **kwargs: Any) -> None:
        super().__init__(space, eta=eta, min_epochs=min_epochs, **kwargs)
        self.rung_epochs = self.bracket_shape(self.max_bracket)[0]
        #: the epoch each started trial is being trained to, in the order jobs were created
        self.targets: dict[int, int] = {}

    def extra_state(self) -> dict[str, Any]:
        return {"targets": [[t, r] for t, r in self.targets.items()]}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.targets = {int(t): int(r) for t, r in state["targets"]}

    def promotable(self, rung: int) -> list[int]:
        """Trials of rung `rung` in its top ⌊n/η⌋ not yet promoted, best first."""
        epoch, lengths = self.rung_epochs[rung], self.lengths()
        members = [t for t in self.targets if lengths[t] >= epoch]
        ranked = sorted(members, key=lambda t: -self.values[t][epoch - 1])  # stable: oldest first
        return [t for t in ranked[: len(members) // self.eta] if self.targets[t] == epoch]

    def _choose(self) -> tuple[int | None, bool]:
        stop = self._threshold_stop()
        lengths, available = self.lengths(), self._available()
        for trial, target in self.targets.items():
            if lengths[trial] < target and available[trial]:
                return trial, stop
        for rung in reversed(range(len(self.rung_epochs) - 1)):
            candidates = self.promotable(rung)
            if candidates:
                self.targets[candidates[0]] = self.rung_epochs[rung + 1]
                return candidates[0], stop
        drawn = draw_untried(self, 1)
        if not drawn:
            return None, stop
        self.targets[drawn[0]] = self.rung_epochs[0]
        return drawn[0], stop
