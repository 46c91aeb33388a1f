"""Eviction policies for :class:`~lpc_cache.cache.PrefixCache`.

A policy sees three events on the blocks of a request's path: ``on_hit`` (cached blocks it
reuses, at arrival), ``on_insert`` (blocks it stores) and ``on_finish`` (its whole path, when it
ends), and gives every evictable block a ``priority``: the cache evicts the unpinned leaf with
the smallest one. Priorities change only while a block is pinned, so a block's heap entry stays
valid while it is evictable (the cache's lazy-invalidation heap relies on this). A priority is
read only once the block is unpinned, i.e. after the ``on_finish`` of every request that held
it, so a policy need not record in ``on_hit`` / ``on_insert`` what ``on_finish`` overwrites (LRU
records nothing there: the replay's per-block work is its cost).

* LRU (vLLM, SGLang): last access time.
* LFU: access count, ties by last access.
* FIFO: insertion time.
* Belady: the farthest next use first (offline; needs each request's next-use positions).
* LPC: the paper's decayed continuation probability. At finish, every block of the turn gets
  ``p`` = P(the conversation continues); later it decays as ``p' = p·d / (p·d + 1 − p)`` with
  ``d = exp(−Δt·scale)``, i.e. ``logit p' = logit p − scale·Δt``. The order of the decayed values
  at any time is the order of ``logit p + scale·t_last``, which is therefore the heap key (exact;
  the paper recomputes the decay every 10 s, a discretization of the same order). A block shared
  by several conversations takes the max; a hit removes its entry.
* Oracle: LPC with a perfect predictor (p = 1 if the conversation continues, else 0): blocks of
  ended conversations go first, LRU within each group.
* :class:`UntouchedFirst` (``"<policy>+untouched"``): the authors' rule on top of any of these:
  blocks their conversation's latest turn did not touch go first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

_HUGE = 1e9  # logit of the Oracle's certain outcomes: dominates any scale·t of a real trace


@dataclass(frozen=True)
class Access:
    """What a policy may know about the request using some blocks.

    Attributes:
        index: position of the request in its trace (order of arrival).
        probability: P(conversation continues) for LPC (a predictor's output).
        continues: whether another turn of the conversation follows (Oracle).
        next_use: for each block of the request's path (prompt then reply), the trace position of
            the next request that uses it (``inf`` if none) (Belady).
        conversation: the request's conversation id (:class:`UntouchedFirst`).
    """

    index: int = 0
    probability: float | None = None
    continues: bool | None = None
    next_use: Sequence[float] | None = None
    conversation: str | None = None


class EvictionPolicy:
    """Base class: LRU semantics; subclasses override what differs."""

    name = "lru"
    needs_next_use = False  # the replay computes Access.next_use only for a policy that reads it

    def on_hit(self, blocks: list, access: Access, now: float) -> None:
        """``blocks`` (cached) are reused by the request, at its arrival."""

    def on_insert(self, blocks: list, access: Access, now: float, start: int) -> None:
        """``blocks`` were stored for the request (new ones have ``created = last_access = now``,
        a reply's may have been cached already); they sit at ``start`` onward in its path."""

    def on_finish(self, blocks: list, access: Access, now: float) -> None:
        for block in blocks:
            block.last_access = now

    def priority(self, block) -> tuple:
        """Smaller is evicted first (tuples of the same length for every block)."""
        return (block.last_access, block.created)

    def check(self, access: Access) -> None:
        """Raise ``ValueError`` if ``access`` lacks what this policy needs; the cache calls it
        when a request arrives, before anything changes."""

    def take_changed(self) -> list:
        """Blocks whose priority changed while unpinned (in the last ``on_finish``): the cache
        re-files those that are evictable. Priorities of the policies here change only while a
        block is pinned, except :class:`UntouchedFirst`'s."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LRUPolicy(EvictionPolicy):
    """Least recently used (the default of vLLM and SGLang)."""


class FIFOPolicy(EvictionPolicy):
    """First in, first out: the oldest stored block first."""

    name = "fifo"

    def on_finish(self, blocks: list, access: Access, now: float) -> None:
        pass  # the order is fixed at creation

    def priority(self, block) -> tuple[float, float]:
        return (block.created, 0.0)


class LFUPolicy(EvictionPolicy):
    """Least frequently used: fewest accesses (hits + the storing request) first, then LRU."""

    name = "lfu"

    def on_hit(self, blocks: list, access: Access, now: float) -> None:
        for block in blocks:
            block.count += 1

    def on_insert(self, blocks: list, access: Access, now: float, start: int) -> None:
        self.on_hit(blocks, access, now)

    def priority(self, block) -> tuple[float, float]:
        return (float(block.count), block.last_access)


class BeladyPolicy(EvictionPolicy):
    """Offline: evict the block whose next use is farthest in the future (never-used first).

    Needs ``access.next_use`` (the simulator computes it from the trace). On a radix tree the
    farthest block can always be taken to be a leaf (every use of a block uses its parent), so on
    a sequential trace with unit blocks this is Belady's MIN, the optimum. With overlapping
    requests (pins) and replies stored at finish it is the same rule, not a proven optimum.
    """

    name = "belady"
    needs_next_use = True

    def check(self, access: Access) -> None:
        if access.next_use is None:
            raise ValueError("the Belady policy needs Access.next_use (future knowledge)")

    def _mark(self, blocks: list, access: Access, offset: int) -> None:
        next_use = access.next_use
        if next_use is None:
            raise ValueError("the Belady policy needs Access.next_use (future knowledge)")
        for i, block in enumerate(blocks, offset):
            value = next_use[i] if i < len(next_use) else math.inf
            if value > block.next_use:  # the latest information about this block wins
                block.next_use = value

    def on_hit(self, blocks: list, access: Access, now: float) -> None:
        self._mark(blocks, access, 0)

    def on_insert(self, blocks: list, access: Access, now: float, start: int) -> None:
        self._mark(blocks, access, start)

    def on_finish(self, blocks: list, access: Access, now: float) -> None:
        self._mark(blocks, access, 0)

    def priority(self, block) -> tuple[float, float]:
        return (-block.next_use, block.created)


class LPCPolicy(EvictionPolicy):
    """The paper's learned policy: decayed continuation probability, min first.

    Args:
        scale: decay rate per second of ``d = exp(−Δt·scale)`` (the paper: 1e-2, about one over
            the mean inter-turn gap of 100 s).
        epsilon: probabilities are clipped to ``[epsilon, 1 − epsilon]`` before the logit.
    """

    name = "lpc"

    def __init__(self, scale: float = 1e-2, epsilon: float = 1e-6) -> None:
        if not (scale >= 0 and math.isfinite(scale)):
            raise ValueError(f"scale must be a finite number >= 0, got {scale}")
        if not 0 < epsilon < 0.5:
            raise ValueError(f"epsilon must be in (0, 0.5), got {epsilon}")
        self.scale = scale
        self.epsilon = epsilon

    def check(self, access: Access) -> None:
        self.logit(access)

    def logit(self, access: Access) -> float:
        p = access.probability
        if p is None or not 0.0 <= p <= 1.0:
            raise ValueError(f"LPC needs Access.probability in [0, 1], got {p!r}")
        p = min(max(p, self.epsilon), 1.0 - self.epsilon)
        return math.log(p / (1.0 - p))

    def on_hit(self, blocks: list, access: Access, now: float) -> None:
        for block in blocks:  # a hit removes the entry
            block.score = -math.inf

    def on_insert(self, blocks: list, access: Access, now: float, start: int) -> None:
        self.on_hit(blocks, access, now)

    def on_finish(self, blocks: list, access: Access, now: float) -> None:
        score = self.logit(access) + self.scale * now
        for block in blocks:  # shared blocks keep the max over conversations
            if score > block.score:
                block.score = score
            block.last_access = now

    def priority(self, block) -> tuple[float, float]:
        return (block.score, block.last_access)

    def decayed_probability(self, block, now: float) -> float:
        """The paper's ``p'`` of a block at time ``now`` (for inspection and tests)."""
        z = block.score - self.scale * now
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def __repr__(self) -> str:
        return f"LPCPolicy(scale={self.scale})"


class OraclePolicy(LPCPolicy):
    """LPC with a perfect predictor: knows whether each conversation continues."""

    name = "oracle"

    def logit(self, access: Access) -> float:
        if access.continues is None:
            raise ValueError("the Oracle policy needs Access.continues")
        return _HUGE if access.continues else -_HUGE

    def __repr__(self) -> str:
        return "OraclePolicy()"


class UntouchedFirst(EvictionPolicy):
    """The authors' rule on top of a policy: blocks that their conversation's latest finished
    turn did not touch are evicted first, then the wrapped policy's order.

    A block belongs to the conversation of the last request that finished with it on its path
    (a shared block to the last one, as in the authors' code). When a later turn of that
    conversation finishes without it (a reply its next prompt does not repeat, a branch it left),
    the block goes to the first tier at once. Within each tier the wrapped policy's order holds;
    the authors' code takes the first tier in list order (newest conversation first), an
    implementation detail this does not copy. In the paper's experiments LRU ran on the same
    evictor, so ``UntouchedFirst(LRUPolicy())`` is the paper's LRU baseline.

    Args:
        base: the policy ordering each tier (LPC for the paper's policy).
    """

    def __init__(self, base: EvictionPolicy) -> None:
        if not isinstance(base, EvictionPolicy) or isinstance(base, UntouchedFirst):
            raise TypeError(
                f"base must be an EvictionPolicy other than UntouchedFirst, got {base!r}"
            )
        self.base = base
        self.name = f"{base.name}+untouched"
        self.needs_next_use = base.needs_next_use
        self._latest: dict[str, int] = {}  # conversation -> stamp of its latest finished turn
        self._path: dict[str, list] = {}  # conversation -> blocks that turn finished with
        self._stamp = 0
        self._changed: list = []

    def check(self, access: Access) -> None:
        if access.conversation is None:
            raise ValueError("the untouched-first rule needs Access.conversation")
        self.base.check(access)

    def on_hit(self, blocks: list, access: Access, now: float) -> None:
        self.base.on_hit(blocks, access, now)

    def on_insert(self, blocks: list, access: Access, now: float, start: int) -> None:
        self.base.on_insert(blocks, access, now, start)

    def on_finish(self, blocks: list, access: Access, now: float) -> None:
        self.base.on_finish(blocks, access, now)
        conversation = access.conversation  # present: check() ran when the request arrived
        self._stamp += 1
        stamp = self._stamp
        self._latest[conversation] = stamp
        for block in blocks:
            block.owner = conversation
            block.stamp = stamp
        # the previous turn's blocks this one did not touch move to the first tier (blocks
        # evicted since then were reset, or, if reused, stamped by this very turn)
        for block in self._path.get(conversation, ()):
            if block.owner == conversation and block.stamp != stamp:
                self._changed.append(block)
        if access.continues is False:  # its last turn: no later turn will leave blocks behind
            self._path.pop(conversation, None)
        else:
            self._path[conversation] = list(blocks)

    def untouched(self, block) -> bool:
        """The block's conversation finished a turn since, without it."""
        return block.owner is not None and self._latest[block.owner] != block.stamp

    def priority(self, block) -> tuple:
        return (0 if self.untouched(block) else 1, *self.base.priority(block))

    def take_changed(self) -> list:
        changed, self._changed = self._changed, []
        return changed

    def __repr__(self) -> str:
        return f"UntouchedFirst({self.base!r})"


POLICIES = {
    "lru": LRUPolicy,
    "lfu": LFUPolicy,
    "fifo": FIFOPolicy,
    "belady": BeladyPolicy,
    "lpc": LPCPolicy,
    "oracle": OraclePolicy,
}


def make_policy(name: str, **kwargs) -> EvictionPolicy:
    """A policy by name: one of ``lru, lfu, fifo, belady, lpc, oracle``, or one of them with
    ``+untouched`` (the authors' untouched-first rule, :class:`UntouchedFirst`), e.g.
    ``"lpc+untouched"``; ``kwargs`` go to the named policy."""
    base, plus, rule = name.lower().partition("+") if isinstance(name, str) else (None, "", "")
    cls = POLICIES.get(base)
    if cls is None or (plus and rule != "untouched"):
        choices = sorted(POLICIES) + [f"{p}+untouched" for p in sorted(POLICIES)]
        raise ValueError(f"unknown policy {name!r}; choose one of {choices}")
    policy = cls(**kwargs)
    return UntouchedFirst(policy) if plus else policy
