"""Side-by-side benchmarks: time and peak memory of several implementations on the same inputs.

:func:`measure` times one callable (warm-up, then repeated timing; CUDA events on a GPU,
``time.perf_counter`` on the CPU) and measures its peak memory in a separate call.
:func:`compare` does that for several implementations in one process run, checks their outputs
against a baseline, and returns a :class:`Comparison` that prints as a table of medians and ratios
and saves as JSON + Markdown. Absolute CPU times are noisy on shared machines; the ratios measured
in one run are what to quote.

Example:
    >>> import torch
    >>> x = torch.randn(256, 256)
    >>> table = compare(
    ...     {"matmul": lambda: x @ x, "einsum": lambda: torch.einsum("ij,jk->ik", x, x)},
    ...     baseline="matmul",
    ...     repeat=3,
    ...     warmup=1,
    ... )
    >>> sorted(row.name for row in table.rows)
    ['einsum', 'matmul']
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernels_common.cli import atomic_file
from kernels_common.memory import PeakMemory, peak_memory
from kernels_common.results import encode_float
from kernels_common.testing import Tolerance, compare_tensors, flatten_tensors, rebuild_sequence


@dataclass(frozen=True)
class Measurement:
    """Timing (seconds) and peak memory (bytes) of one implementation."""

    median_s: float
    q1_s: float
    q3_s: float
    min_s: float
    repeat: int
    peak_memory_bytes: int | None
    memory_method: str | None

    @property
    def iqr_s(self) -> float:
        """Interquartile range of the timings: the spread to read a ratio against."""
        return self.q3_s - self.q1_s


def _time_once(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes: CUDA events on a GPU, ``perf_counter`` elsewhere."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    start_s = time.perf_counter()
    fn()
    return time.perf_counter() - start_s


def _summarize(samples: list[float], peak: PeakMemory | None) -> Measurement:
    if len(samples) < 2:
        q1 = q3 = samples[0]
    else:
        q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return Measurement(
        median_s=statistics.median(samples),
        q1_s=q1,
        q3_s=q3,
        min_s=min(samples),
        repeat=len(samples),
        peak_memory_bytes=None if peak is None else peak.bytes,
        memory_method=None if peak is None else peak.method,
    )


def _check_counts(warmup: int, repeat: int) -> None:
    if warmup < 0 or repeat < 1:
        raise ValueError(f"need warmup >= 0 and repeat >= 1, got warmup={warmup}, repeat={repeat}")


def measure(
    fn: Callable[[], Any],
    *,
    device: str | torch.device = "cpu",
    warmup: int = 3,
    repeat: int = 10,
    memory: bool = True,
) -> Measurement:
    """Time ``fn()`` and measure its peak memory.

    Args:
        fn: the work to time, with its inputs already made (closures over prepared tensors). Make
            it stateless: memory it frees that was allocated before the call lowers its peak.
        device: where ``fn`` runs: ``"cuda"`` times with CUDA events and reads the CUDA allocator's
            peak; anything else uses ``time.perf_counter`` and the process's peak RSS.
        warmup: untimed calls first (compilation, autotuning, caches).
        repeat: timed calls; the median is reported with the quartiles.
        memory: also measure peak memory, in one extra call.
    """
    _check_counts(warmup, repeat)
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    samples = [_time_once(fn, device) for _ in range(repeat)]
    return _summarize(samples, peak_memory(fn, device) if memory else None)


@dataclass(frozen=True)
class Row:
    """One implementation in a comparison, with ratios to the baseline."""

    name: str
    measurement: Measurement
    time_ratio: float
    memory_ratio: float | None
    max_abs_error: float | None


def hardware_description(device: str | torch.device = "cpu") -> str:
    """The processor or GPU the numbers come from, for tables and READMEs."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


