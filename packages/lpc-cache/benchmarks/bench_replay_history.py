"""Replay speed of this checkout against an earlier commit of lpc-cache, in one process.

Both versions replay the benchmark's ShareGPT trace (``lpc_cache.benchmark``: 2,000
conversations, a tight and a roomy cache) for each policy, alternating old and new, timed in
CPU time, and every result (hits, evictions, TTFT percentiles) must be identical. The earlier
source is taken from git (``git archive``) and imported under another name.

python packages/lpc-cache/benchmarks/bench_replay_history.py --baseline 61d093d --rounds 5
"""

from __future__ import annotations

import argparse
import copy
import importlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lpc_cache.benchmark import CAPACITY_FRACTIONS
from lpc_cache.simulator import prepare, simulate
from lpc_cache.trace import TraceConfig, sharegpt_trace

ROOT = Path(__file__).resolve().parents[3]
BASELINE = "lpc_cache_baseline"


def import_baseline(revision: str, folder: Path):
    """``lpc_cache.simulator`` as of ``revision``, importable next to this checkout's."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "packages/lpc-cache/src/lpc_cache"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    source = folder / "packages/lpc-cache/src/lpc_cache"
    target = folder / BASELINE
    source.rename(target)
    for path in target.glob("*.py"):  # its absolute imports name the other copy
        text = re.sub(r"\blpc_cache\b", BASELINE, path.read_text())
        path.write_text(text)
    sys.path.insert(0, str(folder))
    return importlib.import_module(f"{BASELINE}.simulator")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5, help="old/new pairs per setting")
    parser.add_argument("--policies", default="lru,lfu,fifo,belady,oracle,lpc")
    parser.add_argument("--conversations", type=int, default=2000)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    trace = sharegpt_trace(args.conversations, TraceConfig(seed=0))
    footprint = prepare(trace).footprint_blocks * 16
    probabilities = np.random.default_rng(0).uniform(0.2, 0.9, len(trace))
    with tempfile.TemporaryDirectory() as folder:
        old = import_baseline(args.baseline, Path(folder))
        old_trace = copy.copy(trace)  # each version prepares (hashes) its own copy
        old_trace.prepared = {}
        old.prepare(old_trace)
        print(f"{len(trace)} requests, CPU seconds per replay, median of {args.rounds} pairs")
        print("| policy | capacity | baseline req/s | this req/s | speed-up | pairs |")
        print("|---|---:|---:|---:|---:|---|")
        for fraction in CAPACITY_FRACTIONS:
            capacity = int(fraction * footprint)
            for name in args.policies.split(","):
                sides = (("old", old.simulate, old_trace), ("new", simulate, trace))
                times: dict[str, list] = {"old": [], "new": []}
                results = {}
                for _, run, replayed in sides:  # warm-up
                    run(replayed, name, capacity, probabilities=probabilities)
                for _ in range(args.rounds):
                    for side, run, replayed in sides:
                        start = time.process_time()
                        result = run(replayed, name, capacity, probabilities=probabilities)
                        times[side].append(time.process_time() - start)
                        fields = result.to_json()
                        fields.pop("wall_s")
                        results[side] = fields
                    if results["old"] != results["new"]:
                        raise SystemExit(f"{name} at {capacity}: results differ: {results}")
                before, after = statistics.median(times["old"]), statistics.median(times["new"])
                ratios = sorted(a / b for a, b in zip(times["old"], times["new"], strict=True))
                pairs = " ".join(f"{r:.2f}" for r in ratios)
                print(
                    f"| {name} | {capacity:,} | {len(trace) / before:,.0f} | "
                    f"{len(trace) / after:,.0f} | {before / after:.2f}x | {pairs} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
