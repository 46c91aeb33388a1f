"""Compiled inference throughput on Fashion-MNIST test images, one core: dlgn-gumbel's compiled
network (C and numpy engines) vs the torch eval-mode forward vs difflogic's CompiledLogicNet.

Takes a checkpoint from `dlgn-gumbel train` (--checkpoint) or builds a network of the reproduce
run's size with random logits (throughput does not depend on what was learned, except through
pruning of dead neurons, which a trained net has more of). difflogic is fetched from PyPI at run
time; if that fails (or gcc is missing) its row is skipped with a message.

python packages/dlgn-gumbel/benchmarks/bench_compiled.py --out reports/bench/dlgn-gumbel
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dlgn_gumbel import LogicNet, ThermometerEncoder, compile_logic_net
from dlgn_gumbel.bench import copy_into_difflogic, load_difflogic
from dlgn_gumbel.data import load_images
from dlgn_gumbel.train import load_checkpoint
from kernels_common.bench import compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=None, help="folder for bench_compiled.json/.md")
    parser.add_argument("--checkpoint", default=None, help="a `dlgn-gumbel train` --out folder")
    parser.add_argument("--layers", default="4000x3", help="width x depth (no checkpoint)")
    parser.add_argument("--difflogic-opt", type=int, default=1, help="difflogic's -O level")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.device != "cpu":
        print("compiled inference runs on the CPU; --device is ignored")
    torch.set_num_threads(1)

    data = load_images("fashion-mnist")
    if args.checkpoint:
        net, config = load_checkpoint(args.checkpoint, backend="reference")
        encoder = config.encoder()
    else:
        width, depth = (int(v) for v in args.layers.split("x"))
        encoder = ThermometerEncoder.uniform(3)
        net = LogicNet(784 * 3, [width] * depth, 10, tau=10.0, backend="reference")
    net.eval()
    bits = encoder(data.x_test) > 0.5
    bits_np = bits.numpy()
    x_float = bits.float()
    batch = bits.shape[0]
    tau = net.config.tau

    compiled_c = compile_logic_net(net, engine="c")
    compiled_np = compiled_c.with_engine("numpy")
    candidates = {}
    try:
        difflogic = load_difflogic()
        peer = difflogic.CompiledLogicNet(copy_into_difflogic(net, difflogic), num_bits=64)
        start = time.perf_counter()
        peer.compile(opt_level=args.difflogic_opt)
        print(f"difflogic compile (-O{args.difflogic_opt}): {time.perf_counter() - start:.1f} s")
        candidates["difflogic CompiledLogicNet (C)"] = lambda: peer(bits_np).float() / tau
    except (RuntimeError, OSError) as error:
        print(f"skipping the difflogic anchor: {error}")
    candidates["dlgn-gumbel compiled (C)"] = lambda: compiled_c.scores(bits_np)
    candidates["dlgn-gumbel compiled (numpy)"] = lambda: compiled_np.scores(bits_np)

    def torch_eval() -> torch.Tensor:
        with torch.no_grad():
            return net(x_float)

    candidates["torch eval-mode forward"] = torch_eval
    baseline = next(iter(candidates))
    table = compare(
        candidates,
        baseline=baseline,
        title=(
            f"Compiled inference, {batch} Fashion-MNIST test images, {compiled_c.num_gates} gates "
            f"after pruning (of {sum(layer.out_dim for layer in net.layers)}), one thread"
        ),
        warmup=1,
        repeat=args.repeat,
        memory=False,
    )
    print(table.to_markdown())
    for row in table.rows:
        print(f"{row.name}: {batch / row.measurement.median_s:,.0f} images/s")
    assert np.array_equal(compiled_c.scores(bits_np).numpy(), torch_eval().numpy())
    if args.out:
        table.save(args.out, "bench_compiled")


if __name__ == "__main__":
    main()
