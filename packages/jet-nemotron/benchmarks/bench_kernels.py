"""Gated delta rule fwd(+bwd): jet-nemotron vs FLA vs causal attention, side by side.

    python packages/jet-nemotron/benchmarks/bench_kernels.py --device cpu --out DIR
    python packages/jet-nemotron/benchmarks/bench_kernels.py --device cuda --out DIR

Settings and candidates: see ``jet_nemotron.bench.kernels``. Tables (JSON + Markdown) go to
``--out``; each is built with ``kernels_common.bench.compare``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from jet_nemotron.bench.kernels import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("reports/bench/jet-nemotron"))
    parser.add_argument("--seq-lens", type=int, nargs="+", default=None)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    run(args.device, args.out, args.seq_lens, args.repeat)


if __name__ == "__main__":
    main()
