"""The radix prefix cache: matching, sharing, pinning, LRU on a tree, invariants (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpc_cache import Access, Node, PrefixCache, block_hashes, make_policy


def test_match_counts_full_blocks_only():
    cache = PrefixCache(64, block_size=4)
    cache.release(cache.acquire(list(range(10))))  # 2 full blocks stored, 2 tokens dropped
    assert len(cache) == 2
    assert cache.match(list(range(10))) == 8
    assert cache.match(list(range(7))) == 4  # the second block is not complete
    assert cache.match([0, 1, 2, 3, 9, 9, 9, 9]) == 4  # diverges in block 2
    assert cache.match([1, 0, 2, 3]) == 0


def test_insert_returns_the_cached_prefix():
    cache = PrefixCache(64, block_size=4)
    assert cache.insert([1, 2, 3, 4, 5, 6, 7, 8, 9]) == 0
    assert cache.insert([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0]) == 8
    assert len(cache) == 3
    assert all(block.pins == 0 for block in cache.blocks.values())


def test_block_hashes_chain_whole_prefix():
    a = block_hashes([1, 2, 3, 4, 5, 6], 2)
    b = block_hashes([9, 9, 3, 4, 5, 6], 2)
    assert len(a) == 3
    assert a[0] != b[0]
    assert a[1] != b[1]  # same tokens, different prefix: a different block
    assert block_hashes([3, 4, 5, 6], 2, a[0]) == a[1:]


def test_shared_system_prompt_stored_once():
    system = list(range(100, 132))  # 8 blocks of 4
    cache = PrefixCache(10_000, block_size=4)
    for user in range(5):
        lease = cache.acquire(system + [user] * 8)
        assert lease.hit_blocks == (0 if user == 0 else 8)
        cache.release(lease)
    assert len(cache) == 8 + 5 * 2  # the system prompt once, two private blocks per user


def test_lru_on_radix_tree_known_answer():
    """Capacity 4 one-token blocks; the answers are worked out by hand.

    t0 A=[1,2], t1 B=[1,3] (hits 1), t2 C=[4,5]: one slot short, the LRU leaf 2 (t0) goes; 1
    still has child 3. t3 D=[1,2]: hits 1 (now pinned), needs a slot: leaves 3 (t1) and 5 (t2),
    3 goes. t4 E=[6,7,8] needs 3: leaf 5 (t2) goes, which makes 4 (t2) a leaf older than 2 (t3),
    so 4 goes next, then 2; 1 stays.
    """
    cache = PrefixCache(4, block_size=1, policy="lru")
    for t, prompt in enumerate([[1, 2], [1, 3], [4, 5]]):
        cache.release(cache.acquire(prompt, now=float(t)), now=float(t))
    assert [cache.match(p) for p in ([1, 2], [1, 3], [4, 5])] == [1, 2, 2]
    assert cache.evictions == 1
    lease = cache.acquire([1, 2], now=3.0)
    assert lease.hit_blocks == 1
    cache.release(lease, now=3.0)
    assert [cache.match(p) for p in ([1, 2], [1, 3], [4, 5])] == [2, 1, 2]
    cache.release(cache.acquire([6, 7, 8], now=4.0), now=4.0)
    assert [cache.match(p) for p in ([1, 2], [4], [6, 7, 8])] == [1, 0, 3]
    assert cache.evictions == 5


def test_pinned_blocks_are_never_evicted():
    cache = PrefixCache(4, block_size=1)
    running = cache.acquire([1, 2, 3], now=0.0)  # pinned until released
    other = cache.acquire([7, 8, 9], now=1.0)  # one free slot: stores 7, then stops
    assert other.complete is False
    assert other.length == 1
    assert cache.match([1, 2, 3]) == 3
    cache.release(other, now=1.0)
    cache.release(running, now=2.0)
    third = cache.acquire([5, 6], now=3.0)  # now 7 (t=1) then 3 (t=2) go
    assert third.complete
    assert cache.match([1, 2, 3]) == 2
    assert cache.match([7]) == 0
    cache.release(third)


def test_zero_capacity_stores_nothing():
    cache = PrefixCache(15, block_size=16)
    lease = cache.acquire(list(range(64)))
    assert lease.hit_blocks == 0
    assert not lease.complete
    assert len(cache) == 0
    cache.release(lease)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity_tokens": -1}, "capacity_tokens"),
        ({"capacity_tokens": 10, "block_size": 0}, "block_size"),
        ({"capacity_tokens": 10, "policy": "mru"}, "unknown policy"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrefixCache(**kwargs)
    with pytest.raises(TypeError, match="policy"):
        PrefixCache(10, policy=object())


requests = st.lists(
    st.tuples(
        st.lists(st.integers(0, 3), min_size=1, max_size=7),  # prompt tokens (tree of width 4)
        st.booleans(),  # release before the next request?
        st.floats(0.0, 1.0),  # continuation probability
        st.lists(st.integers(0, 3), max_size=3),  # reply tokens stored at release
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(
    requests=requests,
    capacity=st.integers(0, 12),
    name=st.sampled_from(
        ["lru", "lfu", "fifo", "lpc", "oracle", "belady", "lru+untouched", "lpc+untouched"]
    ),
)
def test_invariants_under_random_overlapping_requests(requests, capacity, name):
    """Capacity never exceeded, every cached block's parent cached, child counts exact, and a
    block pinned by a running request is never evicted, whatever the policy and interleaving,
    including replies appended at release (``extend``) onto blocks other requests hold."""
    cache = PrefixCache(capacity, block_size=1, policy=make_policy(name))
    running = []

    def assert_holds(lease) -> None:
        """Every block a running request holds is still cached, and held: the path's tip
        pinned, every other node a parent (only leaves are evicted)."""
        nodes = lease.nodes
        assert sum(len(node.keys) for node in nodes) == lease.length
        assert all(cache.blocks.get(key) is node for node in nodes for key in node.keys)
        if nodes:
            assert nodes[-1].pins > 0
            assert all(node.children > 0 for node in nodes[:-1])

    def finish(t: float) -> None:
        lease, sequence = running.pop(0)
        evictions = cache.evictions
        cache.extend(lease, sequence, t)
        cache.check_invariants()
        assert_holds(lease)
        # the lease's blocks are a prefix of its sequence, each node the child of the one before
        nodes = lease.nodes
        assert [key for node in nodes for key in node.keys] == sequence[: lease.length]
        for parent, child in itertools.pairwise(nodes):
            assert child.parent is parent
        assert cache.evictions >= evictions
        cache.release(lease, t)
        cache.check_invariants()

    for t, (prompt, release_now, p, reply) in enumerate(requests):
        sequence = block_hashes(prompt + reply, 1)
        path = sequence[: len(prompt)]
        access = Access(t, p, p > 0.5, [float(t + 1)] * len(sequence), f"c{t % 3}")
        lease = cache.acquire_hashes(path, float(t), access)
        running.append((lease, sequence))
        for held, _ in running:
            assert_holds(held)
        cache.check_invariants()
        if release_now or len(running) > 3:
            finish(float(t))
    while running:
        finish(float(len(requests)))
    cache.check_invariants()
    assert all(b.pins == 0 for b in cache.blocks.values())


def test_extend_refuses_hashes_that_do_not_continue_the_path():
    cache = PrefixCache(16, block_size=1)
    lease = cache.acquire_hashes(block_hashes([1, 2], 1))
    with pytest.raises(ValueError, match="start with the lease"):
        cache.extend(lease, block_hashes([1, 3, 4], 1))
    cache.extend(lease, block_hashes([1, 2, 5], 1))
    cache.release(lease)
    cache.check_invariants()
    assert cache.match([1, 2, 5]) == 3


def test_a_recycled_node_is_a_fresh_node_but_for_its_version():
    """The cache reuses evicted Node objects: every slot but the version (which keeps counting)
    must equal a new node's."""
    cache = PrefixCache(2, block_size=1, policy=make_policy("belady+untouched"))
    access = Access(0, 0.9, True, [1.0, 2.0], "a")
    cache.release(cache.acquire_hashes(block_hashes([1, 2], 1), 0.0, access), 0.0)
    (old,) = cache.nodes()
    assert (old.owner, old.next_use) == ("a", [1.0, 2.0])  # state a reused node must drop
    lease = cache.acquire_hashes(block_hashes([7, 8], 1), 5.0, access)  # evicts both, reuses it
    (node,) = lease.nodes
    assert node is old
    fresh = Node(list(node.keys), 0, None, 5.0)
    fresh.pins = 1
    for slot in Node.__slots__:
        if slot != "version":
            assert getattr(node, slot) == getattr(fresh, slot), slot


