"""``scaling-laws reproduce``: the three papers' headline experiments at small scale.

Byte-level GPTs on the fortunes corpus (benchdata): (1) LR-annealing law fitted on constant and
cosine runs, predicting WSD and multi-step runs; (2) a Power Lines (N, D, λ) sweep giving τ_opt vs
D/N; (3) DiLoCo with M ∈ {1, 2, 4} gloo replicas vs data-parallel at equal tokens. Writes
``results.json``, PNG plots and ``summary.md``. Needs the ``reproduce`` extra.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from kernels_common import ReproduceResults
from kernels_common.report import write_summary
from scaling_laws.reproduce.settings import FULL, QUICK, Settings

__all__ = ["FULL", "QUICK", "Settings", "run"]

logger = logging.getLogger(__name__)


def run(
    out: str | Path, *, quick: bool = True, settings: Settings | None = None
) -> ReproduceResults:
    """Run all three experiments and write the report into ``out``."""
    import torch

    from scaling_laws.experiment import LMData
    from scaling_laws.reproduce import annealing, distributed, sweep

    started = time.perf_counter()
    s = settings or (QUICK if quick else FULL)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # tiny models: one thread is as fast, and robust on shared cores
    data = LMData.fortunes(s.seq_len)
    timings, claims, figures, records = {}, [], [], {}
    for name, part in (
        ("lr_annealing", lambda: annealing.run(data, s, out)),
        ("power_lines", lambda: sweep.run(data, s, out)),
        ("diloco", lambda: distributed.run(s, out)),
    ):
        begin = time.perf_counter()
        part_claims, part_figures, part_record = part()
        timings[name] = time.perf_counter() - begin
        logger.info("%s done in %.0f s", name, timings[name])
        claims += part_claims
        figures += part_figures
        records[name] = part_record
    summary = _summary(s, records, timings)
    results = ReproduceResults(
        package="scaling-laws",
        title="LR-annealing law, Power Lines τ_opt, DiLoCo vs data-parallel (tiny GPTs, fortunes)",
        claims=tuple(claims),
        figures=tuple(figures),
        summary=summary,
        quick=quick,
        settings={**s.to_dict(), "timings_s": timings, **_jsonable(records)},
        elapsed_s=time.perf_counter() - started,
    )
    results.save(out)
    write_summary(results, out)
    return results


def _jsonable(value):
    """Replace NaN by None and numpy scalars by floats, recursively (results.json is strict)."""
    import math

    import numpy as np

    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _summary(s: Settings, records: dict, timings: dict) -> str:
    law = records["lr_annealing"]["law"]
    errors = records["lr_annealing"]["mean_relative_error"]
    sweep = records["power_lines"]
    runs = records["diloco"]["runs"]
    exponent = sweep["law"]["exponents"][0] if sweep["law"] else float("nan")
    lines = [
        f"Byte-level GPT ({s.depth} layers, width {s.width}, T={s.seq_len}) on fortunes.",
        f"**LR annealing** ({s.annealing_steps} steps, batch {s.annealing_batch}): fitted on "
        f"constant + cosine: L0={law['L0']:.3f}, A={law['A']:.4f}, α={law['alpha']:.3f}, "
        f"C={law['C']:.3f} (λ={law['decay']}). Mean relative error of the predicted curve: "
        + ", ".join(f"{k} {100 * v:.2f}%" for k, v in errors.items())
        + ".",
        f"**Power Lines** ({len(sweep['records'])} runs, widths {list(s.sweep_widths)}, "
        f"steps {list(s.sweep_steps)}, τ grid {list(s.sweep_taus)}): {sweep['interior_optima']}"
        f" of {len(sweep['tau_opt'])} (N, D) settings have an interior τ_opt; fitted exponent "
        f"m = {exponent:.3f} (10–90%: {sweep['exponent_interval_10_90']}) vs the paper's −0.52.",
        f"**DiLoCo** ({s.diloco_steps} inner steps, global batch {s.diloco_batch}, "
        f"H={s.diloco_inner_steps}, Nesterov 0.9, best outer lr of {list(s.diloco_outer_lrs)}):"
        " final validation loss "
        + ", ".join(
            f"{k} {v['val_loss']:.4f} (outer lr {v.get('outer_lr', '-')}, "
            f"{v['communicated_bytes_per_replica'] / 1e6:.1f} MB all-reduced per replica)"
            for k, v in runs.items()
        )
        + ".",
        "Time per part: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ".",
    ]
    return "\n\n".join(lines)
