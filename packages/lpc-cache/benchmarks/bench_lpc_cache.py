"""Simulator requests/s (LRU, the vLLM/SGLang policy, vs LPC and FIFO) on a ShareGPT trace, and
batched predictor predictions/s.

python packages/lpc-cache/benchmarks/bench_lpc_cache.py --device cpu --out reports/bench/lpc-cache
"""

from __future__ import annotations

import argparse

from lpc_cache.benchmark import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cpu only")
    parser.add_argument("--out", default=None, help="folder for bench_lpc_cache.json/.md")
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(run(args.out, conversations=args.conversations, repeat=args.repeat))


if __name__ == "__main__":
    main()
