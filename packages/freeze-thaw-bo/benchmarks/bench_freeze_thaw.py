"""Side by side, one run: learning-curve extrapolation of the surrogates, and the cost of an ask.

1. Extrapolation on the real Fashion-MNIST MLP curves (benchdata): half of the configurations
   are observed to their end (the context), the other half up to epoch k; each surrogate samples
   the rest. Scored by the mean absolute error of the sampled median at the last epoch, the
   coverage of the 10-90% band there, and the seconds per prediction. Surrogates: ours (the
   shipped learning-curve PFN, joint and per-epoch-marginal sampling), DPL's power-law ensemble,
   the freeze-thaw GP, and the anchor's FT-PFN from the `ifbo` package where it can run (its
   weights download at construction, so offline it reports that error instead of a number).
2. Milliseconds per `ask` for every method at the same pool size and history.

    python benchmarks/bench_freeze_thaw.py [--configs 100] [--prefix 5 10] [--out DIR]

Writes bench_freeze_thaw.json and .md into --out (default reports/bench/freeze-thaw-bo).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import benchdata
from freeze_thaw_bo import CurveObservations, CurveTable, Utility, make_optimizer
from freeze_thaw_bo.methods import METHODS
from freeze_thaw_bo.surrogates.dpl import DPLSurrogate
from freeze_thaw_bo.surrogates.gp import FreezeThawGPSurrogate
from freeze_thaw_bo.surrogates.pfn import PFNSurrogate


def _anchor_ftpfn() -> tuple[object | None, str]:
    """The anchor's FT-PFN, or why it cannot run here."""
    try:
        from ifbo.surrogate import FTPFN
    except ImportError as err:
        return None, f"ifbo not installed ({err})"
    try:
        return FTPFN(version="0.0.1"), "ok"
    except Exception as err:
        return None, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"


def extrapolation(table: CurveTable, prefix: int, surrogates: dict, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    n, t = table.values.shape
    order = rng.permutation(n)
    context, query = order[: n // 2], order[n // 2 :]
    curves = []
    for i in range(n):
        keep = t if i in set(context) else prefix
        curves.append(table.values[i, :keep])
    obs = CurveObservations(table.space.encode(list(table.configs)), tuple(curves), t)
    truth = table.values[query, -1]
    rows = []
    for name, surrogate in surrogates.items():
        start = time.perf_counter()
        samples = surrogate.sample_curves(obs, 500, torch.Generator().manual_seed(seed))
        seconds = time.perf_counter() - start
        last = samples[query, :, -1].numpy()
        lo, med, hi = np.quantile(last, [0.1, 0.5, 0.9], axis=1)
        rows.append(
            {
                "surrogate": name,
                "prefix": prefix,
                "mae_final": float(np.mean(np.abs(med - truth))),
                "coverage_10_90": float(np.mean((truth >= lo) & (truth <= hi))),
                "seconds": seconds,
            }
        )
    return rows


def ask_latency(table: CurveTable, repeats: int = 5) -> list[dict]:
    rows = []
    for method in METHODS:
        kwargs = {"num_samples": 1000} if method == "cfbo" else {}
        opt = make_optimizer(method, table, Utility(2**-4, budget=300), budget=300, **kwargs)
        for _ in range(40):  # a history of 40 observations
            trial, epoch = opt.ask(ignore_stop=True)
            opt.tell(trial, epoch, float(table.values[trial, epoch - 1]))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            trial, epoch = opt.ask(ignore_stop=True)
            times.append(time.perf_counter() - start)
            opt.tell(trial, epoch, float(table.values[trial, epoch - 1]))
        rows.append({"method": method, "ms_per_ask": 1000 * float(np.median(times))})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=100)
    parser.add_argument("--prefix", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--out", type=Path, default=Path("reports/bench/freeze-thaw-bo"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = CurveTable.from_curves(benchdata.fashion_mnist_curves(), max_configs=args.configs)
    surrogates = {
        "pfn (ours, joint)": PFNSurrogate(sampling="quantile"),
        "pfn (ours, marginal)": PFNSurrogate(sampling="marginal"),
        "dpl": DPLSurrogate(),
        "freeze-thaw gp": FreezeThawGPSurrogate(),
    }
    anchor, anchor_status = _anchor_ftpfn()
    extrap = [row for k in args.prefix for row in extrapolation(table, k, surrogates)]
    latency = ask_latency(table)
    report = {
        "table": f"{table.name}: {table.values.shape[0]} configs × {table.values.shape[1]} epochs",
        "anchor_ftpfn": anchor_status if anchor is None else "ran",
        "extrapolation": extrap,
        "ask_latency": latency,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_freeze_thaw.json").write_text(json.dumps(report, indent=1))
    lines = [
        f"Table: {report['table']}. Anchor FT-PFN (ifbo): {report['anchor_ftpfn']}.",
        "",
        "| surrogate | prefix epochs | MAE of final value | 10-90% coverage | seconds |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['surrogate']} | {r['prefix']} | {r['mae_final']:.4f} | {r['coverage_10_90']:.2f} "
        f"| {r['seconds']:.2f} |"
        for r in extrap
    ]
    lines += ["", "| method | ms per ask |", "|---|---:|"]
    lines += [f"| {r['method']} | {r['ms_per_ask']:.1f} |" for r in latency]
    (args.out / "bench_freeze_thaw.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
