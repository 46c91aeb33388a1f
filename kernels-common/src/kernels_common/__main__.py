"""Command line: ``kernels-common report DIR`` and ``kernels-common backend``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kernels_common import cli


def _report(args: argparse.Namespace) -> int:
    from kernels_common.report import write_index

    summary = write_index(args.reports_dir, args.failed, expected=args.expected)
    print(summary.path)
    for name in summary.unreadable:
        print(f"unreadable results: {name}", file=sys.stderr)
    for name in summary.missing:
        print(f"no results from: {name}", file=sys.stderr)
    return 0 if summary.complete else 1


def _backend(args: argparse.Namespace) -> int:
    import torch

    from kernels_common.backend import resolve_backend, triton_available

    print(f"triton installed: {triton_available()}; CUDA available: {torch.cuda.is_available()}")
    print(f"CPU inputs -> {resolve_backend(None, [torch.empty(0)]).value}")
    if torch.cuda.is_available():
        print(f"CUDA inputs -> {resolve_backend(None, [torch.empty(0, device='cuda')]).value}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="kernels-common", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="gather DIR/*/results.json into DIR/index.md")
    report.add_argument("reports_dir", type=cli.output_folder, help="one folder per package")
    report.add_argument("--failed", nargs="*", default=[], help="packages whose reproduce failed")
    report.add_argument("--expected", nargs="*", default=[], help="packages that should report")
    report.set_defaults(func=_report)
    backend = commands.add_parser(
        "backend", help="print the backend an op would use here for CPU and CUDA inputs"
    )
    backend.set_defaults(func=_backend)
    return cli.run(parser, lambda args: args.func(args), argv)


if __name__ == "__main__":
    sys.exit(main())
