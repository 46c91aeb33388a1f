"""``freeze-thaw-bo`` command line: ``run``, ``compare``, ``fit-utility``, ``train-surrogate``,
``reproduce [--quick]``.

``run`` replays one method on a benchmark table and writes its regret-versus-budget record;
``compare`` runs every method (CFBO and the baselines) at several α and writes a JSON, a Markdown
table and one plot per α; ``fit-utility`` fits (α, c) to pairwise preferences (JSON list of
``[[b, y], [b, y]]`` pairs, the preferred outcome first); ``train-surrogate`` trains the
learning-curve PFN from its prior (the command that produced the shipped weights).

α may be written as a number or a power of two (``2**-4``, ``2^-4``). Bad input is refused with
one line ``freeze-thaw-bo: error: ...`` and exit code 2 before any work; outputs appear whole or
not at all.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path

from kernels_common import cli

logger = logging.getLogger("freeze_thaw_bo")

_POWER = re.compile(r"^\s*2\s*(\*\*|\^)\s*(-?\d+)\s*$")


def alpha_value(text: str) -> float:
    """α from '0.0625', '2**-4' or '2^-4'; must be >= 0."""
    match = _POWER.match(text)
    value = 2.0 ** int(match.group(2)) if match else cli.finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"alpha must be >= 0, got {text!r}")
    return value


def alpha_list(text: str) -> list[float]:
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of alphas")
    return [alpha_value(item) for item in items]


def method_list(text: str) -> list[str]:
    from freeze_thaw_bo.methods import METHODS

    names = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [name for name in names if name not in METHODS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown methods {unknown or text!r}; choose from {', '.join(METHODS)}"
        )
    return names


def _table(args: argparse.Namespace):
    from freeze_thaw_bo.tables import load_table

    return load_table(args.benchmark, data=args.data, max_configs=args.max_configs, seed=args.seed)


def _method_kwargs(args: argparse.Namespace) -> dict[str, dict]:
    return {"cfbo": {"num_samples": args.num_samples}}


def _run_one(args: argparse.Namespace) -> int:
    from freeze_thaw_bo.benchmark import make_optimizer, run_on_table
    from freeze_thaw_bo.utility import Utility

    table = _table(args)
    utility = Utility(args.alpha, args.c, args.budget)
    kwargs = _method_kwargs(args).get(args.method, {})
    opt = make_optimizer(args.method, table, utility, budget=args.budget, seed=args.seed, **kwargs)
    result = run_on_table(opt, table, stop_early=args.stop_early)
    record = result.to_dict()
    with cli.atomic_file(args.out) as temporary:
        temporary.write_text(json.dumps(record, indent=1))
    logger.info(
        "%s on %s: final regret %.4f, stopped at %s, regret there %.4f (oracle stop %.4f)",
        args.method,
        table.name,
        result.regrets[-1],
        result.stop_budget,
        result.regret_at_stop,
        result.best_stop_regret,
    )
    return 0


def _run_compare(args: argparse.Namespace) -> int:
    from freeze_thaw_bo.compare import compare_methods, markdown_table, write_comparison

    table = _table(args)
    comparison = compare_methods(
        table,
        methods=args.methods,
        alphas=args.alphas,
        c=args.c,
        budget=args.budget,
        seeds=list(range(args.seed, args.seed + args.seeds)),
        method_kwargs=_method_kwargs(args),
    )
    with cli.atomic_folder(args.out) as staging:
        write_comparison(comparison, Path(staging), plots=not args.no_plots)
    print(markdown_table(comparison.summary_rows()))
    return 0


def _run_fit_utility(args: argparse.Namespace) -> int:
    from freeze_thaw_bo.utility import fit_utility

    data = cli.read_json(args.preferences, "preference file")
    if not isinstance(data, list):
        raise ValueError(f"{args.preferences}: expected a JSON list of [[b, y], [b, y]] pairs")
    utility = fit_utility(data, budget=args.budget, temperature=args.temperature)
    print(json.dumps({"alpha": utility.alpha, "c": utility.c, "budget": utility.budget}))
    return 0


def _run_train_surrogate(args: argparse.Namespace) -> int:
    import torch

    from freeze_thaw_bo.pfn.train import train_default_pfn

    torch.set_num_threads(1)  # the shipped weights were trained on one thread (bit-reproducible)
    with cli.atomic_folder(args.out) as staging:
        steps = {} if args.steps is None else {"steps": args.steps}
        train_default_pfn(Path(staging) / "ftpfn_small.safetensors", seed=args.seed, **steps)
    logger.info("surrogate written to %s", args.out)
    return 0


def _run_reproduce(args: argparse.Namespace) -> int:
    from freeze_thaw_bo.reproduce import run

    with cli.atomic_folder(args.out) as staging:
        results = run(staging, quick=args.quick)
    logger.info("results in %s (all claims pass: %s)", args.out, results.passed)
    return 0


def _add_benchmark_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--benchmark",
        default="fashion-mnist",
        help="fashion-mnist | lcdb:<openml id> | lcbench:<dataset> | taskset:<d> | pd1:<d>",
    )
    parser.add_argument("--data", type=cli.existing_file, default=None, help="table file")
    parser.add_argument("--max-configs", type=cli.positive_int, default=None, help="seeded subset")
    parser.add_argument("--c", type=cli.positive_float, default=1.0, help="utility exponent c")
    parser.add_argument("--budget", type=cli.positive_float, default=300.0, help="B in epochs")
    parser.add_argument("--seed", type=cli.nonnegative_int, default=0)
    parser.add_argument("--num-samples", type=cli.positive_int, default=1000, help="CFBO's MC")


def main(argv: list[str] | None = None) -> int:
    from freeze_thaw_bo.methods import METHODS

    parser = cli.ArgumentParser(prog="freeze-thaw-bo", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run", help="one method on one benchmark")
    _add_benchmark_arguments(one)
    one.add_argument("--method", choices=METHODS, default="cfbo")
    one.add_argument("--alpha", type=alpha_value, default=2**-4, help="e.g. 2**-4")
    one.add_argument("--stop-early", action="store_true", help="end the run at the stop signal")
    one.add_argument("--out", type=cli.output_file, default="freeze-thaw-bo-run.json")
    one.set_defaults(func=_run_one)
    many = commands.add_parser("compare", help="every method at several alphas, with plots")
    _add_benchmark_arguments(many)
    many.add_argument("--methods", type=method_list, default=list(METHODS))
    many.add_argument("--alphas", type=alpha_list, default=[0.0, 2**-6, 2**-4, 2**-2])
    many.add_argument("--seeds", type=cli.positive_int, default=1, help="how many seeds")
    many.add_argument("--no-plots", action="store_true")
    many.add_argument("--out", type=cli.output_folder, default="freeze-thaw-bo-compare")
    many.set_defaults(func=_run_compare)
    fit = commands.add_parser("fit-utility", help="fit (alpha, c) to pairwise preferences")
    fit.add_argument("preferences", type=cli.existing_file)
    fit.add_argument("--budget", type=cli.positive_float, required=True)
    fit.add_argument("--temperature", type=cli.positive_float, default=0.05)
    fit.set_defaults(func=_run_fit_utility)
    train = commands.add_parser("train-surrogate", help="train the learning-curve PFN")
    train.add_argument("--out", type=cli.output_folder, default="freeze-thaw-bo-pfn")
    train.add_argument("--steps", type=cli.positive_int, default=None, help="default: shipped")
    train.add_argument("--seed", type=cli.nonnegative_int, default=0)
    train.set_defaults(func=_run_train_surrogate)
    rep = commands.add_parser("reproduce", help="the paper's headline comparison at small scale")
    rep.add_argument("--quick", action="store_true", help="the few-minute CPU run")
    rep.add_argument(
        "--out", type=cli.output_folder, default="reports/freeze-thaw-bo", help="results folder"
    )
    rep.set_defaults(func=_run_reproduce)

    def dispatch(args: argparse.Namespace) -> int:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        return args.func(args)

    return cli.run(parser, dispatch, argv)


if __name__ == "__main__":
    raise SystemExit(main())
