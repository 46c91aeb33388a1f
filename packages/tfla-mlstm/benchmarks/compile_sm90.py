"""Our TFLA kernels and mlstm-kernels' side by side, compiled for an H200 (sm_90) without a GPU:
registers, spills, shared memory and tensor-core instructions of every kernel of one forward and
backward pass (bf16, DQK 128, DV 256, chunk 128), then the backward's level-2 kernels under other
tile layouts ``(steps, DQK, DV, warps, stages)``.

    python packages/tfla-mlstm/benchmarks/compile_sm90.py [--out FILE.md]

Runs on a CPU with the Triton compiler (TRITON_INTERPRET unset); nothing is timed or run. Which
layout is fastest is a GPU measurement (benchmarks/gpu_diag.py); this says which ones fit, spill or
use Hopper's warpgroup MMA.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from kernels_common.compile_check import compile_only, resources_table
from tfla_mlstm import bench
from tfla_mlstm.kernels.tiles import Tiles

TILES = {
    "ours": ["BLOCK_L", "BLOCK_QK", "BLOCK_V"],
    "anchor": ["siz_b_LQ", "siz_b_LKV", "siz_b_DHQK", "siz_b_DHHV"],
}
GRADIENT_KERNELS = ("_normalizer_grad_kernel", "_dq_kernel", "_dk_kernel", "_dv_kernel")
# (steps, DQK, DV, warps, stages): the default first, then 64-step blocks (wgmma's row count)
GRADIENT_LAYOUTS = [
    None,
    (64, 128, 128, 4, 2),
    (64, 128, 128, 4, 1),
    (64, 128, 128, 8, 1),
    (64, 128, 64, 4, 1),
    (64, 64, 128, 4, 1),
    (64, 64, 64, 4, 1),
]


def side_by_side() -> list[str]:
    sections = []
    for variant in ("mlstmsig", "mlstm"):
        runs = {"ours": False}
        if importlib.util.find_spec("mlstm_kernels") is not None:
            runs["anchor"] = True
        for who, anchor in runs.items():
            with compile_only() as kernels:
                bench.kernel_workload(variant=variant, anchor=anchor)
            name = (
                "tfla-mlstm" if who == "ours" else f"mlstm-kernels {bench.ANCHOR_KERNELS[variant]}"
            )
            sections += [
                f"### {variant}: {name}",
                "",
                resources_table(kernels, constants=TILES[who]),
                "",
            ]
    return sections


def gradient_layouts() -> list[str]:
    choose = Tiles.choose.__func__
    sections = ["### backward level-2 kernels per layout (mLSTM, as gpu_diag.py times)", ""]
    try:
        for layout in GRADIENT_LAYOUTS:

            def chosen(cls, chunk, dqk, dv, dtype, *, kernel="output", layout=layout):
                if kernel == "gradients" and layout is not None:
                    return cls(*layout[:3], "tf32", *layout[3:])
                return choose(cls, chunk, dqk, dv, dtype, kernel=kernel)

            Tiles.choose = classmethod(chosen)
            with compile_only() as kernels:
                bench.kernel_workload(variant="mlstm")
            rows = [k for k in kernels if k.name in GRADIENT_KERNELS]
            sections += [f"layout {'default' if layout is None else layout}", "",
                         resources_table(rows, constants=TILES["ours"]), ""]  # fmt: skip
    finally:
        Tiles.choose = classmethod(choose)
    return sections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown here too")
    args = parser.parse_args()
    text = "\n".join([*side_by_side(), *gradient_layouts()])
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
