"""mLSTM chunkwise fwd+bwd: tfla-mlstm vs mlstm-kernels vs causal attention, side by side.

    python packages/tfla-mlstm/benchmarks/bench_chunkwise.py --device cpu --out DIR
    python packages/tfla-mlstm/benchmarks/bench_chunkwise.py --device cuda --out DIR

CPU: B=1, NH=4, DQK=64, DV=128, float32, S in {512, 2048, 8192}; our PyTorch chunkwise path vs the
anchor's ``chunkwise--native_autograd`` (ratio baseline) and ``parallel--native_autograd`` and
torch SDPA. CUDA: bf16, B*S = 65,536, NH=16, DQK=128, DV=256, S in {2048, 8192, 32768}, forward and
fwd+bwd, our TFLA kernels (mLSTM and mLSTMsig) vs the anchor's ``chunkwise--triton_xl_chunk``
(baseline) and SDPA. Tables (JSON + Markdown) go to ``--out``; each is built with
``kernels_common.bench.compare``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from tfla_mlstm.bench import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("reports/bench/tfla-mlstm"))
    parser.add_argument("--seq-lens", type=int, nargs="+", default=None)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--exclude", nargs="+", default=(), help="leave out candidates whose name contains these"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    run(args.device, args.out, args.seq_lens, args.repeat, exclude=args.exclude)


if __name__ == "__main__":
    main()
