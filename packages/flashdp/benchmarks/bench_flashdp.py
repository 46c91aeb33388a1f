"""Step time and peak memory: non-DP vs flashdp (per-layer, flat) vs Opacus (hooks, ghost).

python packages/flashdp/benchmarks/bench_flashdp.py --device cpu --out reports/bench/flashdp
"""

from __future__ import annotations

import argparse

from flashdp.benchmark import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=None, help="folder for bench_flashdp.json/.md")
    parser.add_argument("--quick", action="store_true", help="a smaller model (smoke test)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(run(args.device, args.out, quick=args.quick, repeat=args.repeat).to_markdown())


if __name__ == "__main__":
    main()
