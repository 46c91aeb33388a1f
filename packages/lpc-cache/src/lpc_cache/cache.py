"""A token-block radix tree prefix cache (the structure of vLLM's automatic prefix caching and
SGLang's RadixAttention), with a pluggable eviction policy.

A prompt is cut into full blocks of ``block_size`` tokens; block ``i`` is named by a chained hash
``h_i = hash((h_{i-1}, tokens of block i))``, so a name fixes the whole prefix up to that block.
Shared prefixes (a system prompt, earlier turns) are therefore stored once. The cached set is
always prefix-closed (every cached block's parent is cached), blocks used by running requests are
pinned, and only unpinned leaves are evicted, in the order of the policy's priorities (a binary
heap with lazy invalidation: O(log n) per eviction).

Blocks are stored in runs, as SGLang's radix tree stores token runs: a :class:`Node` is a chain of
blocks that were stored together and have been used together since, so a request's work is per
node, not per block. The eviction order is still that of single blocks (a run is taken from its
tail, block by block in effect, with the same ties), so a replay's results do not depend on it.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from lpc_cache.policies import Access, EvictionPolicy, make_policy

_ROOT = 0x5EED  # hash seed of the empty prefix
_NEG_INF = -math.inf


def block_hashes(tokens: Sequence[int] | np.ndarray, block_size: int, parent: int = _ROOT) -> list:
    """Chained hashes of the full blocks of ``tokens`` (a trailing partial block has none).

    Args:
        tokens: ``(n,)`` token ids (any integer dtype; converted to int32).
        block_size: tokens per block.
        parent: hash of the prefix before ``tokens`` (default: the empty prefix).
    """
    array = np.ascontiguousarray(tokens, dtype=np.int32)
    width = 4 * block_size
    data = array[: len(array) // block_size * block_size].tobytes()
    out = []
    for start in range(0, len(data), width):
        parent = hash((parent, data[start : start + width]))
        out.append(parent)
    return out


class Node:
    """A run of cached blocks: ``keys`` are their names, at path positions ``depth`` onward.

    Every block of a node but the last has one child, the next block, and no pin; the blocks
    share the policy's state (``created``, ``last_access``, ``count``, ``score``, ``owner``,
    ``stamp``), since every request uses a node whole: a request whose path ends inside a node
    splits it first. Only ``next_use`` (Belady) is per block. ``children`` counts the child
    nodes of the last block, and ``pins`` the running requests whose path ends there. A pin
    holds the whole path: every other block of it has a child on the path, and only leaves are
    evicted. A request therefore pins one node, its tip.
    """

    __slots__ = (
        "children",
        "count",
        "created",
        "depth",
        "keys",
        "last_access",
        "next_use",
        "owner",
        "parent",
        "pins",
        "score",
        "stamp",
        "version",
    )

    def __init__(self, keys: list, depth: int, parent: Node | None, created: float) -> None:
        self.version = 0
        self._reset(keys, depth, parent, created)

    def _reset(self, keys: list, depth: int, parent: Node | None, created: float) -> None:
        """Every field but ``version``, which keeps counting when an evicted node is reused."""
        self.keys = keys
        self.depth = depth
        self.parent = parent
        self.children = 0
        self.pins = 0
        self.created = created
        self.last_access = created
        self.count = 0
        self.next_use = None
        self.score = _NEG_INF
        self.owner = None
        self.stamp = 0

    @property
    def end(self) -> int:
        """Path position after the node's last block (its depth plus its length)."""
        return self.depth + len(self.keys)

    def path(self) -> list:
        """The nodes from the root down to this one."""
        nodes = []
        node = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes

    def __repr__(self) -> str:
        return f"Node(depth={self.depth}, blocks={len(self.keys)}, pins={self.pins})"


