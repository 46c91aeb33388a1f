"""Wall time and peak memory of a block of work.

On CUDA the peak is `torch.cuda.max_memory_allocated` above the allocation at entry. On CPU it is
the peak resident set size above the RSS at entry, sampled every `interval` seconds by a thread
(Linux `/proc/self/statm`; elsewhere `resource`'s lifetime peak, which is only an upper bound).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Measurement:
    seconds: float = 0.0
    peak_bytes: int = 0
    source: str = ""


@contextmanager
def measure(device: torch.device | str = "cpu", *, interval: float = 0.005):
    """`with measure(device) as m: ...` then `m.seconds`, `m.peak_bytes`."""
    device = torch.device(device)
    result = Measurement()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        yield result
        torch.cuda.synchronize(device)
        result.seconds = time.perf_counter() - start
        result.peak_bytes = max(0, torch.cuda.max_memory_allocated(device) - base)
        result.source = "cuda max_memory_allocated"
        return
    base = _rss_bytes()
    if base is None:
        import resource

        start = time.perf_counter()
        yield result
        result.seconds = time.perf_counter() - start
        result.peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        result.source = "ru_maxrss (process lifetime peak)"
        return
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval):
            rss = _rss_bytes()
            if rss is not None and rss > peak[0]:
                peak[0] = rss

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    try:
        yield result
    finally:
        result.seconds = time.perf_counter() - start
        stop.set()
        thread.join()
        peak[0] = max(peak[0], _rss_bytes() or 0)
        result.peak_bytes = peak[0] - base
        result.source = "peak RSS above entry (sampled)"
