"""Time and peak memory of fwd+bwd vs sequence length: chunkwise vs parallel vs attention."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from kernels_common.bench import compare
from kernels_common.plotting import plot_curves
from tfla_mlstm.bench import _run, make_inputs, sdpa
from tfla_mlstm.ops import mlstm_chunkwise, mlstm_parallel

IMPLEMENTATIONS = {
    "chunkwise (L=64)": functools.partial(mlstm_chunkwise, chunk_size=64, backend="reference"),
    "parallel": mlstm_parallel,
    "attention (SDPA)": sdpa,
}


def log_log_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x``: 1 = linear growth, 2 = quadratic."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def run_scaling(out: Path, seq_lens: list[int], repeat: int) -> dict:
    """Measure every implementation at every length; write two plots; return the curves."""
    curves = {name: {"S": [], "ms": [], "MiB": []} for name in IMPLEMENTATIONS}
    for S in seq_lens:
        inputs = make_inputs(1, 4, S, 64, 128, torch.float32, "cpu")
        grad = torch.randn(1, 4, S, 128, generator=torch.Generator().manual_seed(1))
        calls = {
            name: functools.partial(_run, fn, inputs, grad, "qkv" if "SDPA" in name else "qkvif")
            for name, fn in IMPLEMENTATIONS.items()
        }
        table = compare(
            calls, baseline="attention (SDPA)", title=f"S={S}", repeat=repeat, warmup=1,
            check_outputs=False,
        )  # fmt: skip
        for row in table.rows:
            curves[row.name]["S"].append(S)
            curves[row.name]["ms"].append(row.measurement.median_s * 1e3)
            curves[row.name]["MiB"].append(row.measurement.peak_memory_bytes / 2**20)
    for key, label in (("ms", "fwd+bwd time (ms)"), ("MiB", "peak memory (MiB)")):
        plot_curves(
            {name: (c["S"], c[key]) for name, c in curves.items()},
            out / f"scaling_{'time' if key == 'ms' else 'memory'}.png",
            title=f"mLSTM fwd+bwd vs length (B=1, NH=4, DQK=64, DV=128, CPU): {label}",
            xlabel="sequence length S",
            ylabel=label,
            logx=True,
            logy=True,
            markers=True,
        )
    return curves
