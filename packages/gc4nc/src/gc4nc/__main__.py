"""``gc4nc`` command line: ``methods``, ``condense``, ``evaluate``, ``benchmark``, ``reproduce``.

``condense`` writes a condensed graph folder (safetensors + JSON); ``evaluate`` scores one along the
GC4NC dimensions against the graph it came from; ``benchmark`` sweeps methods × datasets × rates
into one JSON, a Markdown table and heatmaps; ``reproduce`` checks the paper's findings at small
scale. Datasets are named as in `gc4nc.datasets` (``debian``, ``fashion-knn``, ``csbm``,
``planetoid:ROOT:NAME``...). Hyperparameters: ``--set name=value`` (repeatable; values are read as
JSON where they parse, e.g. ``--set epochs=200 --set dis_metric=mse``).

Bad input is refused with one line ``gc4nc: error: ...`` and exit code 2 before any work; output
folders appear whole or not at all.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from kernels_common import cli

logger = logging.getLogger("gc4nc")


def rate_value(text: str) -> float:
    value = cli.finite_float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"reduction rate must be in (0, 1), got {text!r}")
    return value


def rate_list(text: str) -> list[float]:
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of rates")
    return [rate_value(item) for item in items]


def method_name(text: str) -> str:
    from gc4nc.methods import METHODS

    if text not in METHODS:
        raise argparse.ArgumentTypeError(
            f"unknown method {text!r}; choose from {', '.join(sorted(METHODS))}"
        )
    return text


def method_list(text: str) -> list[str]:
    names = [item.strip() for item in text.split(",") if item.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of methods")
    return [method_name(name) for name in names]


def dataset_name(text: str) -> str:
    from gc4nc.datasets import DATASETS, USER_PATH_KINDS

    kind = text.split(":", 1)[0]
    if text not in DATASETS and kind not in USER_PATH_KINDS:
        raise argparse.ArgumentTypeError(
            f"unknown dataset {text!r}; choose from {', '.join(DATASETS)}, planetoid:ROOT:NAME, "
            "ogb:ROOT:NAME"
        )
    return text


def assignment(text: str) -> tuple[str, object]:
    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected name=value, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return name.strip(), value


def _run_methods(args: argparse.Namespace) -> int:
    from gc4nc.methods import METHODS

    print("| method | family | structure | summary |\n|---|---|---|---|")
    for spec in METHODS.values():
        print(f"| {spec.name} | {spec.family} | {spec.structure} | {spec.summary} |")
    return 0


def _run_condense(args: argparse.Namespace) -> int:
    from gc4nc.condense import condense
    from gc4nc.datasets import load_dataset

    graph = load_dataset(args.dataset, seed=args.split_seed)
    condensed = condense(
        graph,
        args.method,
        args.rate,
        args.setting,
        seed=args.seed,
        device=args.device,
        **dict(args.set),
    )
    condensed.metadata["dataset"] = args.dataset
    condensed.metadata["split_seed"] = args.split_seed
    with cli.atomic_folder(args.out) as staging:
        condensed.save(staging)
    meta = condensed.metadata
    print(
        f"{args.method} on {args.dataset} at r = {args.rate:g}: {meta['num_synthetic']} nodes "
        f"in {meta['seconds']:.1f} s -> {args.out}"
    )
    return 0


def _run_evaluate(args: argparse.Namespace) -> int:
    from gc4nc.condensed import CondensedGraph
    from gc4nc.datasets import load_dataset
    from gc4nc.evaluation import evaluate
    from gc4nc.evaluation.performance import EvalConfig

    condensed = CondensedGraph.load(args.condensed)
    dataset = args.dataset or condensed.metadata.get("dataset")
    if dataset is None:
        raise cli.CommandError("the condensed graph does not name its dataset: pass --dataset")
    split_seed = condensed.metadata.get("split_seed", 0)
    graph = load_dataset(dataset, seed=split_seed)
    config = None  # GraphSlim's schedule, or the quick one with --quick
    if args.runs is not None or args.epochs is not None:
        from gc4nc.evaluation import QUICK_CONFIG

        base = QUICK_CONFIG if args.quick else EvalConfig()
        config = EvalConfig(runs=args.runs or base.runs, epochs=args.epochs or base.epochs)
    report = evaluate(
        condensed, graph, dims=args.dims, config=config, quick=args.quick, seed=args.seed
    )
    text = json.dumps(report, indent=2, default=str)
    if args.out:
        with cli.atomic_file(args.out) as staging:
            Path(staging).write_text(text)
    print(text)
    return 0


def _per_method(methods: list[str], values: dict) -> dict[str, dict]:
    """`--set` values for each method that takes them; a name no chosen method takes is an error."""
    from gc4nc.methods import METHODS

    unused = [k for k in values if not any(k in METHODS[m].defaults for m in methods)]
    if unused:
        raise cli.CommandError(f"no chosen method takes {', '.join(unused)} (--set)")
    return {m: {k: v for k, v in values.items() if k in METHODS[m].defaults} for m in methods}


def _run_benchmark(args: argparse.Namespace) -> int:
    from gc4nc import benchmark
    from gc4nc.evaluation.performance import EvalConfig

    config = EvalConfig(runs=args.runs, epochs=args.epochs, val_every=args.val_every)
    hparams = _per_method(args.methods, dict(args.set))
    result = benchmark.sweep(
        args.datasets,
        args.methods,
        args.rates,
        config=config,
        hparams=hparams,
        seed=args.seed,
        device=args.device,
    )
    with cli.atomic_folder(args.out) as staging:
        benchmark.write(result, Path(staging), plots=not args.no_plots)
    print(benchmark.markdown(result))
    return 0


def _run_reproduce(args: argparse.Namespace) -> int:
    from gc4nc.reproduce import run

    with cli.atomic_folder(args.out) as staging:
        results = run(staging, quick=args.quick)
    for claim in results.claims:
        print(
            f"{'PASS' if claim.passed else 'FAIL'}  {claim.name}: {claim.measured:.4g} {claim.unit}"
        )
    return 0


def dims_list(text: str) -> list[str]:
    from gc4nc.evaluation import DIMENSIONS

    names = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [name for name in names if name not in DIMENSIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown dimensions {unknown or text!r}; choose from {', '.join(DIMENSIONS)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    from gc4nc.condense import SETTINGS

    parser = cli.ArgumentParser(prog="gc4nc", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("methods", help="the condensation methods")
    listing.set_defaults(func=_run_methods)

    one = commands.add_parser("condense", help="condense one graph with one method")
    one.add_argument("--dataset", type=dataset_name, default="fashion-knn")
    one.add_argument("--method", type=method_name, default="gcond")
    one.add_argument("--rate", type=rate_value, default=0.5, help="fraction of training nodes")
    one.add_argument("--setting", choices=SETTINGS, default="transductive")
    one.add_argument("--seed", type=cli.nonnegative_int, default=0)
    one.add_argument("--split-seed", type=cli.nonnegative_int, default=0)
    one.add_argument(
        "--set",
        type=assignment,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a method hyperparameter (repeatable)",
    )
    one.add_argument("--device", type=cli.device, default="cpu")
    one.add_argument("--out", type=cli.output_folder, default="gc4nc-condensed")
    one.set_defaults(func=_run_condense)

    ev = commands.add_parser("evaluate", help="score a condensed graph along the GC4NC dimensions")
    ev.add_argument("condensed", type=cli.existing_folder, help="a folder written by condense")
    ev.add_argument(
        "--dataset",
        type=dataset_name,
        default=None,
        help="default: the dataset recorded in the condensed graph",
    )
    ev.add_argument("--dims", type=dims_list, default=["performance"])
    ev.add_argument("--runs", type=cli.positive_int, default=None, help="default 10 (3 quick)")
    ev.add_argument("--epochs", type=cli.positive_int, default=None, help="default 300 (100 quick)")
    ev.add_argument("--quick", action="store_true", help="short schedules, subsets (NAS)")
    ev.add_argument("--seed", type=cli.nonnegative_int, default=0)
    ev.add_argument("--out", type=cli.output_file, default=None, help="also write the JSON here")
    ev.set_defaults(func=_run_evaluate)

    bench = commands.add_parser("benchmark", help="methods × datasets × rates, tables and heatmaps")
    bench.add_argument(
        "--datasets",
        type=lambda t: [dataset_name(x) for x in t.split(",") if x],
        default=["fashion-knn"],
    )
    bench.add_argument("--methods", type=method_list, default=["random", "kcenter", "gcond"])
    bench.add_argument("--rates", type=rate_list, default=None, help="default: per dataset")
    bench.add_argument("--runs", type=cli.positive_int, default=3)
    bench.add_argument("--epochs", type=cli.positive_int, default=300)
    bench.add_argument("--val-every", type=cli.positive_int, default=1)
    bench.add_argument(
        "--set",
        type=assignment,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a hyperparameter, for every chosen method that takes it (repeatable)",
    )
    bench.add_argument("--seed", type=cli.nonnegative_int, default=0)
    bench.add_argument("--device", type=cli.device, default="cpu")
    bench.add_argument("--no-plots", action="store_true")
    bench.add_argument("--out", type=cli.output_folder, default="gc4nc-benchmark")
    bench.set_defaults(func=_run_benchmark)

    rep = commands.add_parser("reproduce", help="the paper's findings at small scale")
    rep.add_argument("--quick", action="store_true", help="the ≤ 10-minute CPU run")
    rep.add_argument(
        "--out", type=cli.output_folder, default="reports/gc4nc", help="results folder"
    )
    rep.set_defaults(func=_run_reproduce)

    def dispatch(args: argparse.Namespace) -> int:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        return args.func(args)

    return cli.run(parser, dispatch, argv)


if __name__ == "__main__":
    raise SystemExit(main())
