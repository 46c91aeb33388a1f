"""Peak memory of one call: the CUDA allocator on GPU, the process's peak RSS on CPU.

On Linux the kernel keeps the process's resident-set high-water mark (``VmHWM``) and resets it to
the current RSS when ``5`` is written to ``/proc/self/clear_refs``; the peak of a call is then the
high-water mark after it minus the RSS before it. This sees every allocation (PyTorch's CPU
allocator, NumPy, Python objects). Where that file cannot be written, ``tracemalloc`` is used
instead; it only sees allocations made through Python's allocator (NumPy's, not PyTorch's), and
:func:`peak_memory` says which method it used.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")

MemoryMethod = Literal["cuda-allocator", "peak-rss", "tracemalloc"]


@dataclass(frozen=True)
class PeakMemory:
    """Bytes a call needed above what was allocated before it, and how that was measured."""

    bytes: int
    method: MemoryMethod


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not found in {_STATUS}")


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)


def _release_free_heap() -> None:
    """Give memory that glibc keeps after ``free`` back to the system, so the next call's
    allocations show up in RSS instead of silently reusing that memory."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _reset_peak_rss(attempts: int = 3) -> bool:
    for _ in range(attempts):  # another thread allocating between write and read spoils one try
        try:
            _CLEAR_REFS.write_text("5")
        except OSError:
            return False
        if _status_kib("VmHWM") <= _status_kib("VmRSS") + 4:  # reset took effect
            return True
    return False


def peak_memory(fn: Callable[[], Any], device: str | torch.device = "cpu") -> PeakMemory:
    """Peak memory of ``fn()`` in bytes above the memory in use just before the call.

    Memory that ``fn`` frees during the call but was allocated before it (a ``.grad`` replaced,
    a cache dropped) lowers the result: benchmark stateless callables that keep nothing between
    calls.
    """
    device = torch.device(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return PeakMemory(
            max(0, torch.cuda.max_memory_allocated(device) - before), "cuda-allocator"
        )
    _release_free_heap()
    if _STATUS.exists() and _reset_peak_rss():
        before = _status_kib("VmRSS")
        fn()
        return PeakMemory(max(0, _status_kib("VmHWM") - before) * 1024, "peak-rss")
    already_tracing = tracemalloc.is_tracing()
    if not already_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not already_tracing:
            tracemalloc.stop()
    return PeakMemory(max(0, peak - before), "tracemalloc")
