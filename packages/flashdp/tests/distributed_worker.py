"""One rank of the distributed tests: ``torchrun --nproc-per-node W distributed_worker.py OUT``
runs every case of ``distributed_cases`` under DDP (gloo) and saves this rank's results to
``OUT/rank<r>.pt``."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import distributed_cases
import torch
import torch.distributed as dist


def main() -> None:
    # a hang (a rank missing from a collective) fails the test instead of blocking it
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        results = distributed_cases.run_all(rank, world)
        torch.save(results, Path(sys.argv[1]) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
