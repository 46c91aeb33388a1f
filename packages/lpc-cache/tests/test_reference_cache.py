"""PrefixCache against a small, obviously correct reference cache (hypothesis).

The reference stores exact token tuples (one per cached full block: the whole prefix up to and
including it), scans every node for the unpinned leaves at each eviction and takes the one with
the smallest policy key, one eviction at a time, right before the block that needs the room. It
shares no code with the package: no hashes, no heap, no child counts, no runs of blocks, no
eviction up front. Event times are distinct, so two evictable leaves never tie on a key (the
reference asserts it): the victim, hence every later hit, is fixed by the policy's order alone.
Belady's next uses are worked out from the token sequences, block by block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpc_cache import Access, PrefixCache, block_hashes

KEYS = {  # the policies' orders, written out again: smaller is evicted first
    "lru": lambda node: (node.last, node.created),
    "fifo": lambda node: (node.created,),
    "lfu": lambda node: (node.count, node.last),
    "belady": lambda node: (-node.next_use, node.created),  # the farthest next use first
}


@dataclass
class Node:
    created: float
    last: float
    count: int = 1  # accesses: the storing request, then every hit or reuse
    pins: int = 1
    next_use: float = -1.0  # the latest of the next uses its requests knew of


@dataclass
class RefLease:
    path: list = field(default_factory=list)  # token tuples, root first
    hit_blocks: int = 0
    complete: bool = True
    next_use: dict = field(default_factory=dict)  # prefix -> the next request that uses it


class ReferenceCache:
    def __init__(self, capacity_blocks: int, block_size: int, policy: str) -> None:
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.key = KEYS[policy]
        self.nodes: dict[tuple, Node] = {}
        self.evictions = 0

    def prefixes(self, tokens: list) -> list[tuple]:
        b = self.block_size
        return [tuple(tokens[: b * k]) for k in range(1, len(tokens) // b + 1)]

    def _evict_one(self) -> bool:
        b = self.block_size
        parents = {prefix[:-b] for prefix in self.nodes}
        leaves = [p for p, n in self.nodes.items() if n.pins == 0 and p not in parents]
        if not leaves:
            return False
        leaves.sort(key=lambda p: self.key(self.nodes[p]))
        if len(leaves) > 1:
            assert self.key(self.nodes[leaves[0]]) != self.key(self.nodes[leaves[1]]), "a tie"
        del self.nodes[leaves[0]]
        self.evictions += 1
        return True

    def _use(self, prefix: tuple, now: float, next_use: float) -> None:
        node = self.nodes[prefix]
        node.pins += 1
        node.count += 1
        node.last = now
        node.next_use = max(node.next_use, next_use)

    def _store(self, lease: RefLease, wanted: list[tuple], now: float) -> None:
        """Pin what is cached, create what is not, making room one block at a time."""
        for prefix in wanted:
            if prefix in self.nodes:
                self._use(prefix, now, lease.next_use[prefix])
            else:
                if len(self.nodes) >= self.capacity and not self._evict_one():
                    lease.complete = False
                    return
                self.nodes[prefix] = Node(created=now, last=now, next_use=lease.next_use[prefix])
            lease.path.append(prefix)

    def acquire(self, tokens: list, now: float, next_use: dict) -> RefLease:
        wanted = self.prefixes(tokens)
        hit = 0
        while hit < len(wanted) and wanted[hit] in self.nodes:
            hit += 1
        lease = RefLease(hit_blocks=hit, next_use=next_use)
        self._store(lease, wanted, now)
        return lease

    def extend(self, lease: RefLease, tokens: list, now: float) -> None:
        if lease.complete:
            self._store(lease, self.prefixes(tokens)[len(lease.path) :], now)

    def release(self, lease: RefLease, now: float) -> None:
        for prefix in lease.path:
            node = self.nodes[prefix]
            node.last = now
            node.pins -= 1
            node.next_use = max(node.next_use, lease.next_use[prefix])
        lease.path = []


def hashed(cache: ReferenceCache) -> set:
    """The reference's cached set, named as PrefixCache names blocks."""
    return {block_hashes(list(prefix), cache.block_size)[-1] for prefix in cache.nodes}


