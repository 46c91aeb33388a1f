"""Step time and peak memory: non-DP vs flashdp (per-layer, flat) vs Opacus (hooks, ghost).

python packages/flashdp/benchmarks/bench_flashdp.py --device cpu --out reports/bench/flashdp
"""

from __future__ import annotations

import argparse

from flashdp.benchmark import GPU_SHAPES, profile, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=None, help="folder for bench_flashdp.json/.md")
    parser.add_argument("--quick", action="store_true", help="a smaller model (smoke test)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--shape", default="gpt2", choices=sorted(GPU_SHAPES), help="the model on --device cuda"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also write torch.profiler tables of the non-DP and flashdp per-layer steps to --out",
    )
    args = parser.parse_args()
    options = {"quick": args.quick, "gpu_shape": args.shape}
    print(run(args.device, args.out, repeat=args.repeat, **options).to_markdown())
    if args.profile:
        if args.out is None:
            parser.error("--profile needs --out")
        for name, table in profile(args.device, args.out, **options).items():
            print(f"\n{name}\n{table}")


if __name__ == "__main__":
    main()
