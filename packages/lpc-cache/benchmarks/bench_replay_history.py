"""Replay speed of this checkout against an earlier commit of lpc-cache, in one process.

Both versions replay the benchmark's ShareGPT trace (``lpc_cache.benchmark``: 2,000
conversations, a tight and a roomy cache) for each policy, alternating old and new, timed in
CPU time, and every result (hits, evictions, TTFT percentiles) must be identical. The earlier
source is taken from git (``git archive``) and imported under another name.

python packages/lpc-cache/benchmarks/bench_replay_history.py --out reports/bench/lpc-cache
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kernels_common.bench import hardware_description
from kernels_common.cli import atomic_folder
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
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cpu only")
    parser.add_argument("--out", default=None, help="folder for bench_replay_history.json/.md")
    parser.add_argument(
        "--baseline",
        default="61d093d",
        help="git revision to compare with (default: the last one storing one object per block)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="old/new pairs per setting")
    parser.add_argument("--policies", default="lru,lfu,fifo,belady,oracle,lpc")
    parser.add_argument("--conversations", type=int, default=2000)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.device != "cpu":
        print("the replay runs on the CPU: nothing to measure with --device cuda")
        return

    trace = sharegpt_trace(args.conversations, TraceConfig(seed=0))
    footprint = prepare(trace).footprint_blocks * 16
    probabilities = np.random.default_rng(0).uniform(0.2, 0.9, len(trace))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        try:
            old = import_baseline(args.baseline, Path(folder))
        except subprocess.CalledProcessError as error:
            raise SystemExit(
                f"cannot read revision {args.baseline!r} from the git checkout at {ROOT}: "
                f"{error.stderr.decode(errors='replace').strip()}"
            ) from None
        old_trace = copy.copy(trace)  # each version prepares (hashes) its own copy
        old_trace.prepared = {}
        old.prepare(old_trace)
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
                rows.append(
                    {
                        "policy": name,
                        "capacity_tokens": capacity,
                        "baseline_requests_per_cpu_s": len(trace) / before,
                        "requests_per_cpu_s": len(trace) / after,
                        "speedup": before / after,
                        "pair_speedups": ratios,
                    }
                )
                print(f"{name} at {capacity:,} tokens: {before / after:.2f}x", flush=True)
    lines = [
        f"{hardware_description('cpu')}, one thread; {len(trace)} requests; baseline "
        f"{args.baseline}; CPU time per replay, median of {args.rounds} alternating pairs; "
        "results identical",
        "",
        "| policy | capacity | baseline req/s | this req/s | speed-up | pairs |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        pairs = " ".join(f"{r:.2f}" for r in row["pair_speedups"])
        lines.append(
            f"| {row['policy']} | {row['capacity_tokens']:,} | "
            f"{row['baseline_requests_per_cpu_s']:,.0f} | {row['requests_per_cpu_s']:,.0f} | "
            f"{row['speedup']:.2f}x | {pairs} |"
        )
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    if out := args.out:  # both files appear together or not at all
        with atomic_folder(out) as folder:
            (folder / "bench_replay_history.json").write_text(json.dumps(rows, indent=2) + "\n")
            (folder / "bench_replay_history.md").write_text(markdown)


if __name__ == "__main__":
    main()
