"""Command line: ``kernels-common report DIR``, ``kernels-common backend`` and
``kernels-common compile MODULE:FUNCTION``."""

from __future__ import annotations

import argparse
import json
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


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _compile(args: argparse.Namespace) -> int:
    from kernels_common.compile_check import resources_table, run_workload, to_json

    kernels = run_workload(args.workload, **args.kwargs)
    print(to_json(kernels) if args.json else resources_table(kernels))
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
    compile_ = commands.add_parser(
        "compile",
        help="compile the Triton kernels a function launches for sm_90 (H100/H200) without a "
        "GPU, and print their registers, spills, shared memory and tensor-core use",
    )
    compile_.add_argument("workload", help="package.module:function, called with --kwargs")
    compile_.add_argument(
        "--kwargs", type=_json_object, default={}, help="the function's arguments, a JSON object"
    )
    compile_.add_argument("--json", action="store_true", help="print JSON instead of a table")
    compile_.set_defaults(func=_compile)
    return cli.run(parser, lambda args: args.func(args), argv)


if __name__ == "__main__":
    sys.exit(main())
