"""Event-driven replay of a trace against a prefix cache and an eviction policy.

Each request, at its arrival, reuses its longest cached prefix (full blocks), pins it and stores
the rest of its prompt; it then waits for a single FIFO prefill server, prefills its uncached
tokens, decodes its reply, and at the end stores the reply's blocks (the KV a serving engine keeps
for the next turn) and releases its pins. Completions are processed before any later arrival.

The serving model (:class:`ServingModel`) is an emulation, not a measurement: prefill time is
affine in the uncached prompt tokens, decode time is a constant per output token, and the
prefill server processes one request at a time, so prefill throughput is requests per second of
busy prefill time and TTFT = queueing + prefill.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from lpc_cache.cache import PrefixCache, block_hashes
from lpc_cache.policies import Access, EvictionPolicy, make_policy
from lpc_cache.trace import Trace


@dataclass(frozen=True)
class ServingModel:
    """Emulated serving costs (defaults: a ~7B model on one accelerator, order of magnitude).

    Attributes:
        prefill_base_s: fixed cost of one prefill (scheduling, launch), seconds.
        prefill_s_per_token: prefill cost per uncached prompt token, seconds.
        decode_s_per_token: decode time per output token of one request, seconds.
    """

    prefill_base_s: float = 0.010
    prefill_s_per_token: float = 1.0 / 8000.0
    decode_s_per_token: float = 0.025

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class SimulationResult:
    """What one replay measured.

    Attributes:
        policy, capacity_tokens, block_size: the setting.
        hit_ratio: prompt tokens served from the cache / all prompt tokens (full blocks only).
        request_hit_ratio: share of requests that reused at least one cached block.
        evictions: blocks evicted.
        requests, prompt_tokens, hit_tokens: totals.
        prefill_throughput: requests per second of busy prefill time (emulated).
        ttft_p50_s, ttft_p90_s, ttft_p99_s: time-to-first-token percentiles (emulated).
        wall_s: seconds the replay took (this machine).
    """

    policy: str
    capacity_tokens: int
    block_size: int
    hit_ratio: float
    request_hit_ratio: float
    evictions: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    prefill_throughput: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    wall_s: float

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PreparedTrace:
    """Per-request block names of a trace for one block size.

    ``prompt[i]``: names of request i's prompt blocks; ``sequence[i]``: of its prompt + reply
    blocks. The reply's tokens are those the conversation's next request shows after this prompt
    (when it extends it); otherwise they get private names (stored, never reused). Blocks are
    named by small ints, cheaper for the cache to index than their 64-bit chained hashes (see
    :func:`~lpc_cache.cache.block_hashes`): the distinct hashes numbered in order of first
    appearance, the prompts' first, then the replies'. Equal names are equal prefixes.
    """

    block_size: int
    prompt: list
    sequence: list
    continues: list
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    def next_use(self) -> list:
        """For each request and each block of its sequence, the trace position of the next request
        whose sequence holds that block (``inf`` if none): Belady's future knowledge (computed
        once per prepared trace)."""
        if "next_use" not in self._memo:
            seen: dict[int, float] = {}
            out = [None] * len(self.sequence)
            for i in range(len(self.sequence) - 1, -1, -1):
                hashes = self.sequence[i]
                out[i] = [seen.get(h, math.inf) for h in hashes]
                for h in hashes:
                    seen[h] = float(i)
            self._memo["next_use"] = out
        return self._memo["next_use"]

    @property
    def footprint_blocks(self) -> int:
        """Distinct blocks the trace ever stores (prompts and replies): the capacity at which
        nothing is evicted."""
        if "footprint" not in self._memo:
            self._memo["footprint"] = len({h for hashes in self.sequence for h in hashes})
        return self._memo["footprint"]


def prepare(trace: Trace, block_size: int = 16) -> PreparedTrace:
    """Name every request's blocks once (cached on the trace per block size). Consecutive turns
    of a conversation share hashes: the cost is linear in the conversations' tokens."""
    if block_size in trace.prepared:
        return trace.prepared[block_size]
    previous: dict[str, tuple[np.ndarray, list]] = {}
    prompts = []
    for request in trace.requests:
        tokens = request.prompt
        before = previous.get(request.conversation_id)
        hashes = None
        if before is not None:
            old_tokens, old_hashes = before
            n = len(old_hashes) * block_size
            if old_hashes and len(tokens) >= n and np.array_equal(tokens[:n], old_tokens[:n]):
                hashes = old_hashes + block_hashes(tokens[n:], block_size, old_hashes[-1])
        if hashes is None:
            hashes = block_hashes(tokens, block_size)
        previous[request.conversation_id] = (tokens, hashes)
        prompts.append(hashes)
    # the reply: tokens the conversation's next request shows after this prompt
    next_in_conversation: dict[str, int] = {}
    successor = [None] * len(trace.requests)
    for i in range(len(trace.requests) - 1, -1, -1):
        cid = trace.requests[i].conversation_id
        successor[i] = next_in_conversation.get(cid)
        next_in_conversation[cid] = i
    sequences = []
    for i, request in enumerate(trace.requests):
        total = (len(request.prompt) + request.output_tokens) // block_size
        hashes = prompts[i]
        nxt = successor[i]
        if nxt is not None:
            following = trace.requests[nxt].prompt
            n = len(request.prompt)
            if len(following) >= n + request.output_tokens and np.array_equal(
                following[:n], request.prompt
            ):
                sequences.append(prompts[nxt][:total])
                continue
        extra = [
            hash((request.conversation_id, request.turn, "reply", b))
            for b in range(total - len(hashes))
        ]
        sequences.append(hashes + extra)
    names: dict[int, int] = {}

    def number(hashes: list) -> list:
        return [names.setdefault(h, len(names)) for h in hashes]

    prompts = [number(hashes) for hashes in prompts]
    sequences = [number(hashes) for hashes in sequences]
    prepared = PreparedTrace(
        block_size, prompts, sequences, [not r.last_turn for r in trace.requests]
    )
    trace.prepared[block_size] = prepared
    return prepared


