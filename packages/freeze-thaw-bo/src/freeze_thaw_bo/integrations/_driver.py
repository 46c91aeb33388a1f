"""Library-neutral bookkeeping that lets a pause/resume scheduler run a `FreezeThawOptimizer`.

HPO libraries with pause/resume (Syne Tune, Ray Tune) keep trials running until the scheduler
answers a reported result with CONTINUE, PAUSE or STOP, and ask the scheduler what to run when a
worker is free. Freeze-thaw BO thaws one trial for one epoch at a time, so after every reported
epoch the driver tells the optimizer the value and asks it again:

- it picks the same trial: CONTINUE (the trial trains its next epoch without a restart);
- it picks another trial: PAUSE, and the suggestion waits in `queue` until the library asks what
  to run on the freed worker (a start for a trial never trained, a resume for a paused one);
- it says stop (stopping rule, budget or pool spent): STOP, and the library is told no more.

Trials the optimizer must never suggest again (the training function failed, reported a
non-finite metric, skipped epochs, or returned before `max_epochs`) are *retired*: they stay
pending in the optimizer forever, each holding back one epoch (or one mean step cost) of budget.
"""

from __future__ import annotations

import enum
import logging
import math
from collections import deque
from collections.abc import Callable

from freeze_thaw_bo.optimizer import FreezeThawOptimizer, Suggestion

__all__ = ["Decision", "FreezeThawDriver"]

logger = logging.getLogger(__name__)


class Decision(enum.Enum):
    CONTINUE = "CONTINUE"
    PAUSE = "PAUSE"
    STOP = "STOP"


class FreezeThawDriver:
    """Turns reported epochs into CONTINUE/PAUSE/STOP and free workers into start/resume.

    Args:
        optimizer: the freeze-thaw optimizer (any method) that decides.
        performance: maps a reported metric to the performance the optimizer maximises.

    Attributes:
        queue: suggestions asked from the optimizer but not yet handed to the library.
        running: trials handed to the library and not yet paused, stopped or ended.
        retired: trials never to be suggested again.
        finished: whether the search is over (the optimizer said stop with nothing outstanding).
        closed: whether the library will not start or resume trials any more; a trial it still
            runs may continue, but a suggestion for another trial is dropped and it is stopped.
    """

    def __init__(
        self, optimizer: FreezeThawOptimizer, performance: Callable[[float], float]
    ) -> None:
        if not isinstance(optimizer, FreezeThawOptimizer):
            raise TypeError(f"optimizer must be a FreezeThawOptimizer, got {optimizer!r}")
        self.optimizer = optimizer
        self.performance = performance
        self.queue: deque[Suggestion] = deque()
        self.running: set[int] = set()
        self.retired: set[int] = set()
        self.finished = False
        self.closed = False
        self._stale = True  # whether a new `ask` may answer differently from the last stop

    def peek(self, max_running: int | None = None) -> Suggestion | None:
        """The next trial to start or resume (asking the optimizer if nothing is queued), or None.

        With `max_running`, nothing new is asked while that many trials are running.
        """
        if self.queue:
            return self.queue[0]
        if max_running is not None and len(self.running) >= max_running:
            return None
        suggestion = self._ask()
        if suggestion is not None:
            self.queue.append(suggestion)
        return suggestion

    def take(self) -> Suggestion:
        """Hand the head of the queue to the library: that trial now runs."""
        suggestion = self.queue.popleft()
        self.running.add(int(suggestion.trial_id))
        return suggestion

    def on_result(
        self, trial_id: int, epoch: int, metric: float, cost: float | None = None
    ) -> Decision:
        """Record trial `trial_id`'s `metric` after `epoch` and say what the trial does next."""
        opt = self.optimizer
        expected = opt.pending.get(trial_id)
        if expected is None or trial_id in self.retired:
            raise ValueError(
                f"trial {trial_id} reported epoch {epoch}, but it is not being trained (it was "
                "paused, stopped or is finished); report once per epoch and stop after a STOP"
            )
        if epoch < expected:  # restarted without a checkpoint: re-trains epochs already observed
            return Decision.CONTINUE
        if epoch > expected:
            logger.warning(
                "trial %d reported epoch %d but epoch %d was expected (did it train past a pause "
                "and resume from a later checkpoint?); it is retired",
                trial_id,
                epoch,
                expected,
            )
            return self._retire(trial_id)
        value = self.performance(metric)
        if not math.isfinite(value):
            logger.warning("trial %d reported a non-finite metric; it is retired", trial_id)
            return self._retire(trial_id)
        opt.tell(trial_id, epoch, value, cost)
        self.running.discard(trial_id)
        self._stale = True
        if self.finished or len(opt.values[trial_id]) >= opt.max_epochs:
            return Decision.STOP
        suggestion = self._ask()
        if suggestion is None:
            return Decision.STOP if self.finished else Decision.PAUSE
        if suggestion.trial_id == trial_id:
            self.running.add(trial_id)
            return Decision.CONTINUE
        if self.closed:
            self._release(suggestion)
            return Decision.STOP
        self.queue.append(suggestion)
        return Decision.PAUSE

    def defer(self, trial_id: int) -> Decision:
        """After CONTINUE, the library cannot go on in place (its run ends at the epoch it was
        given): PAUSE, and the trial is handed out next as a resume for its pending epoch (STOP
        when the library is closed)."""
        self.running.discard(trial_id)
        suggestion = Suggestion(trial_id, self.optimizer.pending[trial_id])
        if self.closed:
            self._release(suggestion)
            return Decision.STOP
        self.queue.appendleft(suggestion)
        return Decision.PAUSE

    def on_end(self, trial_id: int) -> None:
        """The library ended the trial by itself (an error, or its function returned): if the
        optimizer still expected an epoch from it, it is retired."""
        self.running.discard(trial_id)
        if trial_id in self.optimizer.pending and trial_id not in self.retired:
            logger.warning(
                "trial %d ended before reporting epoch %d; it is retired",
                trial_id,
                self.optimizer.pending[trial_id],
            )
            self.retired.add(trial_id)
            self._stale = True

    def close(self) -> None:
        """The library starts or resumes nothing more: drop the queued suggestions."""
        self.closed = True
        while self.queue:
            self._release(self.queue.popleft())

    # ----------------------------------------------------------------------- internals

    def _ask(self) -> Suggestion | None:
        if self.finished or not self._stale:
            return None
        suggestion = self.optimizer.ask()
        if not suggestion.stop:
            return suggestion
        outstanding = set(self.optimizer.pending) - self.retired
        if self.optimizer.stopped or not outstanding:
            self.finished = True
        else:  # nothing can run until a pending trial reports (pool or budget held by others)
            self._stale = False
        return None

    def _retire(self, trial_id: int) -> Decision:
        self.running.discard(trial_id)
        self.retired.add(trial_id)
        self._stale = True
        return Decision.STOP

    def _release(self, suggestion: Suggestion) -> None:
        self.optimizer.pending.pop(int(suggestion.trial_id), None)
        self._stale = True
