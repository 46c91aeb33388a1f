"""Command line: ``cads select | compare | reproduce``.

Bad arguments are refused with one line (``cads: error: …``, exit code 2) before any work
starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from kernels_common import cli

TASKS = ("fashion-mnist", "text", "toy")


def _task(args: argparse.Namespace):
    from cads.data import mixed_fashion_mnist, mixed_text, toy_task

    if args.task == "fashion-mnist":
        return mixed_fashion_mnist(args.per_source, seed=args.seed, path=args.data_path)
    if args.data_path is not None:
        raise ValueError(f"--data-path is for --task fashion-mnist, not {args.task}")
    if args.task == "text":
        return mixed_text(args.per_source, seed=args.seed)
    return toy_task(args.per_source, seed=args.seed)


def _budget(args: argparse.Namespace, amount: float):
    from cads.budget import ComputeBudget

    whole = args.unit == "steps" and float(amount).is_integer()
    return ComputeBudget(int(amount) if whole else amount, args.unit)  # 2.5 steps: refused


def _configs(args: argparse.Namespace):
    from cads.budget import InnerConfig
    from cads.config import SelectConfig

    config = SelectConfig(
        outer_steps=args.outer_steps, samples=args.samples, alpha=args.alpha, size=args.size
    )
    return config, InnerConfig(batch_size=args.batch_size, lr=args.lr)


def _select(args: argparse.Namespace) -> int:
    from cads.api import select
    from cads.selection import evaluate_selection

    config, inner = _configs(args)  # refused before the data loads
    budget = _budget(args, args.budget)
    task = _task(args)
    selection = select(
        task, budget, args.method, config=config, inner=inner, size=args.size, seed=args.seed
    )
    report = {
        "method": selection.method,
        "budget": str(budget),
        "size": len(selection),
        "seconds": round(selection.seconds, 3),
    }
    if selection.level == "source":
        report["ratios"] = dict(
            zip(task.source_names, selection.probabilities.tolist(), strict=True)
        )
    if args.evaluate:
        report |= evaluate_selection(task, selection, budget, inner, seed=args.seed)
    selection.save(args.out)
    print(json.dumps(report, indent=1))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from cads.api import compare

    config, inner = _configs(args)
    budgets = [_budget(args, b) for b in args.budgets]
    task = _task(args)
    rows = compare(
        task, budgets, args.methods, config=config, inner=inner, size=args.size, seed=args.seed
    )
    text = json.dumps(rows, indent=1)
    if args.out is not None:
        with cli.atomic_file(args.out) as temporary:
            temporary.write_text(text + "\n")
    print(text)
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from cads.reproduce import reproduce

    results = reproduce(args.out, quick=args.quick)
    print(
        f"results: {args.out / 'results.json'} "
        f"({'all claims agree' if results.passed else 'some claims disagree'})"
    )
    return 0


def _methods(text: str) -> list[str]:
    from cads.api import METHODS

    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise argparse.ArgumentTypeError(
            f"unknown method(s) {unknown or text!r}; known: {', '.join(METHODS)}"
        )
    return methods


def _budgets(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"budgets must be numbers like 100,300,1000, got {text!r}"
        ) from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"budgets must be positive numbers, got {text!r}")
    return values


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", choices=TASKS, default="fashion-mnist")
    parser.add_argument("--data-path", help="a folder with Fashion-MNIST's IDX files")
    parser.add_argument(
        "--per-source", type=cli.positive_int, default=500, help="pool examples per source"
    )
    parser.add_argument("--unit", choices=("steps", "flops"), default="steps", help="budget unit")
    parser.add_argument("--outer-steps", type=cli.positive_int, default=100)
    parser.add_argument(
        "--samples", type=cli.positive_int, default=5, help="K draws per outer step"
    )
    parser.add_argument("--alpha", type=cli.positive_float, default=1.0, help="CADS penalty weight")
    parser.add_argument("--size", type=cli.positive_int, help="impose an expected selection size")
    parser.add_argument("--batch-size", type=cli.positive_int, default=64)
    parser.add_argument("--lr", type=cli.positive_float, default=3e-3, help="inner Adam rate")
    parser.add_argument("--seed", type=int, default=0)


def _parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="cads",
        description="Computational budget-aware data selection: select, compare, reproduce.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    sl = sub.add_parser("select", help="one method's selection for one budget, saved to --out")
    sl.add_argument("--method", type=lambda t: _methods(t)[0], default="cads-s")
    sl.add_argument("--budget", type=cli.positive_float, required=True, help="steps or FLOPs")
    sl.add_argument("--evaluate", action="store_true", help="train on it and report test metrics")
    sl.add_argument("--out", type=cli.output_folder, required=True, help="selection folder")
    _common(sl)
    sl.set_defaults(func=_select)

    cp = sub.add_parser("compare", help="several methods at several budgets, judged alike")
    cp.add_argument("--methods", type=_methods, default=["cads-s", "cads-e", "random", "full"])
    cp.add_argument("--budgets", type=_budgets, default=[100.0, 300.0, 1000.0])
    cp.add_argument("--out", type=cli.output_file, help="also write the rows as JSON here")
    _common(cp)
    cp.set_defaults(func=_compare)

    rp = sub.add_parser("reproduce", help="the paper's claims at small scale")
    rp.add_argument("--quick", action="store_true", help="the ~10-minute CPU run")
    rp.add_argument("--out", type=cli.output_folder, default=Path("reports/cads"))
    rp.set_defaults(func=_reproduce)
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command == "reproduce" else logging.WARNING,
        format="%(asctime)s %(name)s: %(message)s",
    )
    try:
        return args.func(args)
    except ImportError as error:  # a missing extra
        raise cli.CommandError(str(error)) from error


def main(argv: list[str] | None = None) -> int:
    return cli.run(_parser(), _dispatch, argv)


if __name__ == "__main__":
    sys.exit(main())
