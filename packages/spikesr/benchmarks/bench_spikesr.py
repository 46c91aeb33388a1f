"""Side by side: our multi-step LIF vs SpikingJelly 2.0's LIFNode, our patch grid (exact overlap
counts) vs the anchor's loops, and the whole network with either neuron.

python packages/spikesr/benchmarks/bench_spikesr.py --out reports/bench/spikesr

SpikingJelly is installed without its dependencies (``pip install --no-deps spikingjelly==2.0.0
loguru``); its torch backend is the only one that runs on a CPU.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from kernels_common.bench import compare
from spikesr.model import SpikeSR
from spikesr.neuron import LIF
from spikesr.patches import divide, reverse


def anchor_divide(x: torch.Tensor, patch: int, step: int) -> torch.Tensor:
    """The anchor's patch cutting: a Python loop over the grid, one slice per patch."""
    _, _, h, w = x.shape
    crops = []
    for i in range(0, h + step - patch, step):
        top = min(i, h - patch)
        for j in range(0, w + step - patch, step):
            left = min(j, w - patch)
            crops.append(x[:, :, top : top + patch, left : left + patch])
    return torch.stack(crops, dim=1)


def anchor_reverse(crops: torch.Tensor, h: int, w: int, step: int) -> torch.Tensor:
    """The anchor's reassembly: add each patch back in a loop, then halve the overlap strips."""
    b, _, c, patch, _ = crops.shape
    out = crops.new_zeros(b, c, h, w)
    index = 0
    for i in range(0, h + step - patch, step):
        top = min(i, h - patch)
        for j in range(0, w + step - patch, step):
            left = min(j, w - patch)
            out[:, :, top : top + patch, left : left + patch] += crops[:, index]
            index += 1
    for i in range(step, h + step - patch, step):  # halve the overlap strips, as the anchor
        top = h - patch if i + patch > h else i
        out[:, :, top : i + patch - step, :] /= 2
    for j in range(step, w + step - patch, step):
        left = w - patch if j + patch > w else j
        out[:, :, :, left : j + patch - step] /= 2
    return out


def lif_step(node, x):
    def run():
        x.grad = None
        out = node(x)
        out.sum().backward()
        if hasattr(node, "reset"):
            node.reset()
        return out

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for the bench_spikesr_*.json/.md")
    parser.add_argument("--quick", action="store_true", help="smaller shapes (smoke test)")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    from spikingjelly.activation_based.neuron import LIFNode

    torch.manual_seed(0)
    side = 32 if args.quick else 64
    tables = {}
    # the SAB's LIF layers at the paper's width: T = 4, batch 4, 64 channels
    x = (torch.randn(4, 4, 64, side, side) * 0.3).requires_grad_()
    theirs = LIFNode(tau=2.0, v_threshold=0.15, decay_input=False, step_mode="m")
    tables["lif"] = compare(
        {"spikingjelly LIFNode (torch)": lif_step(theirs, x), "spikesr LIF": lif_step(LIF(), x)},
        baseline="spikingjelly LIFNode (torch)", repeat=args.repeat,
        title=f"multi-step LIF, forward + backward, (4, 4, 64, {side}, {side})",
    )  # fmt: skip
    # the DSA's patch grid (16 / 14) on T * B feature maps
    features = torch.randn(16, 64, 2 * side, 2 * side)
    h = w = 2 * side
    tables["patches"] = compare(
        {
            "anchor loops": lambda: anchor_reverse(anchor_divide(features, 16, 14), h, w, 14),
            "spikesr (exact coverage)": lambda: reverse(divide(features, 16, 14), h, w, 14),
        },
        baseline="anchor loops", repeat=args.repeat,
        title=f"DSA patch divide + reverse, (16, 64, {h}, {w})",
    )  # fmt: skip
    # the whole network, eval, one image
    torch.manual_seed(1)
    ours = SpikeSR(width=32).eval()
    with_sj = SpikeSR(width=32, neuron="spikingjelly").eval()
    with_sj.load_state_dict(ours.state_dict())
    image = torch.rand(1, 3, side, side)
    with torch.no_grad():
        tables["network"] = compare(
            {"SpikingJelly neurons": lambda: with_sj(image), "spikesr LIF": lambda: ours(image)},
            baseline="SpikingJelly neurons", repeat=max(3, args.repeat // 3),
            title=f"SpikeSR width 32 (x4), eval forward, 1 x 3 x {side} x {side}",
        )  # fmt: skip
    for name, table in tables.items():
        print(table.to_markdown())
        if args.out:
            table.save(Path(args.out), f"bench_spikesr_{name}")


if __name__ == "__main__":
    main()