def simulate(
    trace: Trace,
    policy: EvictionPolicy | str,
    capacity_tokens: int,
    *,
    block_size: int = 16,
    probabilities: Sequence[float] | None = None,
    serving: ServingModel = ServingModel(),
    store_replies: bool = True,
) -> SimulationResult:
    """Replay ``trace`` against a fresh :class:`PrefixCache`.

    Args:
        trace: the requests.
        policy: a policy or its name (``lru, lfu, fifo, belady, oracle, lpc``).
        capacity_tokens: cache size in tokens.
        block_size: tokens per block.
        probabilities: for LPC, P(conversation continues) per request (trace order), e.g. from
            :meth:`~lpc_cache.predictor.ContinuationPredictor.predict_trace`.
        serving: the emulated serving costs.
        store_replies: store the reply's blocks when a request ends (as serving engines do).
    """
    start = time.perf_counter()
    policy = make_policy(policy) if isinstance(policy, str) else policy
    prepared = prepare(trace, block_size)
    n = len(trace.requests)
    if probabilities is not None and len(probabilities) != n:
        raise ValueError(f"{len(probabilities)} probabilities for {n} requests")
    next_use = prepared.next_use() if policy.needs_next_use else None
    cache = PrefixCache(capacity_tokens, block_size, policy)
    pending: list = []  # (finish time, index, lease)
    server_free = 0.0
    hit_tokens = prompt_tokens = hit_requests = 0
    busy = 0.0
    ttft = np.empty(n)
    prompts, sequences, continues = prepared.prompt, prepared.sequence, prepared.continues
    decode, base, per_token = (
        serving.decode_s_per_token,
        serving.prefill_base_s,
        serving.prefill_s_per_token,
    )
    for i, request in enumerate(trace.requests):
        now = request.time
        while pending and pending[0][0] <= now:
            _finish(cache, heapq.heappop(pending), sequences, store_replies)
        access = Access(
            i,
            None if probabilities is None else float(probabilities[i]),
            continues[i],
            None if next_use is None else next_use[i],
            request.conversation_id,
        )
        lease = cache.acquire_hashes(prompts[i], now, access)
        hit = lease.hit_blocks * block_size
        length = len(request.prompt)
        hit_tokens += hit
        prompt_tokens += length
        hit_requests += hit > 0
        prefill = base + per_token * (length - hit)
        busy += prefill
        server_free = max(server_free, now) + prefill
        ttft[i] = server_free - now
        finish = server_free + decode * request.output_tokens
        heapq.heappush(pending, (finish, i, lease))
    while pending:
        _finish(cache, heapq.heappop(pending), sequences, store_replies)
    p50, p90, p99 = np.percentile(ttft, [50, 90, 99]) if n else (math.nan,) * 3
    return SimulationResult(
        policy=policy.name,
        capacity_tokens=capacity_tokens,
        block_size=block_size,
        hit_ratio=hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        request_hit_ratio=hit_requests / n if n else 0.0,
        evictions=cache.evictions,
        requests=n,
        prompt_tokens=prompt_tokens,
        hit_tokens=hit_tokens,
        prefill_throughput=n / busy if busy else math.inf,
        ttft_p50_s=float(p50),
        ttft_p90_s=float(p90),
        ttft_p99_s=float(p99),
        wall_s=time.perf_counter() - start,
    )


