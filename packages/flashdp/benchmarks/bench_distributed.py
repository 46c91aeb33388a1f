"""Step time and peak memory of private vs non-private training under DDP and FSDP2.

python packages/flashdp/benchmarks/bench_distributed.py --procs 2 --out reports/bench/flashdp

Launches itself under torchrun (gloo on the CPU, NCCL with one GPU per process on ``cuda``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--procs", type=int, default=2, help="processes (one GPU each on cuda)")
    parser.add_argument("--out", default=None, help="folder for bench_flashdp_distributed.*")
    parser.add_argument("--quick", action="store_true", help="a smaller model (smoke test)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        launch += ["--nproc-per-node", str(args.procs), __file__, *sys.argv[1:]]
        sys.exit(subprocess.call(launch, env={**os.environ, "OMP_NUM_THREADS": "1"}))

    from flashdp.benchmark import run_distributed

    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=10))
    try:
        device = "cpu"
        if cuda:
            device = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(device)
        table = run_distributed(device, args.out, quick=args.quick, repeat=args.repeat)
        if dist.get_rank() == 0:
            print(table.to_markdown())
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
