"""Throughput of the simulator (requests/s, one core) for LRU (the vLLM/SGLang policy) and LPC
on a ShareGPT trace, and of batched predictor inference (predictions/s). Needs the ``bench``
extra (benchdata ShareGPT + cl100k)."""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from kernels_common.bench import compare, hardware_description, measure
from kernels_common.cli import atomic_folder
from lpc_cache.predictor import ContinuationPredictor, PredictorConfig
from lpc_cache.simulator import prepare, simulate
from lpc_cache.trace import TraceConfig, sharegpt_trace

logger = logging.getLogger(__name__)

CAPACITY_FRACTIONS = (0.05, 0.25)  # of the trace's distinct-block footprint: tight and roomy


def run(out: str | Path | None = None, *, conversations: int = 2000, repeat: int = 5) -> str:
    """Run both benchmarks; return Markdown (and write ``bench_lpc_cache.{json,md}`` to ``out``)."""
    torch.set_num_threads(1)
    trace = sharegpt_trace(conversations, TraceConfig(seed=0))
    # hashing is done once per trace and block size, not per replay
    footprint = prepare(trace).footprint_blocks * 16
    rng = np.random.default_rng(0)
    probabilities = rng.uniform(0.2, 0.9, len(trace))  # LPC's cost does not depend on the values
    rows, tables = [], []
    for fraction in CAPACITY_FRACTIONS:
        capacity = int(fraction * footprint)
        candidates = {
            name: (
                lambda name=name, capacity=capacity: simulate(
                    trace, name, capacity, probabilities=probabilities
                )
            )
            for name in ("lru", "lpc", "fifo")
        }
        table = compare(
            candidates,
            baseline="lru",
            title=f"simulator, {len(trace)} ShareGPT requests, capacity {capacity:,} tokens",
            warmup=1,
            repeat=repeat,
            memory=False,
            check_outputs=False,
        )
        tables.append(table.to_markdown())
        # CPU seconds of this process: what one core delivers, whatever else shares the machine
        hit, cpu = {}, {}
        for name, fn in candidates.items():
            samples = []
            for _ in range(3):
                start = time.process_time()
                hit[name] = fn()
                samples.append(time.process_time() - start)
            cpu[name] = statistics.median(samples)
        for row in table.rows:
            rows.append(
                {
                    "benchmark": "simulator",
                    "capacity_tokens": capacity,
                    "policy": row.name,
                    "requests_per_s": len(trace) / row.measurement.median_s,
                    "requests_per_cpu_s": len(trace) / cpu[row.name],
                    "time_ratio_vs_lru": row.time_ratio,
                    "hit_ratio": hit[row.name].hit_ratio,
                }
            )
    predictor = ContinuationPredictor(PredictorConfig())
    x = rng.normal(size=(8192, predictor.config.input_dim)).astype(np.float32)
    batched = measure(lambda: predictor.predict_proba(x), warmup=1, repeat=repeat, memory=False)
    one = x[:1]
    single = measure(lambda: predictor.predict_proba(one), warmup=5, repeat=50, memory=False)
    rows.append(
        {"benchmark": "predictor", "batch": 8192, "predictions_per_s": 8192 / batched.median_s}
    )
    rows.append({"benchmark": "predictor", "batch": 1, "predictions_per_s": 1 / single.median_s})
    lines = [
        f"{hardware_description('cpu')}, one thread; trace: {len(trace)} requests of "
        f"{len(trace.conversations)} ShareGPT conversations, footprint {footprint:,} tokens",
        "",
        "| benchmark | setting | per wall-clock s | per CPU s | speed vs LRU | hit ratio |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row["benchmark"] == "simulator":
            lines.append(
                f"| simulator {row['policy']} | {row['capacity_tokens']:,} tokens | "
                f"{row['requests_per_s']:,.0f} | {row['requests_per_cpu_s']:,.0f} | "
                f"{1 / row['time_ratio_vs_lru']:.2f}x | "
                f"{row['hit_ratio']:.3f} |"
            )
        else:
            rate = row["predictions_per_s"]
            lines.append(f"| predictor | batch {row['batch']} | {rate:,.0f} | - | - | - |")
    markdown = "\n".join(lines) + "\n\n" + "\n".join(tables)
    if out is not None:  # both files appear together or not at all
        with atomic_folder(out) as folder:
            (folder / "bench_lpc_cache.json").write_text(json.dumps(rows, indent=2) + "\n")
            (folder / "bench_lpc_cache.md").write_text(markdown)
    return markdown
