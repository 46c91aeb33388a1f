"""CADS-E against the conventional bilevel solvers, side by side in one process: the same
problem (mixed-source Fashion-MNIST, small CNN), the same number of outer steps and draws, at
budgets 10x apart.

    python packages/cads/benchmarks/bench_bilevel.py --out reports/bench/cads

Bilevel-CADS (the paper's "conventional bilevel implementation": K fresh models trained for the
whole budget per outer step) is the baseline of the ratios; implicit differentiation (one
budgeted run per step, then a conjugate-gradient inverse-Hessian-vector product) runs beside
them. CADS-E's time includes fitting its loss surrogate. The paper reports 3-20x, growing with
the budget, at its K = 5 draws and M = 100 outer steps (the defaults here). Bilevel-CADS costs
about K·M·C steps, CADS-E F·C (F surrogate runs) plus M passes over the pool, so the ratio grows
with the budget towards K·M/F; implicit differentiation costs M·C steps plus its
inverse-Hessian products, a ratio that tends to M/F. About 10 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import cads
from kernels_common import compare, hardware_description


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu only: the models are tiny")
    parser.add_argument("--budgets", default="10,30,100", help="inner steps, comma-separated")
    parser.add_argument("--outer-steps", type=int, default=100, help="the paper's M")
    parser.add_argument("--samples", type=int, default=5, help="the paper's K")
    parser.add_argument("--per-source", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("reports/bench/cads"))
    args = parser.parse_args()
    if args.device != "cpu":
        print(f"bench_bilevel.py runs on the CPU only; --device {args.device} ignored")

    torch.set_num_threads(2)
    task = cads.mixed_fashion_mnist(args.per_source)
    inner = cads.InnerConfig(batch_size=64, lr=3e-3)
    # the quick reproduce's surrogate: 5 of the paper's 8 fractions
    config = cads.SelectConfig(outer_steps=args.outer_steps, samples=args.samples,
                               fractions=(0.01, 0.05, 0.1, 0.5, 0.9))  # fmt: skip
    lines = [f"{hardware_description('cpu')}; {len(task)} pool examples, {args.outer_steps} outer "
             f"steps, K = {args.samples}", "", "| budget (steps) | Bilevel-CADS / CADS-E | "
             "implicit / CADS-E |", "|---:|---:|---:|"]  # fmt: skip
    for budget in (int(b) for b in args.budgets.split(",")):

        def run(method, budget=budget):
            return lambda: cads.select(task, budget, method, config=config, inner=inner,
                                       progress=False)  # fmt: skip

        comparison = compare(
            {m: run(m) for m in ("bilevel-e", "cads-e", "implicit-e")}, baseline="bilevel-e",
            title=f"selection time at a budget of {budget} steps", warmup=0, repeat=args.repeat,
            memory=False, check_outputs=False,
        )  # fmt: skip
        comparison.save(args.out, f"bilevel_{budget}")
        print(comparison)
        cads_ratio = comparison.row("cads-e").time_ratio
        implicit_ratio = comparison.row("implicit-e").time_ratio
        lines.append(f"| {budget} | {1 / cads_ratio:.1f}x | {implicit_ratio / cads_ratio:.1f}x |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bilevel_speedup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