@dataclass
class Lease:
    """A running request's path: its first ``hit_blocks`` blocks were cached before it came.
    ``tip`` is the node where the path ends (``None`` for an empty path) and holds its pin."""

    tip: Node | None
    length: int  # blocks on the path
    hit_blocks: int
    access: Access
    complete: bool  # every block of the request could be stored

    @property
    def nodes(self) -> list:
        """The path's nodes, root first (read now: other requests may split them meanwhile)."""
        return [] if self.tip is None else self.tip.path()


class PrefixCache:
    """Token-block radix cache with a capacity in tokens.

    Args:
        capacity_tokens: the cache holds at most ``capacity_tokens // block_size`` blocks.
        block_size: tokens per block (vLLM's default 16).
        policy: an :class:`~lpc_cache.policies.EvictionPolicy` or its name
            (``"lru" | "lfu" | "fifo" | "belady" | "oracle" | "lpc"``). Belady, Oracle and LPC
            read what they need (next uses, continuation, probability) from the
            :class:`~lpc_cache.policies.Access` passed with each request.

    ``blocks`` maps each cached block's name to the :class:`Node` holding it.

    Example:
        >>> cache = PrefixCache(capacity_tokens=64, block_size=4, policy="lru")
        >>> system = list(range(8))
        >>> cache.release(cache.acquire(system + [100, 101, 102, 103]))
        >>> cache.match(system + [200, 201, 202, 203])
        8
    """

    def __init__(
        self, capacity_tokens: int, block_size: int = 16, policy: EvictionPolicy | str = "lru"
    ) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if not isinstance(capacity_tokens, int) or capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be an int >= 0, got {capacity_tokens!r}")
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        if not isinstance(self.policy, EvictionPolicy):
            raise TypeError(f"policy must be an EvictionPolicy or a name, got {policy!r}")
        self.blocks: dict[int, Node] = {}
        self.evictions = 0
        self._heap: list = []
        self._counter = 0
        # evicted nodes, reused for new ones; their version keeps counting, so heap entries
        # pushed before the eviction stay stale
        self._free: list = []

    # --- queries -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def used_tokens(self) -> int:
        return len(self.blocks) * self.block_size

    def match_hashes(self, hashes: Sequence[int], start: int = 0) -> int:
        """Number of leading blocks of ``hashes`` that are cached (no side effects); with
        ``start``, the first ``start`` are taken as cached."""
        # the cached set is prefix-closed along every path, so membership is monotone: bisect
        lo, hi = start, len(hashes)
        blocks = self.blocks
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def match(self, tokens: Sequence[int] | np.ndarray) -> int:
        """Length in tokens of the longest cached prefix of ``tokens`` (full blocks only)."""
        return self.match_hashes(block_hashes(tokens, self.block_size)) * self.block_size

    def nodes(self) -> list:
        """Every cached node (each once)."""
        return list({id(node): node for node in self.blocks.values()}.values())

    # --- requests ------------------------------------------------------------------------------
    def insert(
        self, tokens: Sequence[int] | np.ndarray, now: float = 0.0, access: Access | None = None
    ) -> int:
        """Serve a request that ends at once (acquire, then release): returns the length in
        tokens of the prefix that was already cached; the prompt's full blocks are stored."""
        lease = self.acquire(tokens, now, access)
        self.release(lease, now)
        return lease.hit_blocks * self.block_size

    def acquire(
        self, tokens: Sequence[int] | np.ndarray, now: float = 0.0, access: Access | None = None
    ) -> Lease:
        """Serve a prompt: pin its cached prefix, store its other full blocks (evicting unpinned
        leaves as needed) and pin them too. Release the lease when the request ends."""
        return self.acquire_hashes(block_hashes(tokens, self.block_size), now, access)

    def acquire_hashes(
        self, hashes: Sequence[int], now: float = 0.0, access: Access | None = None
    ) -> Lease:
        """:meth:`acquire` for precomputed :func:`block_hashes`."""
        access = access if access is not None else Access()
        self.policy.check(access)  # before anything changes
        hit = self.match_hashes(hashes)
        tip = self._node_ending_at(hashes, hit)
        path = []
        if tip is not None:
            tip.pins += 1  # the tip's pin holds the whole path (see Node)
            path = tip.path()
        lease = Lease(tip, hit, hit, access, True)
        self.policy.on_hit(path, access, now)
        self._extend(lease, hashes, now, True)
        return lease

    def extend(self, lease: Lease, hashes: Sequence[int], now: float = 0.0) -> None:
        """Append blocks (e.g. the reply's KV) to a lease's path; ``hashes`` is the whole path,
        starting with the lease's blocks."""
        n = lease.length
        if n and (len(hashes) < n or hashes[n - 1] != lease.tip.keys[-1]):
            # chained hashes: equal tips mean equal paths
            raise ValueError("extend: hashes must start with the lease's path")
        if lease.complete:
            self._extend(lease, hashes, now, False)

    def _node_ending_at(self, hashes: Sequence[int], n: int) -> Node | None:
        """The node whose last block is the cached block ``hashes[n - 1]``, split off the node
        holding it if that one goes further (``None`` if ``n == 0``)."""
        if n == 0:
            return None
        node = self.blocks[hashes[n - 1]]
        return self._split(node, n - node.depth) if node.end > n else node

    def _split(self, node: Node, k: int) -> Node:
        """Cut ``node`` after its first ``k`` blocks; return the new node holding those (the
        parent of ``node``, which keeps its last blocks, pins and heap entries)."""
        keys = node.keys
        upper = self._new_node(keys[:k], node.depth, node.parent, node.created)
        del keys[:k]
        node.depth += k
        node.parent = upper
        upper.children = 1
        upper.last_access = node.last_access
        upper.count = node.count
        upper.score = node.score
        upper.owner = node.owner
        upper.stamp = node.stamp
        if node.next_use is not None:
            upper.next_use = node.next_use[:k]
            del node.next_use[:k]
        self.blocks.update(zip(upper.keys, repeat(upper)))
        return upper

    def _new_node(self, keys: list, depth: int, parent: Node | None, created: float) -> Node:
        if self._free:  # an evicted node, recycled (allocation is a large share of a replay)
            node = self._free.pop()
            node._reset(keys, depth, parent, created)
            return node
        return Node(keys, depth, parent, created)

    def _extend(self, lease: Lease, hashes: Sequence[int], now: float, fresh: bool) -> None:
        blocks = self.blocks
        start = lease.length
        tip = lease.tip
        added = []  # nodes appended to the path
        if not fresh:
            # a reply's leading blocks may have been stored meanwhile (by the conversation's next
            # request, or a shared header after an identical prompt): pin them before making
            # room, so that the eviction below cannot take a block this lease is about to reuse.
            # The cached set is prefix-closed, so the cached part is a prefix of the rest.
            cached = start
            if start < len(hashes) and hashes[start] in blocks:
                cached = self.match_hashes(hashes, start + 1)
            if cached > start:
                node = self._node_ending_at(hashes, cached)
                node.pins += 1  # the pin moves to the new tip
                while node is not tip:
                    added.append(node)
                    node = node.parent
                added.reverse()
                if tip is not None:
                    tip.pins -= 1
                tip = added[-1]
                start = cached
        todo = list(hashes[start:])
        # none of ``todo`` is cached now; evicting up front is the same as one at a time, since
        # the new blocks are pinned
        overflow = len(blocks) + len(todo) - self.capacity_blocks
        if overflow > 0:
            self._evict(overflow)
        room = self.capacity_blocks - len(blocks)
        if len(todo) > room:
            del todo[max(room, 0) :]
            lease.complete = False
        if todo:
            node = self._new_node(todo, start, tip, now)
            blocks.update(zip(todo, repeat(node)))
            node.pins = 1  # the pin moves to the new tip
            if tip is not None:
                tip.children += 1  # its heap entry, if any, is skipped while it has children
                tip.pins -= 1
            added.append(node)
            tip = node
            start += len(todo)
        lease.tip = tip
        lease.length = start
        self.policy.on_insert(added, lease.access, now)

    def release(self, lease: Lease, now: float = 0.0) -> None:
        """End a request: tell the policy, unpin its path, make unpinned leaves evictable."""
        tip = lease.tip
        policy = self.policy
        policy.on_finish(lease.nodes, lease.access, now)
        for node in policy.take_changed():  # re-file evictable nodes it re-prioritised
            live = node.keys and self.blocks.get(node.keys[-1]) is node
            if live and not node.pins and not node.children:
                self._push(node)
        if tip is not None:  # only the tip can become an unpinned leaf
            tip.pins -= 1
            if tip.pins == 0 and tip.children == 0:
                self._push(tip)
        lease.tip = None
        lease.length = 0

    # --- eviction ------------------------------------------------------------------------------
    def _push(self, node: Node) -> None:
        """File the node's last block (an unpinned leaf) in the heap."""
        node.version += 1
        self._counter += 1
        heapq.heappush(self._heap, (*self.policy.priority(node), self._counter, node.version, node))

    def _evict(self, count: int) -> int:
        """Evict up to ``count`` unpinned leaf blocks, smallest priority first; return how many.

        Block by block this is: pop the smallest entry, evict its block; while the block's
        parent becomes an unpinned leaf that beats the heap's top, evict it too (a pushed entry
        would lose every tie, having the newest counter), else push it. Within a node the
        parent is the previous block, so a run of equal priorities goes in one step.
        """
        heap = self._heap
        forget = self.blocks.__delitem__
        free = self._free
        priority = self.policy.priority
        tail_run = self.policy.tail_run
        done = 0
        while done < count and heap:
            entry = heapq.heappop(heap)
            node = entry[-1]
            # stale: re-pushed or changed since (the version moved on), or pinned or a parent
            # now (an entry is pushed again when its node next becomes an unpinned leaf)
            if entry[-2] != node.version or node.pins or node.children:
                continue
            top = heap[0][:-3] if heap else None  # the heap is unchanged until the chain ends
            while True:
                keys = node.keys
                size = len(keys)
                # the last block; then the blocks before it while they beat ``top``
                limit = count - done
                if size < limit:
                    limit = size
                take = tail_run(node, top, limit) if limit > 1 else 1
                done += take
                node.version += 1
                if take < size:  # its new last block lost against ``top``, or ``count`` is reached
                    keep = size - take
                    deque(map(forget, keys[keep:]), 0)
                    del keys[keep:]
                    if node.next_use is not None:
                        del node.next_use[keep:]
                    self._push(node)
                    break
                deque(map(forget, keys), 0)
                keys.clear()  # an evicted node has no keys until it is reused
                free.append(node)
                parent = node.parent
                if parent is None:
                    break
                parent.children -= 1
                if parent.children or parent.pins:
                    break
                # the parent just became a leaf: if it beats the heap's top it is next anyway
                if done < count and (top is None or priority(parent) < top):
                    node = parent
                    continue
                self._push(parent)
                break
        self.evictions += done
        return done

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the capacity, prefix-closure, node layout or child counts
        are broken."""
        assert len(self.blocks) <= self.capacity_blocks, "capacity exceeded"
        nodes = self.nodes()
        counts: dict[int, int] = {}
        for node in nodes:
            assert node.keys, "an empty node is cached"
            assert all(self.blocks.get(key) is node for key in node.keys), "name not indexed"
            parent = node.parent
            if parent is None:
                assert node.depth == 0, "a root node does not start the path"
            else:
                assert self.blocks.get(parent.keys[-1]) is parent, "a node's parent is missing"
                assert node.depth == parent.end, "a node does not continue its parent"
                counts[id(parent)] = counts.get(id(parent), 0) + 1
            assert node.pins >= 0
            assert node.next_use is None or len(node.next_use) == len(node.keys)
        assert sum(len(node.keys) for node in nodes) == len(self.blocks)
        for node in nodes:
            assert node.children == counts.get(id(node), 0), "child count out of date"
