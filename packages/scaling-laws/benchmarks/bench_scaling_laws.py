"""LR-annealing fit: scaling_laws.fit vs scipy.optimize.curve_fit (time and held-out accuracy).

python packages/scaling-laws/benchmarks/bench_scaling_laws.py --device cpu \\
    --out reports/bench/scaling-laws
"""

from __future__ import annotations

import argparse
import logging

from scaling_laws.benchmark import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=None, help="folder for bench_scaling_laws.json/.md")
    parser.add_argument("--quick", action="store_true", help="shorter curves (smoke test)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    if args.device == "cuda":
        print("the fitting benchmark is CPU-only (numpy/scipy); nothing to run on cuda")
        return
    table, errors = run(args.device, args.out, quick=args.quick, repeat=args.repeat)
    print(table.to_markdown())
    print("worst relative error of the held-out WSD prediction:", errors)


if __name__ == "__main__":
    main()
