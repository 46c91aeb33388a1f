"""Command line: ``dlgn-gumbel train``, ``dlgn-gumbel compile``, ``dlgn-gumbel reproduce``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path


def _layers(text: str) -> tuple[int, ...]:
    """``8000x4`` (width x depth) or ``8000,8000,4000``."""
    try:
        if "x" in text:
            width, depth = text.split("x")
            return (int(width),) * int(depth)
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"layers must look like 8000x4 or 8000,8000,4000, got {text!r}"
        ) from None


def _train(args: argparse.Namespace) -> int:
    import torch

    from dlgn_gumbel.compiled import compile_logic_net
    from dlgn_gumbel.data import load_images
    from dlgn_gumbel.train import TrainConfig, train

    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_images(args.dataset).subset(args.train_subset, args.test_subset, seed=args.seed)
    config = TrainConfig(
        layer_sizes=args.layers,
        num_thresholds=args.thresholds,
        tau=args.tau,
        relaxation=args.relaxation,
        gumbel_tau=args.gumbel_tau,
        grad_factor=args.grad_factor,
        connections=args.connections,
        lr=args.lr,
        batch_size=args.batch_size,
        steps=args.steps,
        time_budget_s=args.time_budget,
        eval_every=args.eval_every,
        seed=args.seed,
    )
    result = train(
        config,
        data.x_train,
        data.y_train,
        data.x_test,
        data.y_test,
        num_classes=data.num_classes,
        out_dir=args.out,
        resume=args.resume,
        backend=args.backend,
    )
    last = result.history[-1]
    print(
        f"step {result.steps}: discretized test accuracy {last['discrete_acc']:.4f}, "
        f"training-mode {last['train_mode_acc']:.4f} ({result.train_time_s:.1f} s training)"
    )
    compiled = compile_logic_net(result.net)
    compiled.save(Path(args.out) / "compiled")
    print(f"checkpoint and compiled network ({compiled.num_gates} gates) in {args.out}")
    return 0


def _compile(args: argparse.Namespace) -> int:
    from dlgn_gumbel.compiled import compile_logic_net
    from dlgn_gumbel.data import load_images
    from dlgn_gumbel.layers import ThermometerEncoder
    from dlgn_gumbel.train import load_checkpoint

    net, config = load_checkpoint(args.checkpoint)
    compiled = compile_logic_net(net, engine=args.engine)
    compiled.save(args.out)
    print(f"{compiled.num_gates} gates ({compiled.engine} engine) saved to {args.out}")
    if args.dataset:
        data = load_images(args.dataset)
        bits = ThermometerEncoder.uniform(config.num_thresholds)(data.x_test) > 0.5
        start = time.perf_counter()
        predictions = compiled.predict(bits)
        elapsed = time.perf_counter() - start
        accuracy = (predictions == data.y_test).float().mean().item()
        print(
            f"{args.dataset} test accuracy {accuracy:.4f}; "
            f"{bits.shape[0] / elapsed:,.0f} images/s (packing included)"
        )
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from dlgn_gumbel.reproduce import run

    results = run(Path(args.out), quick=args.quick, threads=args.threads)
    print(json.dumps({c.name: c.measured for c in results.claims}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dlgn-gumbel", description="Gumbel logic gate networks: train, compile, reproduce."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    tr = sub.add_parser("train", help="train a logic gate network on an image dataset")
    tr.add_argument("--dataset", choices=("fashion-mnist", "mnist-5k", "digits"), required=True)
    tr.add_argument("--out", required=True, help="checkpoint folder")
    tr.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    tr.add_argument("--relaxation", choices=("gumbel", "softmax"), default="gumbel")
    tr.add_argument("--layers", type=_layers, default=(8000,) * 4, help="e.g. 8000x4")
    tr.add_argument("--thresholds", type=int, default=3, help="thermometer thresholds per pixel")
    tr.add_argument("--tau", type=float, default=10.0, help="GroupSum temperature")
    tr.add_argument("--gumbel-tau", type=float, default=1.0)
    tr.add_argument("--grad-factor", type=float, default=1.0)
    tr.add_argument("--connections", choices=("random", "unique"), default="unique")
    tr.add_argument("--lr", type=float, default=0.01)
    tr.add_argument("--batch-size", type=int, default=128)
    tr.add_argument("--steps", type=int, default=2000)
    tr.add_argument("--time-budget", type=float, default=None, help="seconds of training")
    tr.add_argument("--eval-every", type=int, default=200)
    tr.add_argument("--train-subset", type=int, default=None)
    tr.add_argument("--test-subset", type=int, default=None)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    tr.add_argument("--backend", default=None, help="auto, reference, triton or interpreter")
    tr.set_defaults(func=_train)

    co = sub.add_parser("compile", help="compile a training checkpoint to a Boolean program")
    co.add_argument("--checkpoint", required=True, help="folder written by `train`")
    co.add_argument("--out", required=True)
    co.add_argument("--engine", choices=("auto", "c", "numpy"), default="auto")
    co.add_argument("--dataset", choices=("fashion-mnist", "mnist-5k", "digits"), default=None)
    co.set_defaults(func=_compile)

    rp = sub.add_parser("reproduce", help="softmax vs Gumbel on Fashion-MNIST, paper claims")
    rp.add_argument(
        "--quick",
        action="store_true",
        help="20k-image subset, 110 s of training CPU time per relaxation",
    )
    rp.add_argument("--out", default="results/dlgn-gumbel")
    rp.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    rp.set_defaults(func=_reproduce)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
