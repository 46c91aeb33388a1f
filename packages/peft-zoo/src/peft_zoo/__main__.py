"""``peft-zoo`` command line: ``train``, ``reproduce [--quick]`` and ``bench``.

A bad argument is refused with one line, ``peft-zoo: error: <message>``, and exit code 2, before
any model is loaded or trained (``--debug`` shows the traceback). Outputs appear whole or not at
all: a saved adapter and the ``reproduce`` / ``bench`` folders are written under temporary names
and renamed at the end.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

from kernels_common import cli

PROG = "peft-zoo"
CONTEXT_LEN = 8  # fortunes: the first tokens of a text are context, without loss
PEFT_METHODS = ("lora", "prompt-tuning")  # built with the peft library


def _max_len(text: str) -> int:
    """Tokens per fortunes text: more than the context, so every text has a target."""
    value = cli.positive_int(text)
    if value <= CONTEXT_LEN:
        raise argparse.ArgumentTypeError(
            f"expected an integer > {CONTEXT_LEN} (the first {CONTEXT_LEN} tokens of a text are "
            f"context without loss), got {text!r}"
        )
    return value


def _max_value(text: str) -> int:
    """Arithmetic operands are drawn from 1..N; subtraction needs N >= 2."""
    value = cli.positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected an integer >= 2, got {text!r}")
    return value


def _bench_device(text: str) -> str:
    """``cpu`` or ``cuda``, and available here."""
    if text not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from 'cpu', 'cuda')")
    return cli.device(text)


def _require(module: str, install: str, what: str) -> None:
    """Refuse before any work when an optional dependency is missing."""
    if importlib.util.find_spec(module) is None:
        raise cli.CommandError(f"{what} needs {module}: pip install '{install}'")


def _train(args) -> int:
    from peft_zoo.data import arithmetic_problems, lm_batch, qa_batch
    from peft_zoo.models import load_model
    from peft_zoo.trainer import TrainSettings, build_learner, exact_match, perplexity, train

    # every check comes before the model is loaded
    settings = TrainSettings(steps=args.steps, batch_size=args.batch_size, seed=args.seed)
    if args.lr is not None:
        settings = replace(settings, lr={**settings.lr, args.method: args.lr})
    if args.method in PEFT_METHODS:
        _require("peft", "peft-zoo[bench]", f"method {args.method!r}")
    if args.model == "smollm2-135m" or args.task == "fortunes":
        _require("benchdata", "peft-zoo[reproduce]", f"--model {args.model} --task {args.task}")
    corpus = None
    if args.task == "fortunes":
        from benchdata import fortunes_corpus

        corpus = fortunes_corpus()
        if args.eval_size > len(corpus.validation):
            raise ValueError(
                f"--eval-size {args.eval_size} is more than the {len(corpus.validation)} "
                "held-out fortunes"
            )

    model, tok = load_model(args.model)
    learner = build_learner(args.method, copy.deepcopy(model), tok, settings)
    report = {"method": args.method, "model": args.model, "task": args.task}
    report["trainable"] = learner.trainable
    if corpus is not None:
        make = lambda texts: lm_batch(tok, texts, args.max_len, CONTEXT_LEN)  # noqa: E731
        held_out = [make(corpus.validation[i : i + 8]) for i in range(0, args.eval_size, 8)]
        report["ppl_before"] = perplexity(learner, held_out)
        report["losses"] = train(learner, corpus.train, make, settings)
        report["ppl_after"] = perplexity(learner, held_out)
    else:
        problems = arithmetic_problems(
            2000 + args.eval_size, seed=args.seed, max_value=args.max_value
        )
        held_out = problems[2000:]
        report["em_before"] = exact_match(learner, tok, held_out)
        report["losses"] = train(learner, problems[:2000], lambda p: qa_batch(tok, p), settings)
        report["em_after"] = exact_match(learner, tok, held_out)
    if args.save and hasattr(learner.model, "save_pretrained"):
        try:
            with cli.atomic_folder(args.save) as folder:  # the adapter appears whole or not at all
                learner.model.save_pretrained(folder)
        except OSError as error:  # name the folder asked for, not the temporary one
            reason = error.strerror or str(error)
            raise cli.CommandError(f"cannot save the adapter to {args.save}: {reason}") from error
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0


def build_parser() -> cli.ArgumentParser:
    from peft_zoo.models import MODELS
    from peft_zoo.trainer import METHODS

    parser = cli.ArgumentParser(prog=PROG, description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="fine-tune one method and evaluate it")
    train.add_argument("--method", required=True, choices=METHODS)
    train.add_argument("--model", default="tiny", choices=list(MODELS))
    train.add_argument("--task", default="fortunes", choices=["fortunes", "arithmetic"])
    train.add_argument("--steps", type=cli.positive_int, default=100)
    train.add_argument("--batch-size", type=cli.positive_int, default=8)
    train.add_argument(
        "--lr", type=cli.positive_float, default=None, help="override the method's default"
    )
    train.add_argument("--max-len", type=_max_len, default=64, help="tokens per fortunes text")
    train.add_argument(
        "--eval-size", type=cli.positive_int, default=64, help="held-out texts / problems"
    )
    train.add_argument(
        "--max-value", type=_max_value, default=50, help="arithmetic: operands drawn from 1..N"
    )
    train.add_argument("--seed", type=cli.nonnegative_int, default=0)
    train.add_argument(
        "--save", type=cli.output_folder, default=None, help="folder for the adapter"
    )
    reproduce = commands.add_parser("reproduce", help="all methods, one budget, on SmolLM2")
    reproduce.add_argument("--quick", action="store_true", help="the few-minute CPU run")
    reproduce.add_argument(
        "--out", type=cli.output_folder, default="reports/peft-zoo", help="results folder"
    )
    reproduce.add_argument("--model", default=None, choices=list(MODELS))
    bench = commands.add_parser("bench", help="step time and memory against peft / torch Adam")
    bench.add_argument("--device", type=_bench_device, default="cpu", help="cpu or cuda")
    bench.add_argument(
        "--out", type=cli.output_folder, default=None, help="folder for bench_peft_zoo.json/.md"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    return cli.run(build_parser(), _dispatch, argv)


def _dispatch(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.command == "train":
        return _train(args)
    if args.command == "reproduce":
        for module in ("benchdata", "peft", "matplotlib"):
            _require(module, "peft-zoo[reproduce]", "reproduce")
        from peft_zoo.reproduce import run

        results = run(args.out, quick=args.quick, model_name=args.model)
        logging.getLogger("peft_zoo").info(
            "results in %s (all claims pass: %s)", Path(args.out), results.passed
        )
        return 0
    _require("peft", "peft-zoo[bench]", "bench")
    from peft_zoo.benchmark import run as run_benchmark

    sys.stdout.write(run_benchmark(args.device, args.out).to_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
