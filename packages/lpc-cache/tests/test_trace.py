"""Traces: building from conversations, JSONL round trip, malformed lines, the simulator."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from lpc_cache import (
    Request,
    ServingModel,
    Trace,
    TraceConfig,
    build_trace,
    capacity_at_hit_ratio,
    capacity_for_hit_ratio,
    load_trace,
    prepare,
    save_trace,
    simulate,
)
from lpc_cache.trace import ROLE_HEADERS


def encode(texts):
    """A toy tokenizer: one token per character (ids < 2^31)."""
    return [[ord(c) for c in text] for text in texts]


def conversation(n_user: int, seed: int):
    rng = np.random.default_rng(seed)
    turns = []
    for k in range(n_user):
        turns.append({"role": "user", "text": f"question {seed}.{k} " + "x" * rng.integers(5, 40)})
        turns.append({"role": "assistant", "text": "answer " + "y" * rng.integers(5, 60)})
    return turns


def test_build_trace_prompts_are_conversation_prefixes():
    convs = [conversation(3, 0), conversation(1, 1)]
    trace = build_trace(convs, encode, TraceConfig(seed=1))
    by_conv = {}
    for r in trace.requests:
        by_conv.setdefault(r.conversation_id, []).append(r)
    first = sorted(by_conv["c0"], key=lambda r: r.turn)
    assert [r.turn for r in first] == [0, 1, 2]
    assert [r.last_turn for r in first] == [False, False, True]
    for a, b in itertools.pairwise(first):
        n = len(a.prompt)
        assert np.array_equal(b.prompt[:n], a.prompt)  # history kept
        reply = "".join(chr(t) for t in b.prompt[n : n + a.output_tokens])
        assert reply.startswith(ROLE_HEADERS["assistant"] + "answer")  # then the reply
    expected = ROLE_HEADERS["user"] + convs[0][0]["text"]
    assert "".join(chr(t) for t in first[0].prompt) == expected
    assert first[0].output_tokens == len(ROLE_HEADERS["assistant"] + convs[0][1]["text"])


def test_arrivals_respect_the_concurrency_cap():
    convs = [conversation(4, s) for s in range(60)]
    config = TraceConfig(arrival_rate=100.0, mean_gap_s=10.0, max_concurrent=5, seed=3)
    trace = build_trace(convs, encode, config)
    spans = {}
    for r in trace.requests:
        start, end = spans.get(r.conversation_id, (r.time, r.time))
        spans[r.conversation_id] = (min(start, r.time), max(end, r.time))
    events = sorted([(s, 1) for s, _ in spans.values()] + [(e, -1) for _, e in spans.values()])
    active = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # an end frees its slot first
        active += delta
        peak = max(peak, active)
    assert peak <= 5
    gaps = [b.time - a.time for a, b in _pairs(trace)]
    # 180 exponential gaps of mean 10: the sample mean is within 4 standard errors (0.75 each)
    assert np.mean(gaps) == pytest.approx(10.0, abs=3.0)


def _pairs(trace):
    by_conv = {}
    for r in trace.requests:
        by_conv.setdefault(r.conversation_id, []).append(r)
    return [(a, b) for rs in by_conv.values() for a, b in itertools.pairwise(rs)]


def test_max_prompt_tokens_ends_the_conversation():
    trace = build_trace([conversation(5, 0)], encode, TraceConfig(max_prompt_tokens=150))
    assert all(len(r.prompt) <= 150 for r in trace.requests)
    assert trace.requests[-1].last_turn
    assert len(trace) < 5


def test_jsonl_round_trip(tmp_path):
    trace = build_trace([conversation(2, s) for s in range(5)], encode, TraceConfig(seed=2))
    path = save_trace(trace, tmp_path / "trace.jsonl")
    loaded = load_trace(path)
    assert len(loaded) == len(trace)
    for a, b in zip(trace.requests, loaded.requests, strict=True):
        assert a.to_json() == b.to_json()
        assert b.prompt.dtype == np.int32


GOOD = {
    "time": 1.0,
    "conversation_id": "a",
    "turn": 0,
    "prompt_token_ids": [1, 2, 3],
    "output_tokens": 4,
    "last_turn": True,
}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "turn"}), "missing field 'turn'"),
        (json.dumps({**GOOD, "last_turn": 1}), "'last_turn' must be bool"),
        (json.dumps({**GOOD, "turn": True}), "'turn' must be int"),
        (json.dumps({**GOOD, "prompt_token_ids": [1, -2]}), "prompt_token_ids"),
        (json.dumps({**GOOD, "prompt_token_ids": []}), "prompt_token_ids"),
        (json.dumps({**GOOD, "time": -1}), "time must be"),
        (json.dumps({**GOOD, "time": 0.5}), "earlier than the line before"),
        (json.dumps({**GOOD, "time": 2.0, "turn": 1}), "continues after a request marked"),
        (json.dumps({**GOOD, "conversation_id": "b", "time": 2.0}), None),
    ],
)
def test_malformed_line_names_its_number(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + line + "\n")
    if message is None:  # the control: a well-formed second line loads
        assert len(load_trace(path)) == 2
        return
    with pytest.raises(ValueError, match=message) as error:
        load_trace(path)
    assert f"{path}:3" in str(error.value)


def test_turns_must_increase_within_a_conversation(tmp_path):
    path = tmp_path / "bad.jsonl"
    first = {**GOOD, "last_turn": False, "turn": 1}
    path.write_text(json.dumps(first) + "\n" + json.dumps({**GOOD, "time": 2.0}) + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: turn 0 .* does not follow turn 1"):
        load_trace(path)


def test_missing_and_empty_trace(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no requests"):
        load_trace(tmp_path / "empty.jsonl")


def _request(time, cid, turn, tokens, output, last):
    prompt = np.asarray(tokens, dtype=np.int32)
    return Request(time, cid, turn, prompt, output, last)


def test_simulator_known_answer():
    """Block 4. Turn 0 of conversation a: 8 prompt tokens, 4-token reply; turn 1 (t=100) extends
    it by the reply and 4 new tokens, so its first 12 tokens are cached (the prompt's 2 blocks
    and the reply's block). Conversation b (t=50) shares nothing. Token hit ratio 12 / 36."""
    a0 = list(range(8))
    a1 = [*a0, 50, 51, 52, 53, 60, 61, 62, 63]
    requests = [
        _request(0.0, "a", 0, a0, 4, False),
        _request(50.0, "b", 0, list(range(100, 112)), 2, True),
        _request(100.0, "a", 1, a1, 3, True),
    ]
    # distinct blocks: a's chain of 4 (its turn-1 prompt; turn 0's reply is its third block)
    # and b's 3 (its 2-token reply does not fill a block)
    assert prepare(Trace(requests), 4).footprint_blocks == 7
    result = simulate(Trace(requests), "lru", capacity_tokens=1000, block_size=4)
    assert result.hit_tokens == 12
    assert result.prompt_tokens == 36
    assert result.hit_ratio == pytest.approx(12 / 36)
    assert result.request_hit_ratio == pytest.approx(1 / 3)
    assert result.evictions == 0
    # emulated serving: prefill affine in uncached tokens, one FIFO prefill server
    tight = simulate(Trace(requests), "lru", capacity_tokens=8, block_size=4)
    assert tight.hit_tokens == 0
    assert tight.evictions > 0
    assert result.prefill_throughput > tight.prefill_throughput


def test_trace_order_is_checked():
    with pytest.raises(ValueError, match="time order"):
        Trace([_request(2.0, "a", 0, [1], 0, True), _request(1.0, "b", 0, [1], 0, True)])


def test_capacity_at_hit_ratio_interpolates_in_log_capacity():
    caps, hits = [100, 1000, 10000], [0.1, 0.3, 0.5]
    assert capacity_at_hit_ratio(caps, hits, 0.2) == pytest.approx(10**2.5)
    assert capacity_at_hit_ratio(caps, hits, 0.5) == pytest.approx(10000)
    assert np.isnan(capacity_at_hit_ratio(caps, hits, 0.6))
    with pytest.raises(ValueError, match="increasing"):
        capacity_at_hit_ratio([10, 5], [0.1, 0.2], 0.15)


def test_capacity_for_hit_ratio_matches_a_linear_scan():
    """Bisection against the brute force: the first capacity of a scan over every block count
    whose replay reaches the target (this trace's LRU curve is checked to be monotone)."""
    trace = build_trace([conversation(3, s) for s in range(12)], encode, TraceConfig(seed=4))
    scan = [simulate(trace, "lru", 8 * b, block_size=8).hit_ratio for b in range(200)]
    assert all(b >= a for a, b in itertools.pairwise(scan))
    for target in (0.1, 0.3, scan[-1]):
        expected = 8 * next(b for b, h in enumerate(scan) if h >= target)
        assert capacity_for_hit_ratio(trace, "lru", target, block_size=8) == expected
    with pytest.raises(ValueError, match="above what this trace allows"):
        capacity_for_hit_ratio(trace, "lru", 0.999, block_size=8)


def test_serving_model_known_answer():
    """Prefill = base + per_token · uncached tokens on one FIFO server; TTFT = wait + prefill.
    Request 0 (t=0, 8 uncached tokens): prefill 1 + 0.5·8 = 5 s, TTFT 5. Request 1 (t=1, 4
    tokens, another conversation) waits until 5, prefills 1 + 0.5·4 = 3 s: TTFT 7. Throughput:
    2 requests / 8 busy seconds. Percentiles interpolate linearly between 5 and 7."""
    serving = ServingModel(prefill_base_s=1.0, prefill_s_per_token=0.5, decode_s_per_token=10.0)
    requests = [
        _request(0.0, "a", 0, list(range(8)), 4, True),
        _request(1.0, "b", 0, list(range(100, 104)), 2, True),
    ]
    result = simulate(Trace(requests), "lru", 1000, block_size=4, serving=serving)
    assert result.prefill_throughput == pytest.approx(2 / 8)
    assert (result.ttft_p50_s, result.ttft_p90_s) == pytest.approx((6.0, 6.8))
    with pytest.raises(ValueError, match="prefill_base_s"):
        ServingModel(prefill_base_s=-1.0)
