"""Eviction policies for :class:`~lpc_cache.cache.PrefixCache`.

A policy sees three events on the nodes (runs of blocks, :class:`~lpc_cache.cache.Node`) of a
request's path: ``on_hit`` (cached nodes it reuses, at arrival), ``on_insert`` (nodes it stores or
appends to its path) and ``on_finish`` (its whole path, when it ends), and gives every evictable
block a ``priority``: the cache evicts the unpinned leaf with the smallest one. A request uses
its nodes whole, so a policy keeps one state per node (Belady's next uses are per block). The
priority of a node is that of its last block, the only one that can be a leaf. Priorities change
only while a block is pinned, so a heap entry stays valid while its block is evictable (the
cache's lazy-invalidation heap relies on this). A priority is read only once the block is
unpinned, i.e. after the ``on_finish`` of every request that held it, so a policy need not
record in ``on_hit`` / ``on_insert`` what ``on_finish`` overwrites (LRU records nothing there).

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
import numbers
import operator
from collections.abc import Sequence
from functools import partial
from itertools import islice, takewhile
from typing import NamedTuple

_HUGE = 1e9  # logit of the Oracle's certain outcomes: dominates any scale·t of a real trace


class Access(NamedTuple):
    """What a policy may know about the request using some blocks (an immutable record: a
    replay makes one per request).

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

    def on_hit(self, nodes: list, access: Access, now: float) -> None:
        """``nodes`` (cached, root first) are reused by the request, at its arrival."""

    def on_insert(self, nodes: list, access: Access, now: float) -> None:
        """``nodes`` were added to the request's path (a new one has ``created = last_access =
        now``; a reply's leading nodes may have been cached already)."""

    def on_finish(self, nodes: list, access: Access, now: float) -> None:
        for node in nodes:
            node.last_access = now

    def priority(self, node) -> tuple:
        """Of the node's last block; smaller is evicted first (tuples of one length)."""
        return (node.last_access, node.created)

    def tail_run(self, node, top: tuple | None, limit: int) -> int:
        """How many of the node's last blocks (``1 <= n <= limit``) the cache evicts in a row:
        the last one, then each block before it while its priority is below ``top`` (the
        smallest priority in the heap; ``None`` if it is empty). The blocks of a node share one
        priority here; a policy whose priorities differ within a node overrides this."""
        return limit if top is None or self.priority(node) < top else 1

    def check(self, access: Access) -> None:
        """Raise ``ValueError`` if ``access`` lacks what this policy needs; the cache calls it
        when a request arrives, before anything changes."""

    def take_changed(self) -> list:
        """Nodes whose priority changed while unpinned (in the last ``on_finish``): the cache
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

    def on_finish(self, nodes: list, access: Access, now: float) -> None:
        pass  # the order is fixed at creation

    def priority(self, node) -> tuple[float, float]:
        return (node.created, 0.0)


class LFUPolicy(EvictionPolicy):
    """Least frequently used: fewest accesses (hits + the storing request) first, then LRU."""

    name = "lfu"

    def on_hit(self, nodes: list, access: Access, now: float) -> None:
        for node in nodes:
            node.count += 1

    def on_insert(self, nodes: list, access: Access, now: float) -> None:
        self.on_hit(nodes, access, now)

    def priority(self, node) -> tuple[float, float]:
        return (float(node.count), node.last_access)


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
        next_use = access.next_use
        if next_use is None:
            raise ValueError("the Belady policy needs Access.next_use (future knowledge)")
        try:
            low = min(next_use, default=0.0)
        except TypeError:
            low = None
        if not (isinstance(low, numbers.Real) and low >= 0):
            raise ValueError("Access.next_use must hold trace positions: numbers >= 0 (or inf)")

    def _mark(self, nodes: list, access: Access) -> None:
        """Each block's next use becomes the max of what it had and what ``access`` knows."""
        if not nodes:
            return
        next_use = access.next_use  # checked on arrival
        end = nodes[-1].end  # the path's length in blocks
        if type(next_use) is not list or len(next_use) < end:  # inf past the request's uses
            next_use = list(next_use) + [math.inf] * (end - len(next_use))
        for node in nodes:  # node.next_use: per block, the latest information wins
            lo = node.depth
            values = next_use[lo : lo + len(node.keys)]
            old = node.next_use
            if old is not None and max(old) > min(values):  # else the new values are the max
                values = list(map(max, old, values))
            node.next_use = values

    def on_finish(self, nodes: list, access: Access, now: float) -> None:
        # a request's whole path (its hits, the blocks it stored) is marked here, before any of
        # it can be evicted; taking the max is order-free, so marking at the hit as well would
        # change nothing
        self._mark(nodes, access)

    def priority(self, node) -> tuple[float, float]:
        return (-node.next_use[-1], node.created)

    def tail_run(self, node, top: tuple | None, limit: int) -> int:
        if top is None:
            return limit
        # (-next_use, created) < top, block by block from the second last up: with ``created``
        # shared by the node, a comparison of next_use with -top[0]
        next_use = node.next_use
        bound = -top[0]
        tie_wins = node.created < top[1]
        last = len(next_use) - 1
        low = min(next_use[last - limit + 1 : last], default=math.inf)
        if low > bound or (tie_wins and low == bound):  # all of them (the usual case)
            return limit
        beats = partial(operator.le if tie_wins else operator.lt, bound)
        return 1 + len(list(takewhile(beats, islice(reversed(next_use), 1, limit))))


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

    def on_hit(self, nodes: list, access: Access, now: float) -> None:
        for node in nodes:  # a hit removes the entry
            node.score = -math.inf

    def on_insert(self, nodes: list, access: Access, now: float) -> None:
        self.on_hit(nodes, access, now)

    def on_finish(self, nodes: list, access: Access, now: float) -> None:
        score = self.logit(access) + self.scale * now
        for node in nodes:  # shared blocks keep the max over conversations
            if score > node.score:
                node.score = score
            node.last_access = now

    def priority(self, node) -> tuple[float, float]:
        return (node.score, node.last_access)

    def decayed_probability(self, node, now: float) -> float:
        """The paper's ``p'`` of a node's blocks at time ``now`` (for inspection and tests)."""
        z = node.score - self.scale * now
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
        self._path: dict[str, list] = {}  # conversation -> nodes that turn finished with
        self._stamp = 0
        self._changed: list = []

    def check(self, access: Access) -> None:
        if access.conversation is None:
            raise ValueError("the untouched-first rule needs Access.conversation")
        self.base.check(access)

    def on_hit(self, nodes: list, access: Access, now: float) -> None:
        self.base.on_hit(nodes, access, now)

    def on_insert(self, nodes: list, access: Access, now: float) -> None:
        self.base.on_insert(nodes, access, now)

    def on_finish(self, nodes: list, access: Access, now: float) -> None:
        self.base.on_finish(nodes, access, now)
        conversation = access.conversation  # present: check() ran when the request arrived
        self._stamp += 1
        stamp = self._stamp
        self._latest[conversation] = stamp
        for node in nodes:
            node.owner = conversation
            node.stamp = stamp
        # the previous turn's nodes this one did not touch move to the first tier (the cache
        # skips nodes evicted since; a reused one was reset, or stamped by this very turn; a
        # node cut off one of them since is held by the request that cut it until that
        # request's finish stamps it, so it never needs re-filing from this list)
        for node in self._path.get(conversation, ()):
            if node.owner == conversation and node.stamp != stamp:
                self._changed.append(node)
        if access.continues is False:  # its last turn: no later turn will leave blocks behind
            self._path.pop(conversation, None)
        else:
            self._path[conversation] = list(nodes)

    def untouched(self, node) -> bool:
        """The node's conversation finished a turn since, without it."""
        return node.owner is not None and self._latest[node.owner] != node.stamp

    def priority(self, node) -> tuple:
        owner = node.owner  # untouched(node), inline: called at every push
        tier = 0 if owner is not None and self._latest[owner] != node.stamp else 1
        return (tier, *self.base.priority(node))

    def tail_run(self, node, top: tuple | None, limit: int) -> int:
        if top is None:
            return limit
        tier = 0 if self.untouched(node) else 1  # one tier for the whole node
        if tier != top[0]:
            return limit if tier < top[0] else 1
        return self.base.tail_run(node, top[1:], limit)

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
