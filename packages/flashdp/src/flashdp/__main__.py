"""``flashdp`` command line: ``reproduce [--quick] --out DIR`` and ``bench --device --out``."""

from __future__ import annotations

import argparse
import logging
import sys

from kernels_common import cli


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="flashdp", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    reproduce = commands.add_parser("reproduce", help="DP GPT on fortunes at ε = 8 vs Opacus")
    reproduce.add_argument("--quick", action="store_true", help="the few-minute CPU run")
    reproduce.add_argument(
        "--out", type=cli.output_folder, default="reports/flashdp", help="results folder"
    )
    bench = commands.add_parser("bench", help="step time and memory vs non-DP and Opacus")
    bench.add_argument("--device", type=cli.device, default="cpu", choices=["cpu", "cuda"])
    bench.add_argument(
        "--out", type=cli.output_folder, default=None, help="folder for bench_flashdp.json/.md"
    )
    bench.add_argument("--quick", action="store_true", help="a smaller model")
    return cli.run(parser, _dispatch, argv)


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    if args.command == "reproduce":
        from flashdp.reproduce import run

        with cli.atomic_folder(args.out) as staging:  # the results appear whole, or not at all
            results = run(staging, quick=args.quick)
        logging.getLogger("flashdp").info(
            "results in %s (all claims pass: %s)", args.out, results.passed
        )
        return 0
    from flashdp.benchmark import run as run_benchmark

    sys.stdout.write(run_benchmark(args.device, args.out, quick=args.quick).to_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
