"""Policy semantics on hand-written traces, LPC's decay formula, Belady against brute force."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpc_cache import Access, LPCPolicy, PrefixCache, UntouchedFirst, block_hashes, make_policy


def test_fifo_and_lfu_known_answers(sequential):
    """Capacity 2 one-token prompts. Trace 1,2,1,3,1,2: FIFO evicts by insertion order
    (1 at the 3's arrival: 1 and 2 stored, 1 first), LFU keeps the frequently used 1."""
    prompts = [[1], [2], [1], [3], [1], [2]]
    fifo, _ = sequential(prompts, "fifo", 2)
    lfu, _ = sequential(prompts, "lfu", 2)
    lru, _ = sequential(prompts, "lru", 2)
    # FIFO: {1,2} hit 1; 3 evicts 1 -> {2,3}; 1 misses, evicts 2 -> {3,1}; 2 misses
    assert fifo == [0, 0, 1, 0, 0, 0]
    # LFU: counts 1:2, 2:1 -> 3 evicts 2 -> {1,3}; 1 hits; 2 evicts 3 (count 1, older than 1)
    assert lfu == [0, 0, 1, 0, 1, 0]
    # LRU: 3 evicts 2 (t1) -> {1,3}; 1 hits; 2 evicts 3 (t3 < t4)
    assert lru == [0, 0, 1, 0, 1, 0]


def test_lpc_decay_is_the_papers_update():
    """p' = p·d / (p·d + 1 − p), d = exp(−Δt·scale), composes over refreshes (every 10 s in the
    paper) to the one-shot value; the policy's closed form gives the same numbers."""
    scale, p, t_last = 1e-2, 0.8, 5.0
    policy = LPCPolicy(scale=scale)
    cache = PrefixCache(16, block_size=1, policy=policy)
    lease = cache.acquire([1], now=0.0, access=Access(probability=p))
    cache.release(lease, now=t_last)
    block = next(iter(cache.blocks.values()))
    value, t = p, t_last
    for now in np.arange(15.0, 400.0, 10.0):
        d = math.exp(-(now - t) * scale)
        value, t = value * d / (value * d + 1 - value), now
        assert policy.decayed_probability(block, now) == pytest.approx(value, rel=1e-12)


def test_lpc_evicts_lowest_decayed_probability_and_shared_blocks_take_max(sequential):
    """Three conversations end at t=0,1,2 with p = 0.9, 0.2, 0.6 (one block each, capacity 3):
    the 4th request evicts conversation 2's block (lowest decayed p), unlike LRU (oldest: 1's).
    A block shared by p=0.1 and p=0.95 conversations keeps 0.95."""
    prompts, probabilities = [[1], [2], [3], [4]], [0.9, 0.2, 0.6, 0.5]
    _, cache = sequential(prompts, make_policy("lpc"), 3, probabilities=probabilities)
    assert cache.match([2]) == 0
    assert cache.match([1]) == 1
    assert cache.match([3]) == 1
    _, lru = sequential(prompts, "lru", 3)
    assert lru.match([1]) == 0
    assert lru.match([2]) == 1

    policy = make_policy("lpc")
    cache = PrefixCache(8, block_size=1, policy=policy)
    high = cache.acquire([7], now=0.0, access=Access(probability=0.95))
    low = cache.acquire([7], now=0.0, access=Access(probability=0.1))
    cache.release(high, now=1.0)
    cache.release(low, now=1.0)
    assert policy.decayed_probability(cache.blocks[block_hashes([7], 1)[0]], 1.0) == (
        pytest.approx(0.95)
    )


def test_lpc_hit_removes_the_entry():
    """A hit resets the block's score: after the reusing turn ends with a low p, the old high p
    of the same block is gone."""
    policy = make_policy("lpc")
    cache = PrefixCache(8, block_size=1, policy=policy)
    cache.release(cache.acquire([5], 0.0, Access(probability=0.9)), 0.0)
    cache.release(cache.acquire([5], 1.0, Access(probability=0.1)), 1.0)
    block = cache.blocks[block_hashes([5], 1)[0]]
    assert policy.decayed_probability(block, 1.0) == pytest.approx(0.1)


def test_lpc_with_constant_probability_is_lru(sequential):
    """With one p for everyone the decayed order is the order of finish times: LRU's."""
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, 3, size=rng.integers(1, 6))) for _ in range(200)]
    lpc, _ = sequential(prompts, make_policy("lpc"), 6, probabilities=[0.7] * 200)
    lru, _ = sequential(prompts, "lru", 6)
    assert lpc == lru