def replay_both(requests, capacity_blocks: int, block_size: int, policy: str, overlap: bool):
    """Serve ``(prompt, reply, hold)`` requests through both caches; a request ends (its reply
    stored, its lease released) at once when not ``overlap``, else once ``hold`` later requests
    have arrived, so requests may end out of their order of arrival. Every operation gets its own
    time. Compares hits, completeness, evictions and the cached set after every operation."""
    ours = PrefixCache(capacity_blocks * block_size, block_size, policy)
    ref = ReferenceCache(capacity_blocks, block_size, policy)
    # Belady's future knowledge: for each request, each prefix of its sequence -> the index of
    # the next request whose sequence has that prefix (inf if none)
    prefixes = [ref.prefixes(prompt + reply) for prompt, reply, _ in requests]
    future: list[dict] = []
    for i, own in enumerate(prefixes):
        later = [(j, set(p)) for j, p in enumerate(prefixes) if j > i]
        future.append(
            {prefix: next((float(j) for j, p in later if prefix in p), math.inf) for prefix in own}
        )
    clock = iter(range(10**6))
    running: list = []  # [requests still to arrive before it ends, ours, ref, whole sequence]

    def check() -> None:
        ours.check_invariants()
        assert ours.evictions == ref.evictions
        assert set(ours.blocks) == hashed(ref)

    def finish(entry) -> None:
        _, lease, ref_lease, sequence = entry
        now = float(next(clock))
        ours.extend(lease, block_hashes(sequence, block_size), now)
        ref.extend(ref_lease, sequence, now)
        assert lease.complete == ref_lease.complete
        check()
        now = float(next(clock))
        ours.release(lease, now)
        ref.release(ref_lease, now)
        check()

    for i, (prompt, reply, hold) in enumerate(requests):
        now = float(next(clock))
        access = Access(i, next_use=[future[i][prefix] for prefix in prefixes[i]])
        lease = ours.acquire(prompt, now, access)
        ref_lease = ref.acquire(prompt, now, future[i])
        assert (lease.hit_blocks, lease.complete) == (ref_lease.hit_blocks, ref_lease.complete)
        check()
        running.append([hold if overlap else 0, lease, ref_lease, prompt + reply])
        for entry in running:
            entry[0] -= 1
        for entry in [e for e in running if e[0] < 0]:  # any that are due, in arrival order
            running.remove(entry)
            finish(entry)
    while running:
        finish(running.pop())  # the rest in reverse order of arrival
    assert all(block.pins == 0 for block in ours.blocks.values())


tokens = st.lists(st.integers(0, 2), max_size=6)  # a small alphabet: prefixes repeat often
request_lists = st.lists(
    st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=6), tokens, st.integers(0, 3)),
    min_size=1,
    max_size=14,
)


@settings(max_examples=80, deadline=None)
@given(
    requests=request_lists,
    block_size=st.sampled_from([1, 2]),
    policy=st.sampled_from(sorted(KEYS)),
    overlap=st.booleans(),
)
def test_matches_reference_at_every_capacity(requests, block_size, policy, overlap):
    sequences = [p + r for p, r, _ in requests]
    footprint = len({tuple(s[: block_size * k]) for s in sequences for k in range(1, 13)})
    for capacity_blocks in range(footprint + 2):
        replay_both(requests, capacity_blocks, block_size, policy, overlap)


@pytest.mark.parametrize("policy", ["fifo", "lfu", "lru"])
def test_storing_a_reply_never_evicts_a_block_of_that_reply(policy):
    """The reply's first block is cached (the same prompt was answered before): it is reused,
    and the one block of room the reply needs comes from an unrelated conversation."""
    cache = PrefixCache(3, block_size=1, policy=policy)
    lease = cache.acquire([1], now=0.0)
    cache.extend(lease, block_hashes([1, 2], 1), now=0.0)
    cache.release(lease, now=0.0)
    cache.release(cache.acquire([7], now=1.0), now=1.0)
    lease = cache.acquire([1], now=2.0)
    cache.extend(lease, block_hashes([1, 2, 3], 1), now=2.0)
    assert (cache.match([1, 2, 3]), cache.match([7]), lease.complete) == (3, 0, True)
    assert cache.evictions == 1
    cache.release(lease, now=2.0)
    replay_both([([1], [2], 0), ([7], [], 0), ([1], [2, 3], 0)], 3, 1, policy, overlap=False)