def test_a_path_ending_inside_a_node_splits_it():
    """A prompt that reuses the first half of a stored run: the run is cut in two, the top half
    a new node with a copy of its state, the bottom half the old node with its pins."""
    cache = PrefixCache(64, block_size=1, policy="lfu")
    cache.release(cache.acquire(list(range(8)), now=1.0), now=2.0)
    (whole,) = cache.nodes()
    held = cache.acquire(list(range(8)), now=3.0)  # the bottom half's pin, and a heap entry
    lease = cache.acquire([0, 1, 2, 3, 99], now=4.0)
    assert lease.hit_blocks == 4
    cache.check_invariants()
    top, new = lease.nodes
    assert (top.keys, top.depth) == (block_hashes(range(4), 1), 0)
    assert (whole.keys, whole.depth, whole.parent) == (block_hashes(range(8), 1)[4:], 4, top)
    assert (top.count, top.last_access, top.created) == (3, 2.0, 1.0)  # two uses, then this hit
    assert (whole.count, whole.pins, top.pins, top.children) == (2, 1, 0, 2)
    assert (new.keys, new.depth, new.parent) == (block_hashes([0, 1, 2, 3, 99], 1)[4:], 4, top)
    cache.release(lease, now=5.0)
    cache.release(held, now=6.0)
    cache.check_invariants()
    assert cache.match(list(range(8))) == 8
    assert cache.match([0, 1, 2, 3, 99]) == 5
    assert all(node.pins == 0 for node in cache.nodes())
