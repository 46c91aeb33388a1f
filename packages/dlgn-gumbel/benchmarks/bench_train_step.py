"""Training step time (forward + backward + Adam) of a logic gate network: dlgn-gumbel vs difflogic.

difflogic's python LogicLayer (its CPU implementation) is fetched from PyPI at run time; if that
fails the anchor rows are skipped with a message. On a GPU where difflogic's CUDA extension was
built in place (see ``dlgn_gumbel.bench``), its CUDA layer is the anchor. Both networks get the same
connections and logits (checked: same outputs).

python packages/dlgn-gumbel/benchmarks/bench_train_step.py --out reports/bench/dlgn-gumbel
"""

from __future__ import annotations

import argparse

import torch

from dlgn_gumbel import LogicNet
from dlgn_gumbel.bench import copy_into_difflogic, difflogic_has_cuda, load_difflogic
from kernels_common.bench import compare


def _step(model: torch.nn.Module, optim: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor):
    def run() -> torch.Tensor:
        model.train()
        scores = model(x)
        loss = torch.nn.functional.cross_entropy(scores, y)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        return scores.detach()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=None, help="folder for bench_train_step.json/.md")
    parser.add_argument("--layers", default="4000x3", help="width x depth")
    parser.add_argument("--in-dim", type=int, default=2352, help="784 pixels x 3 thresholds")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    width, depth = (int(v) for v in args.layers.split("x"))
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(args.batch_size, args.in_dim, generator=g) > 0.5).float().to(device)
    y = torch.randint(0, 10, (args.batch_size,), generator=g).to(device)

    variants = [("dlgn-gumbel softmax", "softmax", None), ("dlgn-gumbel gumbel", "gumbel", None)]
    if device.type == "cuda":  # the Triton kernel (auto) against our own PyTorch path on the GPU
        variants.append(("dlgn-gumbel softmax, PyTorch path", "softmax", "reference"))
    candidates = {}
    nets = {}
    for name, relaxation, backend in variants:
        net = LogicNet(
            args.in_dim, [width] * depth, 10, tau=10.0, relaxation=relaxation, seed=0,
            backend=backend,
        ).to(device)  # fmt: skip
        nets[name] = net
    baseline = "dlgn-gumbel softmax"
    try:
        difflogic = load_difflogic()
        kind = "cuda" if device.type == "cuda" and difflogic_has_cuda() else "python"
        peer = copy_into_difflogic(nets["dlgn-gumbel softmax"], difflogic, kind).to(device)
        baseline = f"difflogic {kind} (softmax)"
        candidates[baseline] = _step(peer, torch.optim.Adam(peer.parameters(), lr=0.01), x, y)
    except RuntimeError as error:
        print(f"skipping the difflogic anchor: {error}")
    for name, net in nets.items():
        candidates[name] = _step(net, torch.optim.Adam(net.parameters(), lr=0.01), x, y)
    # the steps update the weights, so outputs drift apart after the first call: compare once
    # before timing (same init, same connections -> same scores) and skip the per-call check
    with torch.no_grad():
        if baseline != "dlgn-gumbel softmax":
            diff = (peer.train()(x) - nets["dlgn-gumbel softmax"].train()(x)).abs().max().item()
            print(f"difflogic vs dlgn-gumbel (softmax, same weights): max |diff| = {diff:.2e}")
    table = compare(
        candidates,
        baseline=baseline,
        title=f"Training step, {args.in_dim} inputs, layers {args.layers}, batch {args.batch_size}",
        device=args.device,
        warmup=2,
        repeat=args.repeat,
        check_outputs=False,
    )
    print(table.to_markdown())
    if args.out:
        table.save(args.out, f"bench_train_step_{args.layers}")


if __name__ == "__main__":
    main()
