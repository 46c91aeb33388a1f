"""A token-block radix tree prefix cache (the structure of vLLM's automatic prefix caching and
SGLang's RadixAttention), with a pluggable eviction policy.

A prompt is cut into full blocks of ``block_size`` tokens; block ``i`` is named by a chained hash
``h_i = hash((h_{i-1}, tokens of block i))``, so a name fixes the whole prefix up to that block and
the tree is implicit: one dict from name to :class:`Block`, each block pointing to its parent.
Shared prefixes (a system prompt, earlier turns) are therefore stored once. The cached set is
always prefix-closed (every cached block's parent is cached), blocks used by running requests are
pinned, and only unpinned leaves are evicted, in the order of the policy's priorities (a binary
heap with lazy invalidation: O(log n) per eviction).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

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


class Block:
    """One cached block: its name, parent, child count, pin count and policy state.

    ``pins`` counts the running requests whose path ends at this block. That pins the whole path:
    every other block of it has a child on the path, and only leaves are evicted. A leaf inside a
    running request's path is therefore its tip, and a request pins and unpins one block, not
    its whole (often long) history.
    """

    __slots__ = (
        "children",
        "count",
        "created",
        "key",
        "last_access",
        "next_use",
        "owner",
        "parent",
        "pins",
        "score",
        "stamp",
        "version",
    )

    def __init__(self, key: int, parent: Block | None, created: float, children: int = 0) -> None:
        self.key = key
        self.parent = parent
        self.children = children
        self.pins = 0
        self.version = 0
        self.created = created
        self.last_access = created
        self.count = 0
        self.next_use = -1.0
        self.score = _NEG_INF
        self.owner = None
        self.stamp = 0


@dataclass
class Lease:
    """The path of a running request: ``blocks[:hit_blocks]`` were cached before it came.
    The last block is pinned, which holds the whole path (see :class:`Block`)."""

    blocks: list
    hit_blocks: int
    access: Access
    complete: bool  # every block of the request could be stored


class PrefixCache:
    """Token-block radix cache with a capacity in tokens.

    Args:
        capacity_tokens: the cache holds at most ``capacity_tokens // block_size`` blocks.
        block_size: tokens per block (vLLM's default 16).
        policy: an :class:`~lpc_cache.policies.EvictionPolicy` or its name
            (``"lru" | "lfu" | "fifo" | "belady" | "oracle" | "lpc"``). Belady, Oracle and LPC
            read what they need (next uses, continuation, probability) from the
            :class:`~lpc_cache.policies.Access` passed with each request.

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
        self.blocks: dict[int, Block] = {}
        self.evictions = 0
        self._heap: list = []
        self._counter = 0
        # evicted Block objects, reused for new blocks (allocation is a large share of a replay);
        # their version keeps counting, so heap entries pushed before the eviction stay stale
        self._free: list = []

    # --- queries -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def used_tokens(self) -> int:
        return len(self.blocks) * self.block_size

    def match_hashes(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks of ``hashes`` that are cached (no side effects)."""
        # the cached set is prefix-closed along every path, so membership is monotone: bisect
        lo, hi = 0, len(hashes)
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
        blocks = self.blocks
        path = [blocks[h] for h in hashes[:hit]]
        if path:
            path[-1].pins += 1  # the tip's pin holds the whole path (see Block)
        lease = Lease(path, hit, access, True)
        self.policy.on_hit(path, access, now)
        self._extend(lease, hashes, hit, now, True)
        return lease

    def extend(self, lease: Lease, hashes: Sequence[int], now: float = 0.0) -> None:
        """Append blocks (e.g. the reply's KV) to a lease's path; ``hashes`` is the whole path,
        starting with the lease's blocks."""
        n = len(lease.blocks)
        if n and (len(hashes) < n or hashes[n - 1] != lease.blocks[-1].key):
            # chained hashes: equal tips mean equal paths
            raise ValueError("extend: hashes must start with the lease's path")
        if lease.complete:
            self._extend(lease, hashes, n, now, False)

    def _extend(
        self, lease: Lease, hashes: Sequence[int], start: int, now: float, fresh: bool
    ) -> None:
        blocks = self.blocks
        path = lease.blocks
        new_start = len(path)
        todo = hashes[start:]
        if not fresh:
            # a reply's leading blocks may have been stored meanwhile (by the conversation's next
            # request, or a shared header after an identical prompt): pin them before making
            # room, so that the eviction below cannot take a block this lease is about to reuse.
            # The cached set is prefix-closed, so the cached part of ``todo`` is a prefix of it.
            for h in todo:
                block = blocks.get(h)
                if block is None:
                    break
                path.append(block)
            if len(path) > new_start:  # the pin moves to the new tip
                path[-1].pins += 1
                if new_start:
                    path[new_start - 1].pins -= 1
            todo = todo[len(path) - new_start :]
        # none of ``todo`` is cached now; evicting up front is the same as one at a time, since
        # the new blocks are pinned
        overflow = len(blocks) + len(todo) - self.capacity_blocks
        if overflow > 0:
            self._evict(overflow)
        room = self.capacity_blocks - len(blocks)
        if len(todo) > room:
            todo = todo[: max(room, 0)]
            lease.complete = False
        if todo:
            tip = path[-1] if path else None
            parent = tip
            if parent is not None:
                parent.children += 1  # its heap entry, if any, is skipped while it has children
            free = self._free
            for h in todo:  # a chain: every new block but the last has one child, the next one
                if free:  # an evicted block, recycled: Block.__init__'s fields, version kept
                    block = free.pop()
                    block.key = h
                    block.parent = parent
                    block.children = 1
                    block.created = block.last_access = now
                    block.count = 0
                    block.next_use = -1.0
                    block.score = _NEG_INF
                    block.owner = None
                    block.stamp = 0
                else:
                    block = Block(h, parent, now, 1)
                blocks[h] = block
                path.append(block)
                parent = block
            block.children = 0
            block.pins = 1  # the pin moves to the new tip
            if tip is not None:
                tip.pins -= 1
        self.policy.on_insert(path[new_start:], lease.access, now, new_start)

    def release(self, lease: Lease, now: float = 0.0) -> None:
        """End a request: tell the policy, unpin its blocks, make unpinned leaves evictable."""
        path = lease.blocks
        policy = self.policy
        policy.on_finish(path, lease.access, now)
        for block in policy.take_changed():  # re-file evictable blocks it re-prioritised
            if self.blocks.get(block.key) is block and not block.pins and not block.children:
                self._push(block)
        if path:  # only the tip can become an unpinned leaf
            tip = path[-1]
            tip.pins -= 1
            if tip.pins == 0 and tip.children == 0:
                self._push(tip)
        lease.blocks = []

    # --- eviction ------------------------------------------------------------------------------
    def _push(self, block: Block) -> None:
        block.version += 1
        self._counter += 1
        heapq.heappush(
            self._heap, (*self.policy.priority(block), self._counter, block.version, block)
        )

    def _evict(self, count: int) -> int:
        """Evict up to ``count`` unpinned leaves, smallest priority first; return how many."""
        heap = self._heap
        blocks = self.blocks
        free = self._free
        priority = self.policy.priority
        done = 0
        while done < count and heap:
            entry = heapq.heappop(heap)
            block = entry[-1]
            # stale: re-pushed or evicted since (the version moved on), or pinned or a parent
            # now (an entry is pushed again when its block next becomes an unpinned leaf)
            if entry[-2] != block.version or block.pins or block.children:
                continue
            top = heap[0][:-3] if heap else None  # the heap is unchanged until the chain ends
            while True:
                del blocks[block.key]
                block.version += 1
                free.append(block)
                done += 1
                parent = block.parent
                if parent is None:
                    break
                parent.children -= 1
                if parent.children or parent.pins:
                    break
                # the parent just became a leaf: if it beats the heap's top it is next anyway
                # (a pushed entry would lose every tie, having the newest counter)
                if done < count and (top is None or priority(parent) < top):
                    block = parent
                    continue
                self._push(parent)
                break
        self.evictions += done
        return done

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the capacity, prefix-closure or child counts are broken."""
        assert len(self.blocks) <= self.capacity_blocks, "capacity exceeded"
        counts: dict[int, int] = {}
        for block in self.blocks.values():
            parent = block.parent
            if parent is not None:
                assert self.blocks.get(parent.key) is parent, "a cached block's parent is missing"
                counts[parent.key] = counts.get(parent.key, 0) + 1
            assert block.pins >= 0
        for key, block in self.blocks.items():
            assert block.children == counts.get(key, 0), "child count out of date"
