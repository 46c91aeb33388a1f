"""``lpc-cache`` command line: build traces, train the predictor, simulate, sweep, reproduce."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def _add_trace_build(commands) -> None:
    build = commands.add_parser("trace", help="trace tools").add_subparsers(
        dest="trace_command", required=True
    )
    parser = build.add_parser("build", help="a JSONL trace from ShareGPT (benchdata)")
    parser.add_argument("--out", required=True, help="JSONL file to write")
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--offset", type=int, default=0, help="first conversation index")
    parser.add_argument("--arrival-rate", type=float, default=1.0, help="conversations/s")
    parser.add_argument("--mean-gap", type=float, default=100.0, help="inter-turn gap, s")
    parser.add_argument("--max-concurrent", type=int, default=200)
    parser.add_argument("--max-prompt-tokens", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)


def _add_common_sim(parser) -> None:
    parser.add_argument("--trace", required=True, help="JSONL trace")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--predictor", default=None, help="predictor folder (needed for lpc)")
    parser.add_argument("--scale", type=float, default=1e-2, help="LPC decay per second")


def _probabilities(args, trace, policies: list[str]):
    if "lpc" not in policies:
        return None
    if args.predictor is None:
        raise SystemExit("the lpc policy needs --predictor DIR (see `lpc-cache train-predictor`)")
    from lpc_cache.encoders import SentenceEncoder
    from lpc_cache.predictor import ContinuationPredictor

    predictor = ContinuationPredictor.load(args.predictor)
    return predictor.predict_trace(trace, SentenceEncoder(cache_dir=Path(args.predictor)))


def _policy(name: str, scale: float):
    from lpc_cache.policies import make_policy

    return make_policy(name, scale=scale) if name == "lpc" else make_policy(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lpc-cache", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_trace_build(commands)

    train = commands.add_parser("train-predictor", help="train the continuation predictor")
    train.add_argument("--trace", required=True, help="JSONL trace with user_text")
    train.add_argument("--out", required=True, help="folder for the predictor")
    train.add_argument("--validation-fraction", type=float, default=0.2)
    train.add_argument("--seed", type=int, default=0)

    simulate = commands.add_parser("simulate", help="replay a trace against one cache")
    _add_common_sim(simulate)
    simulate.add_argument("--policy", required=True)
    simulate.add_argument("--capacity-tokens", type=int, required=True)
    simulate.add_argument("--json", action="store_true", help="print a JSON object")

    sweep = commands.add_parser("sweep", help="hit ratio vs capacity curves and a plot")
    _add_common_sim(sweep)
    sweep.add_argument("--policies", default="lru,lfu,fifo,oracle,belady")
    sweep.add_argument("--capacities", required=True, help="comma-separated tokens")
    sweep.add_argument("--out", required=True, help="folder for sweep.json and hit_ratio.png")

    reproduce = commands.add_parser("reproduce", help="the paper's experiment on ShareGPT")
    reproduce.add_argument("--quick", action="store_true", help="the few-minute CPU run")
    reproduce.add_argument("--out", default="reports/lpc-cache", help="results folder")

    bench = commands.add_parser("bench", help="simulator and predictor throughput")
    bench.add_argument("--out", default=None, help="folder for bench_lpc_cache.json/.md")
    bench.add_argument("--conversations", type=int, default=2000)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    if args.command == "trace":
        from lpc_cache.trace import TraceConfig, save_trace, sharegpt_trace

        config = TraceConfig(
            args.arrival_rate, args.mean_gap, args.max_concurrent, args.max_prompt_tokens, args.seed
        )
        trace = sharegpt_trace(args.conversations, config, offset=args.offset)
        save_trace(trace, args.out)
        print(f"{len(trace)} requests of {len(trace.conversations)} conversations -> {args.out}")
        return 0
    if args.command == "train-predictor":
        return _train(args)
    if args.command in ("simulate", "sweep"):
        try:
            return _simulate(args)
        except (ValueError, TypeError, FileNotFoundError) as error:  # bad trace or arguments
            parser.exit(2, f"lpc-cache {args.command}: error: {error}\n")
    if args.command == "reproduce":
        from lpc_cache.reproduce import run

        results = run(args.out, quick=args.quick)
        print(f"results in {args.out} (all claims pass: {results.passed})")
        return 0
    from lpc_cache.benchmark import run as run_benchmark

    sys.stdout.write(run_benchmark(args.out, conversations=args.conversations))
    return 0


def _train(args) -> int:
    from lpc_cache.encoders import MINILM_WORD_BUDGET, SentenceEncoder
    from lpc_cache.predictor import (
        ContinuationPredictor,
        PredictorConfig,
        mcc,
        roc_auc,
        split_conversations,
        trace_features,
    )
    from lpc_cache.trace import load_trace

    trace = load_trace(args.trace)
    encoder = SentenceEncoder(cache_dir=Path(args.out))
    config = PredictorConfig(
        embedding_dim=encoder.dim, word_budget=MINILM_WORD_BUDGET, seed=args.seed
    )
    val_ids, train_ids = split_conversations(
        trace.conversations, (args.validation_fraction, 1 - args.validation_fraction), args.seed
    )
    x_train, y_train = trace_features(trace.subset(train_ids), encoder, config)
    x_val, y_val = trace_features(trace.subset(val_ids), encoder, config)
    predictor = ContinuationPredictor(config)
    history = predictor.fit(x_train, y_train, x_val, y_val)
    predictor.save(args.out)
    p = predictor.predict_proba(x_val)
    report = {
        "validation_mcc": mcc(y_val, p > 0.5),
        "validation_auc": roc_auc(y_val, p),
        "best_epoch": history["best_epoch"],
    }
    (Path(args.out) / "training.json").write_text(json.dumps({**report, **history}, indent=2))
    print(json.dumps(report))
    return 0


def _simulate(args) -> int:
    from lpc_cache.simulator import simulate, sweep
    from lpc_cache.trace import load_trace

    trace = load_trace(args.trace)
    if args.command == "simulate":
        probabilities = _probabilities(args, trace, [args.policy])
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
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    try:
        capacities = sorted(int(c) for c in args.capacities.split(","))
    except ValueError:
        raise SystemExit(
            f"--capacities must be comma-separated integers, got {args.capacities!r}"
        ) from None
    probabilities = _probabilities(args, trace, names)
    factories = {n: (lambda n=n: _policy(n, args.scale)) for n in names}
    curves = sweep(
        trace, factories, capacities, block_size=args.block_size, probabilities=probabilities
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {n: [r.to_json() for r in rs] for n, rs in curves.items()}
    (out / "sweep.json").write_text(json.dumps(data, indent=2))
    from kernels_common.plotting import plot_curves

    plot_curves(
        {n: (capacities, [r.hit_ratio for r in rs]) for n, rs in curves.items()},
        out / "hit_ratio.png",
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