def test_oracle_evicts_ended_conversations_first(sequential):
    prompts, continues = [[1], [2], [3], [4]], [True, False, True, True]
    _, cache = sequential(prompts, "oracle", 3, continues=continues)
    assert cache.match([2]) == 0
    assert cache.match([1]) == 1


def test_policy_needs_its_knowledge():
    for name, message in (("lpc", "probability"), ("oracle", "continues"), ("belady", "next_use")):
        cache = PrefixCache(8, block_size=1, policy=name if name != "lpc" else make_policy(name))
        with pytest.raises(ValueError, match=message):
            cache.release(cache.acquire([1, 2], 0.0, Access()), 1.0)
    with pytest.raises(ValueError, match="scale"):
        LPCPolicy(scale=-1.0)


def brute_force_optimum(paths: list[list[int]], parents: dict, capacity: int) -> int:
    """The most block hits any eviction choice achieves (sequential requests, every missing block
    stored, only unpinned leaves evicted, the current request's blocks pinned)."""

    @functools.cache
    def best(i: int, cached: frozenset) -> int:
        if i == len(paths):
            return 0
        path = paths[i]
        hit = 0
        while hit < len(path) and path[hit] in cached:
            hit += 1
        return hit + insert(i, hit, cached)

    @functools.cache
    def insert(i: int, k: int, cached: frozenset) -> int:
        path = paths[i]
        if k == len(path):
            return best(i + 1, cached)
        if len(cached) < capacity:
            return insert(i, k + 1, cached | {path[k]})
        pinned = set(path[:k])
        has_child = {parents[h] for h in cached}
        leaves = [h for h in cached if h not in has_child and h not in pinned]
        if not leaves:  # cannot store: the rest of this request is not cached
            return best(i + 1, cached)
        return max(insert(i, k + 1, (cached - {v}) | {path[k]}) for v in leaves)

    return best(0, frozenset())


small_traces = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=3), min_size=1, max_size=7)


@settings(max_examples=80, deadline=None)
@given(prompts=small_traces, capacity=st.integers(1, 4))
def test_belady_is_the_optimum_on_sequential_traces(prompts, capacity, sequential):
    """Belady's farthest-next-use rule, run through the cache, reaches the brute-force optimum
    of every eviction choice; every online policy stays at or below it."""
    paths = [block_hashes(p, 1) for p in prompts]
    parents = {}
    for path in paths:
        for j, h in enumerate(path):
            parents[h] = path[j - 1] if j else None
    optimum = brute_force_optimum(paths, parents, capacity)
    belady, _ = sequential(prompts, "belady", capacity)
    assert sum(belady) == optimum
    rng = np.random.default_rng(len(prompts))
    probabilities = rng.uniform(size=len(prompts)).tolist()
    continues = [bool(c) for c in rng.integers(0, 2, size=len(prompts))]
    for name in ("lru", "lfu", "fifo", "lpc", "oracle"):
        hits, _ = sequential(
            prompts,
            make_policy(name),
            capacity,
            probabilities=probabilities,
            continues=continues,
        )
        assert sum(hits) <= optimum, name


def test_lpc_evicts_the_lowest_current_decayed_probability():
    """Random (p, finish time) per one-block conversation; when a new request needs a slot at
    time ``now``, the evicted block is the argmin of the paper's p' = p·d / (p·d + 1 − p),
    d = exp(−(now − t_last)·scale), computed here directly (the oracle). The finish times span
    far more than 1/scale, so the decay reorders blocks (an inverted sign would fail)."""
    rng = np.random.default_rng(7)
    scale = 1e-2
    for trial in range(20):
        n = 12
        p = rng.uniform(0.02, 0.98, n)
        t_last = np.sort(rng.uniform(0.0, 600.0, n))
        policy = LPCPolicy(scale=scale)
        cache = PrefixCache(n, block_size=1, policy=policy)
        for k in range(n):
            lease = cache.acquire([k], float(t_last[k]), Access(probability=float(p[k])))
            cache.release(lease, float(t_last[k]))
        now = 700.0
        d = np.exp(-(now - t_last) * scale)
        decayed = p * d / (p * d + 1 - p)
        expected = int(np.argmin(decayed))
        cache.release(cache.acquire([1000 + trial], now, Access(probability=0.5)), now)
        gone = [k for k in range(n) if cache.match([k]) == 0]
        assert gone == [expected], (trial, decayed)


