"""Replays of a fixed synthetic trace give exactly the hit counts they gave before the cache's
speed work (tip-only pins, recycled objects, hooks that record only what a priority reads,
blocks stored in runs).

The expected numbers were recorded with the cache as it was before that work (one pin per path
block, a new Block object per stored block, a version bump on every pin); those of the
untouched-first rule, added later, with one Block object per block and tip-only pins. The
trace mixes shared system headers, 1-6 turns per conversation, overlapping requests (50
concurrent conversations) and stored replies; the capacities span heavy eviction to almost
none, for every policy.
"""

from __future__ import annotations

import numpy as np
import pytest

from lpc_cache import TraceConfig, build_trace, simulate
from lpc_cache.simulator import prepare

# (policy, capacity as a fraction of the footprint): (hit tokens, evictions, requests with a hit)
RECORDED = {
    ("lru", 0.02): (188672, 76052, 1119),
    ("lfu", 0.02): (182352, 76508, 1147),
    ("fifo", 0.02): (188992, 76052, 1119),
    ("belady", 0.02): (361248, 65455, 1199),
    ("oracle", 0.02): (224928, 73895, 1141),
    ("lpc", 0.02): (195504, 75793, 1128),
    ("lru", 0.1): (624544, 48257, 1282),
    ("lfu", 0.1): (306704, 68227, 1191),
    ("fifo", 0.1): (624896, 48235, 1282),
    ("belady", 0.1): (921888, 29694, 1353),
    ("oracle", 0.1): (912224, 30298, 1352),
    ("lpc", 0.1): (530736, 54253, 1244),
    ("lru", 0.4): (928944, 19488, 1357),
    ("lfu", 0.4): (616592, 39057, 1278),
    ("fifo", 0.4): (928944, 19488, 1357),
    ("belady", 0.4): (928944, 19488, 1357),
    ("oracle", 0.4): (928944, 19488, 1357),
    ("lpc", 0.4): (927104, 19603, 1354),
    # the authors' untouched-first rule on each policy, recorded with one Block object per block
    # (commit 1755481), before blocks were stored in runs
    ("lru+untouched", 0.02): (188560, 76059, 1119),
    ("lfu+untouched", 0.02): (182048, 76527, 1147),
    ("fifo+untouched", 0.02): (187696, 76133, 1118),
    ("belady+untouched", 0.02): (360416, 65507, 1199),
    ("oracle+untouched", 0.02): (224672, 73911, 1142),
    ("lpc+untouched", 0.02): (195760, 75766, 1128),
    ("lru+untouched", 0.1): (624352, 48269, 1283),
    ("lfu+untouched", 0.1): (306400, 68246, 1191),
    ("fifo+untouched", 0.1): (624320, 48271, 1283),
    ("belady+untouched", 0.1): (918416, 29911, 1354),
    ("oracle+untouched", 0.1): (908528, 30529, 1352),
    ("lpc+untouched", 0.1): (528016, 54423, 1244),
    ("lru+untouched", 0.4): (925328, 19714, 1357),
    ("lfu+untouched", 0.4): (616800, 39044, 1278),
    ("fifo+untouched", 0.4): (925328, 19714, 1357),
    ("belady+untouched", 0.4): (925328, 19714, 1357),
    ("oracle+untouched", 0.4): (925328, 19714, 1357),
    ("lpc+untouched", 0.4): (923488, 19829, 1354),
}


def regression_trace():
    rng = np.random.default_rng(7)
    headers = [rng.integers(0, 50_000, size=n).tolist() for n in (40, 90, 17)]
    conversations = []
    for c in range(400):
        head = headers[c % 4] if c % 4 < 3 else []
        turns = []
        for k in range(1 + int(rng.integers(0, 6))):
            words = (head if k == 0 else []) + rng.integers(
                0, 50_000, int(rng.integers(5, 300))
            ).tolist()
            turns.append({"role": "user", "text": " ".join(map(str, words))})
            reply = rng.integers(0, 50_000, int(rng.integers(5, 400))).tolist()
            turns.append({"role": "assistant", "text": " ".join(map(str, reply))})
        conversations.append(turns)

    def encode(texts):  # numbers are their own token ids; role markers get ids above them
        return [[int(w) if w.isdigit() else 50_001 + len(w) for w in t.split()] for t in texts]

    config = TraceConfig(arrival_rate=2.0, mean_gap_s=60.0, max_concurrent=50, seed=3)
    return build_trace(conversations, encode, config)


@pytest.fixture(scope="module")
def trace():
    return regression_trace()


def test_trace_is_the_recorded_one(trace):
    assert len(trace) == 1460
    assert prepare(trace, 16).footprint_blocks * 16 == 519664


@pytest.mark.parametrize(("policy", "fraction"), sorted(RECORDED))
def test_replay_matches_the_recorded_counts(trace, policy, fraction):
    probabilities = np.random.default_rng(11).uniform(0.05, 0.95, len(trace))
    capacity = int(fraction * prepare(trace, 16).footprint_blocks * 16)
    result = simulate(trace, policy, capacity, probabilities=probabilities)
    hit_requests = round(result.request_hit_ratio * result.requests)
    assert (result.hit_tokens, result.evictions, hit_requests) == RECORDED[(policy, fraction)]