def _finish(cache: PrefixCache, event: tuple, sequences: list, store_replies: bool) -> None:
    finish, index, lease = event
    if store_replies:
        cache.extend(lease, sequences[index], finish)
    cache.release(lease, finish)


def sweep(
    trace: Trace,
    policies: dict[str, Callable[[], EvictionPolicy]],
    capacities: Sequence[int],
    *,
    block_size: int = 16,
    probabilities: Sequence[float] | None = None,
    serving: ServingModel = ServingModel(),
) -> dict[str, list[SimulationResult]]:
    """Hit ratio vs capacity: ``{name: [result per capacity]}``; ``policies`` maps a label to a
    factory (a fresh policy per replay)."""
    return {
        name: [
            simulate(
                trace,
                factory(),
                int(capacity),
                block_size=block_size,
                probabilities=probabilities,
                serving=serving,
            )
            for capacity in capacities
        ]
        for name, factory in policies.items()
    }


def capacity_for_hit_ratio(
    trace: Trace,
    policy: Callable[[], EvictionPolicy] | str,
    target: float,
    *,
    block_size: int = 16,
    probabilities: Sequence[float] | None = None,
) -> int:
    """Smallest capacity (tokens, a multiple of ``block_size``) whose replay reaches ``target``
    token hit ratio, by bisection between 0 and the trace's distinct-block footprint (where
    nothing is evicted). Bisection assumes the hit ratio grows with capacity, which is typical
    but not guaranteed for every policy; the answer is always a capacity that reaches
    ``target``. Raises ``ValueError`` if even the footprint does not.

    Args:
        policy: a policy name or a factory returning a fresh policy per replay.
    """
    factory = (lambda: make_policy(policy)) if isinstance(policy, str) else policy

    def hit_ratio(blocks: int) -> float:
        return simulate(
            trace,
            factory(),
            blocks * block_size,
            block_size=block_size,
            probabilities=probabilities,
        ).hit_ratio

    hi = prepare(trace, block_size).footprint_blocks
    if hit_ratio(hi) < target:
        raise ValueError(
            f"target hit ratio {target} is above what this trace allows at any capacity "
            f"({hit_ratio(hi):.4f})"
        )
    lo = -1  # hit_ratio(lo) < target is assumed (capacity 0 hits nothing)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if hit_ratio(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi * block_size


def capacity_at_hit_ratio(
    capacities: Sequence[float], hit_ratios: Sequence[float], target: float
) -> float:
    """Capacity at which a measured hit-ratio curve reaches ``target``, interpolating linearly in
    log capacity between sweep points (``nan`` when the curve never reaches it). The curve is made
    monotone first (running max), since a larger cache is never expected to do worse."""
    caps = np.asarray(capacities, dtype=float)
    hits = np.maximum.accumulate(np.asarray(hit_ratios, dtype=float))
    if len(caps) != len(hits) or len(caps) == 0:
        raise ValueError("capacities and hit_ratios must be non-empty and of equal length")
    if np.any(np.diff(caps) <= 0) or np.any(caps <= 0):
        raise ValueError("capacities must be positive and increasing")
    if target <= hits[0]:
        return float(caps[0]) if target == hits[0] else math.nan
    above = np.nonzero(hits >= target)[0]
    if len(above) == 0:
        return math.nan
    j = int(above[0])
    lo, hi = math.log(caps[j - 1]), math.log(caps[j])
    frac = (target - hits[j - 1]) / (hits[j] - hits[j - 1])
    return float(math.exp(lo + frac * (hi - lo)))
