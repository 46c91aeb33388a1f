"""``peft-zoo`` command line: ``train``, ``reproduce [--quick]`` and ``bench``."""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
from dataclasses import replace


def _train(args) -> int:
    from peft_zoo.data import arithmetic_problems, lm_batch, qa_batch
    from peft_zoo.models import load_model
    from peft_zoo.trainer import TrainSettings, build_learner, exact_match, perplexity, train

    model, tok = load_model(args.model)
    settings = TrainSettings(steps=args.steps, batch_size=args.batch_size, seed=args.seed)
    if args.lr is not None:
        settings = replace(settings, lr={**settings.lr, args.method: args.lr})
    learner = build_learner(args.method, copy.deepcopy(model), tok, settings)
    report = {"method": args.method, "model": args.model, "task": args.task}
    report["trainable"] = learner.trainable
    if args.task == "fortunes":
        from benchdata import fortunes_corpus

        corpus = fortunes_corpus()
        make = lambda texts: lm_batch(tok, texts, args.max_len, 8)  # noqa: E731
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
        learner.model.save_pretrained(args.save)
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    from peft_zoo.trainer import METHODS

    parser = argparse.ArgumentParser(prog="peft-zoo", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="fine-tune one method and evaluate it")
    train.add_argument("--method", required=True, choices=METHODS)
    train.add_argument("--model", default="tiny", choices=["smollm2-135m", "tiny"])
    train.add_argument("--task", default="fortunes", choices=["fortunes", "arithmetic"])
    train.add_argument("--steps", type=int, default=100)
    train.add_argument("--batch-size", type=int, default=8)
    train.add_argument("--lr", type=float, default=None, help="override the method's default")
    train.add_argument("--max-len", type=int, default=64, help="tokens per fortunes text")
    train.add_argument("--eval-size", type=int, default=64, help="held-out texts / problems")
    train.add_argument(
        "--max-value", type=int, default=50, help="arithmetic: operands drawn from 1..N"
    )
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--save", default=None, help="folder for the adapter (adapter methods)")
    reproduce = commands.add_parser("reproduce", help="all methods, one budget, on SmolLM2")
    reproduce.add_argument("--quick", action="store_true", help="the few-minute CPU run")
    reproduce.add_argument("--out", default="reports/peft-zoo", help="results folder")
    reproduce.add_argument("--model", default=None, choices=["smollm2-135m", "tiny"])
    bench = commands.add_parser("bench", help="step time and memory against peft / torch Adam")
    bench.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    bench.add_argument("--out", default=None, help="folder for bench_peft_zoo.json/.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.command == "train":
        return _train(args)
    if args.command == "reproduce":
        from peft_zoo.reproduce import run

        results = run(args.out, quick=args.quick, model_name=args.model)
        logging.getLogger("peft_zoo").info(
            "results in %s (all claims pass: %s)", args.out, results.passed
        )
        return 0
    from peft_zoo.benchmark import run as run_benchmark

    sys.stdout.write(run_benchmark(args.device, args.out).to_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
