"""Train a small GPT-2 privately on several processes: flashdp under DistributedDataParallel.

    torchrun --standalone --nproc-per-node 2 packages/flashdp/examples/ddp_gpt2.py --steps 20

Runs on the CPU with gloo, or on one GPU per process with NCCL. The privacy unit is one window of
``--seq-len`` + 1 bytes of the text file (by default this script's own source). Every step draws
one Poisson batch over all windows (``DistributedPoissonSampler``: the same draw on every rank,
split between the ranks), each rank clips its own examples inside the backward, and the
released gradient, identical on every rank, carries one noise draw.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from transformers import GPT2Config, GPT2LMHeadModel

import flashdp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=Path(__file__))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16, help="expected logical batch size")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # NCCL's collectives run on the current device
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    try:
        text = args.text.read_bytes()
        window = args.seq_len + 1
        windows = torch.tensor(list(text[: len(text) // window * window])).view(-1, window)
        q = args.batch / len(windows)
        sigma = flashdp.get_noise_multiplier(args.epsilon, 1e-5, sample_rate=q, steps=args.steps)
        sampler = flashdp.DistributedPoissonSampler(
            len(windows), q, seed=args.seed, steps=args.steps
        )

        torch.manual_seed(args.seed)  # DDP broadcasts rank 0's parameters anyway
        config = GPT2Config(
            vocab_size=256, n_positions=args.seq_len, n_embd=64, n_layer=2, n_head=2,
            bos_token_id=0, eos_token_id=0,
            tie_word_embeddings=False,  # a parameter shared by two layers cannot be clipped
        )  # fmt: skip
        model = GPT2LMHeadModel(config).to(device)
        model = flashdp.make_private(
            model,
            max_grad_norm=1.0,
            noise_multiplier=sigma,
            expected_batch_size=sampler.expected_batch_size,
            sample_rate=q,
            generator=torch.Generator(device).manual_seed(args.seed),  # rank 0 draws the noise
        )
        ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
        controller = flashdp.get_controller(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        for step, indices in enumerate(sampler):
            # An empty local batch still runs forward and backward (DDP's collectives need every
            # rank), on a placeholder example whose loss is multiplied by 0: its clipped gradient
            # is exactly zero, and the denominator is the expected batch size anyway.
            batch = windows[indices if indices else [0]].to(device)
            with controller.accumulate():
                logits = ddp(batch[:, :-1]).logits  # default positions: (B, T), one row each
                loss = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:])
                (loss if indices else 0.0 * loss).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
                print(f"step {step}: local loss {loss.item():.3f} ({len(indices)} examples)")
        if rank == 0:
            print(f"ε = {controller.epsilon(1e-5):.2f} at δ = 1e-5 after {controller.steps} steps")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