def _serve(cache, prompt, reply, conversation, t):
    """One request at time ``t`` that ends at once, its reply stored (block size 1)."""
    lease = cache.acquire_hashes(
        block_hashes(prompt, 1), float(t), Access(t, 0.5, True, None, conversation)
    )
    cache.extend(lease, block_hashes(prompt + reply, 1), float(t))
    cache.release(lease, float(t))
    cache.check_invariants()


def test_untouched_first_hand_worked_trace():
    """B [7, 8] at t=0; A's turn 0 [1, 2] + reply [3] at t=1; A's turn 1 [1, 2, 9] at t=2 does
    not repeat the reply, so block 3 is untouched by A's latest turn. Capacity 6 is then full.
    C [5] at t=3 and D [6] at t=4 need one block each: plain LRU takes 8 then 7 (B's, the
    oldest); untouched-first takes 3 first, then B's leaf 8 (LRU within the second tier)."""

    def run(policy):
        cache = PrefixCache(6, block_size=1, policy=make_policy(policy))
        _serve(cache, [7, 8], [], "B", 0)
        _serve(cache, [1, 2], [3], "A", 1)
        _serve(cache, [1, 2, 9], [], "A", 2)
        cached = [set(cache.blocks)]
        for t, (token, conversation) in enumerate([(5, "C"), (6, "D")], start=3):
            _serve(cache, [token], [], conversation, t)
            cached.append(set(cache.blocks))
        return [sorted(before - after) for before, after in itertools.pairwise(cached)]

    h = {k: block_hashes(p, 1)[-1] for k, p in {3: [1, 2, 3], 7: [7], 8: [7, 8]}.items()}
    assert run("lru") == [[h[8]], [h[7]]]
    assert run("lru+untouched") == [[h[3]], [h[8]]]
    # LPC with equal probabilities is LRU: the same rule on top gives the same victims
    assert run("lpc+untouched") == [[h[3]], [h[8]]]


def test_untouched_first_needs_the_conversation():
    policy = make_policy("lpc+untouched", scale=0.1)
    assert isinstance(policy, UntouchedFirst)
    assert policy.base.scale == 0.1
    assert policy.name == "lpc+untouched"
    cache = PrefixCache(8, block_size=1, policy=policy)
    with pytest.raises(ValueError, match="conversation"):  # refused on arrival, nothing stored
        cache.acquire_hashes(block_hashes([1], 1), 0.0, Access(0, 0.5))
    assert len(cache) == 0
    with pytest.raises(ValueError, match="probability"):  # the wrapped policy's needs too
        cache.acquire_hashes(block_hashes([1], 1), 0.0, Access(0, None, conversation="a"))
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("lru+newest")
    with pytest.raises(TypeError, match="base"):
        UntouchedFirst(policy)


@pytest.mark.parametrize(
    ("next_use", "message"),
    [
        (None, "needs Access.next_use"),
        ([0.0, -2.0], "numbers >= 0"),  # a block's next use is a trace position
        ([1.0, None], "numbers >= 0"),
        (["soon", "later"], "numbers >= 0"),
    ],
)
def test_belady_refuses_next_uses_that_are_not_trace_positions(next_use, message):
    cache = PrefixCache(8, block_size=1, policy="belady")
    with pytest.raises(ValueError, match=message):  # refused on arrival, nothing stored
        cache.acquire_hashes(block_hashes([1, 2], 1), 0.0, Access(0, next_use=next_use))
    assert len(cache) == 0
    lease = cache.acquire_hashes(block_hashes([1, 2], 1), 0.0, Access(0, next_use=(3, math.inf)))
    cache.release(lease, 1.0)  # ints, tuples and inf are fine
    assert cache.nodes()[0].next_use == [3, math.inf]
