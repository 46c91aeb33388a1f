"""Command line: ``tfla-mlstm bench`` and ``tfla-mlstm reproduce`` (``python -m tfla_mlstm``)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from kernels_common import cli


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="tfla-mlstm", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="chunkwise ops vs mlstm-kernels and attention")
    bench.add_argument("--device", type=cli.device, default="cpu", help="cpu or cuda")
    bench.add_argument(
        "--out", type=cli.output_folder, default=None, help="folder for the JSON/Markdown tables"
    )
    bench.add_argument("--seq-lens", type=cli.positive_int, nargs="+", default=None)
    bench.add_argument("--repeat", type=cli.positive_int, default=5)
    repro = commands.add_parser("reproduce", help="the paper's claims at CPU scale")
    repro.add_argument("--quick", action="store_true", help="the few-minute version")
    repro.add_argument("--out", type=cli.output_folder, default=Path("reports/tfla-mlstm"))
    return cli.run(parser, _dispatch, argv)


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "bench":
        from tfla_mlstm.bench import run

        run(args.device, args.out, args.seq_lens, args.repeat)
        return 0
    from tfla_mlstm.reproduce import reproduce

    with cli.atomic_folder(args.out) as staging:  # the results appear whole, or not at all
        results = reproduce(staging, quick=args.quick)
    for claim in results.claims:
        logging.getLogger("tfla_mlstm").info(
            "%s: measured %.4f %s (%s)", claim.name, claim.measured, claim.unit,
            "agrees" if claim.passed else "does not agree",
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
