"""Shared helpers: sequential replay of token prompts through a PrefixCache, and a small
synthetic trace file."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import lpc_cache
from lpc_cache import Access, PrefixCache, block_hashes


def next_uses(paths: list[list[int]]) -> list[list[float]]:
    """For each request and block of its path, the index of the next request using the block."""
    seen: dict[int, float] = {}
    out: list[list[float]] = [[] for _ in paths]
    for i in range(len(paths) - 1, -1, -1):
        out[i] = [seen.get(h, math.inf) for h in paths[i]]
        for h in paths[i]:
            seen[h] = float(i)
    return out


def replay(prompts, policy, capacity_tokens, block_size=1, probabilities=None, continues=None):
    """Serve prompts one after another (each released before the next arrives, at time i);
    return (hit blocks per request, the cache)."""
    cache = PrefixCache(capacity_tokens, block_size, policy)
    paths = [block_hashes(p, block_size) for p in prompts]
    future = next_uses(paths)
    hits = []
    for i, path in enumerate(paths):
        access = Access(
            index=i,
            probability=None if probabilities is None else probabilities[i],
            continues=None if continues is None else continues[i],
            next_use=future[i],
        )
        lease = cache.acquire_hashes(path, float(i), access)
        hits.append(lease.hit_blocks)
        cache.check_invariants()
        cache.release(lease, float(i))
        cache.check_invariants()
    return hits, cache


@pytest.fixture(scope="session")
def sequential():
    return replay


def synthetic_trace(path: Path, *, user_text: bool = True, conversations: int = 30) -> Path:
    """A small trace of ``conversations`` made-up conversations (1-4 turns, byte tokens) saved to
    ``path``; ``user_text=False`` drops the turns' text, as a trace built without it has."""
    convs = []
    for c in range(conversations):
        turns = []
        for k in range(1 + c % 4):
            turns.append({"role": "user", "text": f"question {c} {k} " + "q" * (c % 7) * 9})
            turns.append({"role": "assistant", "text": "answer " + "a" * (20 + c)})
        convs.append(turns)
    trace = lpc_cache.build_trace(
        convs, lambda texts: [[ord(ch) for ch in t] for t in texts], lpc_cache.TraceConfig()
    )
    if not user_text:
        trace = lpc_cache.Trace(
            [
                lpc_cache.Request(
                    r.time, r.conversation_id, r.turn, r.prompt, r.output_tokens, r.last_turn
                )
                for r in trace.requests
            ]
        )
    return lpc_cache.save_trace(trace, path)


@pytest.fixture
def write_trace():
    """:func:`synthetic_trace`, for tests that write a trace file."""
    return synthetic_trace