@dataclass(frozen=True)
class Comparison:
    """A side-by-side benchmark: rows in the order given, ratios against ``baseline``."""

    title: str
    baseline: str
    rows: tuple[Row, ...]
    device: str
    environment: dict[str, str] = field(default_factory=dict)

    def row(self, name: str) -> Row:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no row named {name!r}; have {[r.name for r in self.rows]}")

    def to_markdown(self) -> str:
        lines = [
            f"### {self.title}",
            "",
            f"{self.environment.get('hardware', self.device)}; torch "
            f"{self.environment.get('torch', '?')}; {self.environment.get('date', '')}; ratios vs "
            f"`{self.baseline}` (lower is better)",
            "",
            "| implementation | median (ms) | IQR (ms) | time ratio | peak memory (MiB) "
            "| memory ratio | max abs err vs baseline |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in self.rows:
            m = row.measurement
            memory = "-" if m.peak_memory_bytes is None else f"{m.peak_memory_bytes / 2**20:.1f}"
            memory_ratio = "-" if row.memory_ratio is None else f"{row.memory_ratio:.2f}x"
            error = "-" if row.max_abs_error is None else f"{row.max_abs_error:.1e}"
            lines.append(
                f"| {row.name} | {m.median_s * 1e3:.3f} | {m.iqr_s * 1e3:.3f} "
                f"| {row.time_ratio:.2f}x | {memory} | {memory_ratio} | {error} |"
            )
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "baseline": self.baseline,
            "device": self.device,
            "environment": self.environment,
            "rows": [
                {
                    **asdict(row),
                    "measurement": {**asdict(row.measurement), "iqr_s": row.measurement.iqr_s},
                    "max_abs_error": (
                        None if row.max_abs_error is None else encode_float(row.max_abs_error)
                    ),
                }
                for row in self.rows
            ],
        }

    def save(self, directory: str | Path, name: str) -> tuple[Path, Path]:
        """Write ``<name>.json`` and ``<name>.md`` into ``directory``; return both paths."""
        directory = Path(directory)
        json_path, md_path = directory / f"{name}.json", directory / f"{name}.md"
        for path, text in (
            (json_path, json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n"),
            (md_path, self.to_markdown()),
        ):
            with atomic_file(path) as temporary:  # whole tables or none
                temporary.write_text(text)
        return json_path, md_path

    def __str__(self) -> str:
        return self.to_markdown()


def _max_abs_error(output: Any, reference: Any) -> float:
    """Largest absolute difference over all output tensors, with :func:`compare_tensors`'s rules
    (NaN where the baseline is finite counts as infinite; matching NaN/inf count as equal)."""
    worst = 0.0
    pairs = zip(flatten_tensors(output, "out"), flatten_tensors(reference, "out"), strict=True)
    for (name, a), (_, b) in pairs:
        if (a is None) != (b is None):
            raise ValueError(f"{name}: one of this candidate and the baseline returned None")
        if a is None:
            continue
        if a.shape != b.shape:
            raise ValueError(
                f"{name}: shape {tuple(a.shape)} differs from the baseline's {tuple(b.shape)}"
            )
        worst = max(worst, compare_tensors(name, a, b, Tolerance(0.0, 0.0)).max_abs_error)
    return worst


def _snapshot(output: Any) -> Any:
    """A copy of the baseline output that later calls cannot overwrite in place."""
    if isinstance(output, torch.Tensor):
        return output.detach().clone()
    if isinstance(output, tuple | list):
        return rebuild_sequence(output, (_snapshot(o) for o in output))
    if isinstance(output, Mapping):
        return {k: _snapshot(v) for k, v in output.items()}
    return output


def drop_failing(
    candidates: Mapping[str, Callable[[], Any]],
) -> tuple[dict[str, Callable[[], Any]], dict[str, str]]:
    """Call every candidate once; keep those that run, and say why each other one failed.

    For optional peers (an anchor library that may not build on this machine's compiler, driver or
    dtype): a benchmark drops them with a printed reason instead of losing the whole table. The
    call counts as the candidate's first warm-up (it compiles kernels, fills caches).

    Returns:
        ``(working, failed)``: the candidates that returned, in their order, and ``name -> "Type:
        message"`` for each one that raised.
    """
    working: dict[str, Callable[[], Any]] = {}
    failed: dict[str, str] = {}
    for name, fn in candidates.items():
        try:
            fn()
        except Exception as error:  # any failure means "this peer cannot run here"
            failed[name] = f"{type(error).__name__}: {error}".splitlines()[0]
        else:
            working[name] = fn
    return working, failed


def compare(
    candidates: Mapping[str, Callable[[], Any]],
    *,
    baseline: str,
    title: str = "benchmark",
    device: str | torch.device = "cpu",
    warmup: int = 3,
    repeat: int = 10,
    memory: bool = True,
    check_outputs: bool = True,
) -> Comparison:
    """Benchmark ``candidates`` side by side on the same inputs, in this process.

    Every candidate is warmed up, then the timed calls run in interleaved rounds (one call of each
    candidate per round), then each one's peak memory is measured in one more call.

    Args:
        candidates: name -> zero-argument callable doing the work (inputs captured, shared).
        baseline: the name the ratios are taken against (the anchor, or the non-optimised run).
        title: heading of the table.
        device: where the callables run (see :func:`measure`).
        warmup: untimed calls per candidate (see :func:`measure`).
        repeat: rounds of timed calls, one call of every candidate per round.
        memory: also measure each candidate's peak memory, in one more call.
        check_outputs: call each candidate once more and report the largest absolute difference
            of its output from the baseline's (outputs must have the same structure); ``None``
            entries in the table mean the check was off.
    """
    if baseline not in candidates:
        raise ValueError(f"baseline {baseline!r} is not one of the candidates {list(candidates)}")
    _check_counts(warmup, repeat)
    device = torch.device(device)
    reference = _snapshot(candidates[baseline]()) if check_outputs else None
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    # Interleaved rounds: a slow drift of the machine (other load, clocks, heat) shifts every
    # candidate alike instead of whichever happened to run last, so the ratios stay fair.
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeat):
        for name, fn in candidates.items():
            samples[name].append(_time_once(fn, device))
    measurements = {
        name: _summarize(samples[name], peak_memory(fn, device) if memory else None)
        for name, fn in candidates.items()
    }
    base = measurements[baseline]
    rows = []
    for name, fn in candidates.items():
        m = measurements[name]
        memory_ratio = None  # bytes measured two different ways do not divide
        if (
            m.peak_memory_bytes is not None
            and base.peak_memory_bytes
            and m.memory_method == base.memory_method
        ):
            memory_ratio = m.peak_memory_bytes / base.peak_memory_bytes
        error = _max_abs_error(fn(), reference) if check_outputs else None
        rows.append(Row(name, m, m.median_s / base.median_s, memory_ratio, error))
    environment = {
        "hardware": hardware_description(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": dt.date.today().isoformat(),
    }
    return Comparison(title, baseline, tuple(rows), str(torch.device(device)), environment)
