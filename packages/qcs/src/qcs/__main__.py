"""Command line: ``qcs select | finetune | compare | reproduce``.

Bad arguments are refused with one line (``qcs: error: …``, exit code 2) before any work starts.
The data of ``select``, ``finetune`` and ``compare`` is the task of :mod:`qcs.task` (ShareGPT +
the arithmetic target, planted noise), or ``--data`` your own JSONL as the general pairs;
a selection records the task settings, and ``finetune`` rebuilds the same pool from them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from kernels_common import cli

METHOD_NAMES = ("qcs", "qcs-seq", "less", "ifd", "random", "full")


def _task_settings(args: argparse.Namespace):
    from qcs.task import TaskSettings

    return TaskSettings(pool_general=args.pool, pool_target=args.pool_target,
                        validation=args.validation, heldout=args.heldout,
                        target_test=args.target_test, max_length=args.max_length,
                        max_prompt_tokens=args.max_prompt_tokens,
                        sequence_noise=args.sequence_noise, token_noise=args.token_noise,
                        seed=args.seed)  # fmt: skip


def _bench(args: argparse.Namespace, settings):
    from qcs.api import Workbench
    from qcs.data import read_pairs
    from qcs.lm import LoraSettings, load_model
    from qcs.task import build_task

    general = read_pairs(args.data, args.format) if args.data is not None else None
    model, tokenizer = load_model(args.model)
    model.to(args.device)
    task = build_task(tokenizer, settings, general=general)
    lora = LoraSettings(r=args.lora_r, alpha=args.lora_alpha, layers=args.lora_layers)
    bench = Workbench(model, task.pool, task.validation, lora, heldout=task.heldout,
                      seed=args.seed)  # fmt: skip
    return bench, task, tokenizer


def _configs(args: argparse.Namespace):
    from qcs.baselines import LessConfig
    from qcs.solver import QCSConfig
    from qcs.train import TrainConfig

    qcs = QCSConfig(token_ratio=args.token_ratio, epsilon=args.epsilon,
                    outer_steps=args.outer_steps, samples=args.samples,
                    inner=TrainConfig(steps=args.inner_steps, batch_size=args.batch_size,
                                      lr=args.inner_lr))  # fmt: skip
    less = LessConfig(projection_dim=args.projection_dim)
    train = TrainConfig(steps=1, batch_size=args.batch_size, lr=args.lr)
    return qcs, less, train


def _select(args: argparse.Namespace) -> int:
    qcs, less, _ = _configs(args)  # refused before the model loads
    settings = _task_settings(args)
    bench, _, _ = _bench(args, settings)
    selection = bench.select(args.method, args.budget, config=qcs, less=less, progress=None)
    selection.settings = selection.settings | {
        "task": asdict(settings), "data": None if args.data is None else str(args.data),
        "format": args.format, "lora": {"r": args.lora_r, "alpha": args.lora_alpha,
                                        "layers": args.lora_layers}, "seed": args.seed,
    }  # fmt: skip
    selection.save(args.out)
    print(json.dumps({"method": selection.method, "size": len(selection),
                      "seconds": round(selection.seconds, 2), "out": str(args.out)}))  # fmt: skip
    return 0


def _finetune(args: argparse.Namespace) -> int:
    from qcs.selection import Selection
    from qcs.task import TaskSettings

    _, _, train = _configs(args)
    selection = Selection.load(args.selection)
    task = selection.settings.get("task")
    if not isinstance(task, dict):
        raise ValueError(f"{args.selection} records no task settings (not written by qcs select)")
    if selection.settings.get("data") is not None:
        args.data, args.format = Path(selection.settings["data"]), selection.settings["format"]
    # the pool and adapters the selection was made with, not this command's defaults
    lora = selection.settings.get("lora", {})
    args.lora_r = lora.get("r", args.lora_r)
    args.lora_alpha = lora.get("alpha", args.lora_alpha)
    args.lora_layers = lora.get("layers", args.lora_layers)
    args.seed = selection.settings.get("seed", args.seed)
    bench, _data, _tokenizer = _bench(args, TaskSettings(**task))
    row = bench.finetune(selection, train, epochs=args.epochs)
    report = {"train_loss_last": row[-1], "steps": len(row)}
    report |= {f"{name}_loss": s.mean_loss() for name, s in bench.heldout.items()}
    bench.model.save_pretrained(args.out)
    print(json.dumps(report | {"adapter": str(args.out)}))
    return 0


def _compare(args: argparse.Namespace) -> int:
    qcs, less, train = _configs(args)
    bench, task, tokenizer = _bench(args, _task_settings(args))
    rows = []
    for budget in args.budgets:
        for method in [m for m in args.methods if m != "full"]:
            selection = bench.select(method, budget, config=qcs, less=less, progress=None)
            rows.append(bench.evaluate(selection, train, epochs=args.epochs,
                                       target=task.target_test, tokenizer=tokenizer))  # fmt: skip
    if "full" in args.methods:
        rows.append(bench.evaluate(bench.select("full", 1.0), train, epochs=args.epochs,
                                   target=task.target_test, tokenizer=tokenizer))  # fmt: skip
    text = json.dumps(rows, indent=1)
    if args.out is not None:
        with cli.atomic_file(args.out) as temporary:
            temporary.write_text(text + "\n")
    print(text)
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from qcs.reproduce import reproduce

    results = reproduce(args.out, quick=args.quick)
    print(f"results: {args.out / 'results.json'} "
          f"({'all claims agree' if results.passed else 'some claims disagree'})")  # fmt: skip
    return 0


def _methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHOD_NAMES]
    if unknown or not methods:
        raise argparse.ArgumentTypeError(
            f"unknown method(s) {unknown or text!r}; known: {', '.join(METHOD_NAMES)}"
        )
    return methods


def _budget(text: str) -> float:
    value = cli.positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(
            f"a budget is a fraction of the pool in (0, 1], got {text}"
        )
    return value


def _budgets(text: str) -> list[float]:
    return [_budget(t) for t in text.split(",") if t.strip()] or [_budget(text)]


def _epsilon(text: str) -> float:
    value = cli.nonnegative_float(text)
    if value >= 0.5:
        raise argparse.ArgumentTypeError(f"epsilon must be in [0, 0.5), got {text}")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        type=cli.existing_folder,
        help="a Hugging Face model folder (default: SmolLM2-135M-Instruct)",
    )
    parser.add_argument("--device", type=cli.device, default="cpu", help="cpu, cuda, cuda:1...")
    parser.add_argument(
        "--data", type=cli.existing_file, help="your own JSONL of general pairs (default: ShareGPT)"
    )
    parser.add_argument("--format", choices=("alpaca", "sharegpt"), default="alpaca")
    parser.add_argument(
        "--pool", type=cli.positive_int, default=160, help="general pairs in the pool"
    )
    parser.add_argument(
        "--pool-target", type=cli.nonnegative_int, default=40, help="target-task items in the pool"
    )
    parser.add_argument("--validation", type=cli.positive_int, default=16)
    parser.add_argument("--heldout", type=cli.positive_int, default=48)
    parser.add_argument("--target-test", type=cli.positive_int, default=40)
    parser.add_argument("--max-length", type=cli.positive_int, default=128)
    parser.add_argument("--max-prompt-tokens", type=cli.positive_int, default=64)
    parser.add_argument("--sequence-noise", type=cli.fraction, default=0.2)
    parser.add_argument("--token-noise", type=cli.fraction, default=0.2)
    parser.add_argument("--lora-r", type=cli.positive_int, default=8)
    parser.add_argument("--lora-alpha", type=cli.positive_float, default=16.0)
    parser.add_argument(
        "--lora-layers",
        type=cli.positive_int,
        default=2,
        help="LoRA on the top N layers (the frozen rest is cached)",
    )
    parser.add_argument("--token-ratio", type=_budget, default=0.5)
    parser.add_argument("--epsilon", type=_epsilon, default=0.1)
    parser.add_argument("--outer-steps", type=cli.positive_int, default=30)
    parser.add_argument("--samples", type=cli.positive_int, default=4, help="K draws per step")
    parser.add_argument("--inner-steps", type=cli.positive_int, default=1)
    parser.add_argument("--inner-lr", type=cli.positive_float, default=2e-3)
    parser.add_argument("--projection-dim", type=cli.positive_int, default=8192, help="LESS")
    parser.add_argument("--batch-size", type=cli.positive_int, default=8)
    parser.add_argument("--lr", type=cli.positive_float, default=1e-3, help="fine-tuning rate")
    parser.add_argument("--epochs", type=cli.positive_int, default=3, help="fine-tuning epochs")
    parser.add_argument("--seed", type=int, default=0)


def _parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="qcs", description="Quadratic coreset selection: select, finetune, compare, reproduce."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    sl = sub.add_parser("select", help="one method's selection, saved as JSON")
    sl.add_argument("--method", choices=METHOD_NAMES, default="qcs")
    sl.add_argument("--budget", type=_budget, default=0.05, help="fraction of the pool")
    sl.add_argument("--out", type=cli.output_file, required=True, help="selection JSON")
    _common(sl)
    sl.set_defaults(func=_select)

    ft = sub.add_parser("finetune", help="LoRA fine-tuning on a saved selection")
    ft.add_argument("--selection", type=cli.existing_file, required=True)
    ft.add_argument("--out", type=cli.output_folder, required=True, help="adapter folder")
    _common(ft)
    ft.set_defaults(func=_finetune)

    cp = sub.add_parser("compare", help="every method at every budget, judged alike")
    cp.add_argument("--methods", type=_methods, default=list(METHOD_NAMES))
    cp.add_argument("--budgets", type=_budgets, default=[0.05, 0.2])
    cp.add_argument("--out", type=cli.output_file, help="also write the rows as JSON here")
    _common(cp)
    cp.set_defaults(func=_compare)

    rp = sub.add_parser("reproduce", help="the paper's claims at small scale")
    rp.add_argument("--quick", action="store_true", help="the ~10-minute CPU run")
    rp.add_argument("--out", type=cli.output_folder, default=Path("reports/qcs"))
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
