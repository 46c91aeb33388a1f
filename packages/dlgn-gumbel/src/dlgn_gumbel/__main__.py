"""Command line: ``dlgn-gumbel train``, ``dlgn-gumbel compile``, ``dlgn-gumbel reproduce``."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

from dlgn_gumbel.choices import CONNECTIONS, INITS, LAYOUTS, NOISES, RELAXATIONS
from kernels_common import cli

_DATASETS = ("fashion-mnist", "mnist-5k", "digits")
_BACKENDS = ("auto", "reference", "triton", "interpreter")
_MAX_DEPTH = 10_000  # a sanity bound on "WIDTHxDEPTH": far beyond any trainable depth
_MAX_SEED = 2**40  # the batch and noise seeds (seed * 1_000_003 + epoch) must fit torch's range


def _layers(text: str) -> tuple[int, ...]:
    """``8000x4`` (width x depth) or ``8000,8000,4000``, every width >= 1."""
    try:
        if "x" in text:
            width, depth = (int(v) for v in text.split("x"))
            if depth > _MAX_DEPTH:  # before a tuple of that length is built
                raise argparse.ArgumentTypeError(
                    f"at most {_MAX_DEPTH} layers, got {depth} in {text!r}"
                )
            sizes = (width,) * depth
        else:
            sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"layers must look like 8000x4 or 8000,8000,4000 (positive widths, at least one "
            f"layer), got {text!r}"
        )
    return sizes


def _seed(text: str) -> int:
    value = cli.nonnegative_int(text)
    if value >= _MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed below 2**40, got {text!r}")
    return value


def _draws(text: str) -> int:
    value = cli.positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"need at least 2 draws, got {text!r}")
    return value


def _backend(text: str) -> str:
    """A logic-layer backend name that can run here: training runs on the CPU."""
    if text.strip().lower() not in _BACKENDS:
        raise argparse.ArgumentTypeError(
            f"unknown backend {text!r} (choose from {', '.join(_BACKENDS)})"
        )
    import torch

    from kernels_common.backend import BackendUnavailableError, resolve_backend

    try:
        resolve_backend(text, [torch.empty(0)])
    except (ValueError, BackendUnavailableError) as error:
        raise argparse.ArgumentTypeError(f"backend {text!r}: {error}") from None
    return text


def _checkpoint(text: str) -> Path:
    """A folder written by ``train`` whose two files are whole and from the same step."""
    path = cli.existing_folder(text)
    from dlgn_gumbel.train import check_checkpoint

    try:
        check_checkpoint(path)
    except (OSError, ValueError) as error:
        raise argparse.ArgumentTypeError(cli.describe(error)) from None
    return path


def _check_widths(in_bits: int, layer_sizes: tuple[int, ...], connections: str) -> None:
    """``--connections unique`` and ``difflogic`` need each layer to read every one of its
    inputs."""
    if connections == "random":
        return
    width = in_bits
    for i, size in enumerate(layer_sizes):
        if 2 * size < width:
            raise cli.CommandError(
                f"--connections {connections} needs every layer at least half as wide as its "
                f"input; layer {i + 1} has {size} neurons for {width} inputs (use wider --layers "
                "or --connections random)"
            )
        width = size


def _add_architecture(parser: argparse.ArgumentParser, *, layers: tuple[int, ...] | None) -> None:
    """The network's options, shared by ``train`` and ``diagnose``. ``layers=None``: no
    defaults (``diagnose`` tells given options from absent ones)."""
    defaults = layers is not None

    def default(value):
        return value if defaults else None

    if defaults:  # diagnose compares relaxations: it has --noisy instead
        parser.add_argument("--relaxation", choices=RELAXATIONS, default="gumbel")
    parser.add_argument("--layers", type=_layers, default=layers, help="e.g. 8000x4")
    parser.add_argument(
        "--tau", type=cli.positive_float, default=default(10.0), help="GroupSum temperature"
    )
    parser.add_argument("--gumbel-tau", type=cli.positive_float, default=default(1.0))
    parser.add_argument("--grad-factor", type=cli.positive_float, default=default(1.0))
    parser.add_argument("--connections", choices=CONNECTIONS, default=default("unique"))
    parser.add_argument(
        "--init",
        choices=INITS,
        default=default("randn"),
        help="logits N(0, 1) (randn, the published recipe) or init-sigma on gate A (residual)",
    )
    parser.add_argument(
        "--init-sigma",
        type=_finite_float,
        default=None,
        help="residual init's logit of gate A (default 5.0; only with --init residual)",
    )
    parser.add_argument(
        "--groups",
        type=cli.positive_int,
        default=None,
        help="GroupSum groups (default: the number of classes; the paper's code uses 100 for "
        "10 classes, the extra groups' scores only entering the cross-entropy)",
    )
    parser.add_argument(
        "--thresholds",
        type=cli.positive_int,
        default=default(3),
        help="thermometer thresholds per pixel",
    )
    parser.add_argument(
        "--thermometer-layout",
        choices=LAYOUTS,
        default=default("feature"),
        help="feature: a pixel's bits side by side; threshold: one image per threshold (the "
        "paper's code)",
    )


def _add_noise(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    parser.add_argument(
        "--noise",
        choices=NOISES,
        default=default,
        help="one noise draw per neuron and step (shared) or per neuron and example",
    )


def _groups(value: int | None, classes: int, dataset: str) -> int:
    """``--groups``: GroupSum's k, the dataset's class count unless given; at least that many."""
    if value is None:
        return classes
    if value < classes:
        raise cli.CommandError(
            f"--groups {value}: {dataset} has {classes} classes, need >= {classes}"
        )
    return value


def _init_sigma(value: float | None, init: str) -> float:
    """``--init-sigma`` belongs to ``--init residual``: refused with another init, 5.0 when not
    given."""
    if value is None:
        return 5.0
    if init != "residual":
        raise cli.CommandError(f"--init-sigma {value:g} needs --init residual (got --init {init})")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _train(args: argparse.Namespace) -> int:
    import torch

    from dlgn_gumbel.compiled import compile_logic_net
    from dlgn_gumbel.data import DATASET_SHAPES, load_images
    from dlgn_gumbel.train import TrainConfig, check_checkpoint, check_resumable, train
    from kernels_common.backend import resolve_backend

    # every check that needs no data first: a bad invocation is refused before any work
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
        init=args.init,
        init_sigma=_init_sigma(args.init_sigma, args.init),
        noise=args.noise,
        thermometer_layout=args.thermometer_layout,
    )
    if args.noise == "per_example" and args.relaxation == "softmax":
        raise cli.CommandError("--noise per_example: the softmax relaxation draws no noise")
    pixels, num_classes = DATASET_SHAPES[args.dataset]
    groups = _groups(args.groups, num_classes, args.dataset)
    try:  # e.g. the last width must split into the groups
        config.net_config(pixels, groups)
    except ValueError as error:
        raise cli.CommandError(f"--layers {','.join(map(str, args.layers))}: {error}") from None
    _check_widths(pixels * config.num_thresholds, config.layer_sizes, config.connections)
    resolve_backend(args.backend, [torch.empty(0)])  # $KERNELS_COMMON_BACKEND when not given
    if args.resume:
        try:
            meta = check_checkpoint(args.out)
        except (OSError, ValueError) as error:
            raise cli.CommandError(f"--resume: {cli.describe(error)}") from None
        check_resumable(meta, config, args.out)
        if meta["net_config"]["num_classes"] != groups:
            raise cli.CommandError(
                f"--resume: the checkpoint in {args.out} has {meta['net_config']['num_classes']} "
                f"GroupSum groups, not {groups} (--groups)"
            )

    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_images(args.dataset).subset(args.train_subset, args.test_subset, seed=args.seed)
    result = train(
        config,
        data.x_train,
        data.y_train,
        data.x_test,
        data.y_test,
        num_classes=groups,
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
    from dlgn_gumbel.data import DATASET_SHAPES, load_images
    from dlgn_gumbel.train import check_checkpoint, load_checkpoint

    # --checkpoint was checked by the parser; refuse what else can be known before any work
    meta = check_checkpoint(args.checkpoint)
    if args.engine == "c":
        from dlgn_gumbel.cbuild import load_evaluator

        load_evaluator()  # no compiler: CompilerUnavailableError, reported by _dispatch
    if args.dataset:
        expected = DATASET_SHAPES[args.dataset][0] * meta["config"]["num_thresholds"]
        if meta["net_config"]["in_dim"] != expected:
            raise cli.CommandError(
                f"{args.checkpoint} was trained on {meta['net_config']['in_dim']} input bits, "
                f"but --dataset {args.dataset} gives {expected}"
            )
    net, config = load_checkpoint(args.checkpoint)
    compiled = compile_logic_net(net, engine=args.engine)
    data = load_images(args.dataset) if args.dataset else None  # before anything is written
    compiled.save(args.out)
    print(f"{compiled.num_gates} gates ({compiled.engine} engine) saved to {args.out}")
    if data is not None:
        bits = config.encoder()(data.x_test) > 0.5
        start = time.perf_counter()
        predictions = compiled.predict(bits)
        elapsed = time.perf_counter() - start
        accuracy = (predictions == data.y_test).float().mean().item()
        print(
            f"{args.dataset} test accuracy {accuracy:.4f}; "
            f"{bits.shape[0] / elapsed:,.0f} images/s (packing included)"
        )
    return 0


_ARCHITECTURE = ("layers", "groups", "tau", "gumbel_tau", "grad_factor", "connections",
                 "init", "init_sigma", "thresholds", "thermometer_layout")  # fmt: skip
# diagnose's network when none is loaded: the quick reproduce's depth and width
_ARCHITECTURE_DEFAULTS = {
    "layers": (2000,) * 6,
    "groups": None,  # the dataset's classes
    "tau": 10.0,
    "gumbel_tau": 1.0,
    "grad_factor": 1.0,
    "connections": "unique",
    "init": "randn",
    "init_sigma": None,  # checked against --init by _init_sigma
    "thresholds": 3,
    "thermometer_layout": "feature",
}


def _diagnose(args: argparse.Namespace) -> int:
    import torch

    from dlgn_gumbel.data import DATASET_SHAPES, load_images
    from dlgn_gumbel.diagnose import gradient_agreement
    from dlgn_gumbel.layers import LogicNet
    from dlgn_gumbel.train import TrainConfig, batch_indices, load_checkpoint

    given = [name for name in _ARCHITECTURE if getattr(args, name) is not None]
    pixels, num_classes = DATASET_SHAPES[args.dataset]
    if args.checkpoint is not None:
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise cli.CommandError(f"{flags}: the network comes from --checkpoint; drop them")
        net, config = load_checkpoint(args.checkpoint, backend="reference")
        if net.config.in_dim != pixels * config.num_thresholds:
            raise cli.CommandError(
                f"{args.checkpoint} was trained on {net.config.in_dim} input bits, but "
                f"--dataset {args.dataset} gives {pixels * config.num_thresholds}"
            )
    else:
        options = {name: getattr(args, name) for name in _ARCHITECTURE}
        options = {k: _ARCHITECTURE_DEFAULTS[k] if v is None else v for k, v in options.items()}
        config = TrainConfig(
            layer_sizes=options["layers"],
            num_thresholds=options["thresholds"],
            tau=options["tau"],
            relaxation=args.noisy,
            gumbel_tau=options["gumbel_tau"],
            grad_factor=options["grad_factor"],
            connections=options["connections"],
            init=options["init"],
            init_sigma=_init_sigma(args.init_sigma, options["init"]),
            thermometer_layout=options["thermometer_layout"],
            seed=args.seed,
        )
        try:
            net_config = config.net_config(pixels, _groups(args.groups, num_classes, args.dataset))
        except ValueError as error:
            raise cli.CommandError(f"--layers: {error}") from None
        _check_widths(pixels * config.num_thresholds, config.layer_sizes, config.connections)
        net = LogicNet.from_config(net_config, backend="reference")
    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_images(args.dataset)
    idx = batch_indices(data.x_train.shape[0], args.batch_size, 0, args.seed)
    x, y = config.encoder()(data.x_train[idx]), data.y_train[idx]
    result = gradient_agreement(
        net, x, y, draws=args.draws, relaxation=args.noisy, noise=args.noise, seed=args.seed
    )
    print(
        f"{args.noisy} ({result.noise} noise) vs softmax logit gradients, {result.draws} draws, "
        f"one batch of {result.batch_size} {args.dataset} images; draws of pure noise would give "
        f"cos(draw, mean) ~ {result.pure_noise_reference:.3f}"
    )
    print(result.to_markdown(), end="")
    if args.out is not None:
        payload = {
            "dataset": args.dataset,
            "checkpoint": None if args.checkpoint is None else str(args.checkpoint),
            "net_config": net.config.to_dict(),
            "num_thresholds": config.num_thresholds,
            "thermometer_layout": config.thermometer_layout,
            "relaxation": result.relaxation,
            "noise": result.noise,
            "draws": result.draws,
            "batch_size": result.batch_size,
            "seed": args.seed,
            "layers": [vars(row) for row in result.layers],
        }
        with cli.atomic_file(args.out) as tmp:
            tmp.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from dlgn_gumbel.reproduce import run

    results = run(Path(args.out), quick=args.quick, threads=args.threads)
    print(json.dumps({c.name: c.measured for c in results.claims}, indent=2))
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    from dlgn_gumbel.cbuild import CompilerUnavailableError

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        return args.func(args)
    except CompilerUnavailableError as error:  # a RuntimeError, but the user's to fix
        hint = "" if "numpy" in str(error) else " (or use --engine numpy)"
        raise cli.CommandError(f"{error}{hint}") from error


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(
        prog="dlgn-gumbel", description="Gumbel logic gate networks: train, compile, reproduce."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    tr = sub.add_parser("train", help="train a logic gate network on an image dataset")
    tr.add_argument("--dataset", choices=_DATASETS, required=True)
    tr.add_argument("--out", type=cli.output_folder, required=True, help="checkpoint folder")
    tr.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    _add_architecture(tr, layers=(8000,) * 4)
    _add_noise(tr, default="shared")
    tr.add_argument("--lr", type=cli.positive_float, default=0.01)
    tr.add_argument("--batch-size", type=cli.positive_int, default=128)
    tr.add_argument("--steps", type=cli.positive_int, default=2000)
    tr.add_argument(
        "--time-budget", type=cli.positive_float, default=None, help="seconds of training"
    )
    tr.add_argument("--eval-every", type=cli.positive_int, default=200)
    tr.add_argument("--train-subset", type=cli.positive_int, default=None)
    tr.add_argument("--test-subset", type=cli.positive_int, default=None)
    tr.add_argument("--seed", type=_seed, default=0)
    tr.add_argument(
        "--threads", type=cli.nonnegative_int, default=0, help="torch threads (0: torch's default)"
    )
    tr.add_argument(
        "--backend", type=_backend, default=None, help="auto, reference, triton or interpreter"
    )
    tr.set_defaults(func=_train)

    co = sub.add_parser("compile", help="compile a training checkpoint to a Boolean program")
    co.add_argument(
        "--checkpoint", type=_checkpoint, required=True, help="folder written by `train`"
    )
    co.add_argument("--out", type=cli.output_folder, required=True)
    co.add_argument("--engine", choices=("auto", "c", "numpy"), default="auto")
    co.add_argument("--dataset", choices=_DATASETS, default=None)
    co.set_defaults(func=_compile)

    dg = sub.add_parser(
        "diagnose",
        help="per layer: how well noisy logit gradients agree with the softmax gradient",
        description="One batch; the softmax gradient of each layer's logits against --draws "
        "noisy gradients of --noisy. Prints per layer cos(draw, softmax), cos(draw, mean of the "
        "draws) and cos(mean, softmax). The network is new (the architecture options; default "
        "2000x6, N(0, 1) logits) or loaded from --checkpoint.",
    )
    dg.add_argument("--dataset", choices=_DATASETS, required=True)
    dg.add_argument("--checkpoint", type=_checkpoint, default=None, help="a `train` --out folder")
    _add_architecture(dg, layers=None)
    _add_noise(dg, default=None)
    dg.add_argument(
        "--noisy",
        choices=("gumbel", "dirichlet"),
        default="gumbel",
        help="the stochastic relaxation whose gradients are compared with softmax's",
    )
    dg.add_argument("--draws", type=_draws, default=64)
    dg.add_argument("--batch-size", type=cli.positive_int, default=128)
    dg.add_argument("--seed", type=_seed, default=0)
    dg.add_argument("--out", type=cli.output_file, default=None, help="write the result as JSON")
    dg.add_argument(
        "--threads", type=cli.nonnegative_int, default=0, help="torch threads (0: torch's default)"
    )
    dg.set_defaults(func=_diagnose)

    rp = sub.add_parser("reproduce", help="softmax vs Gumbel on Fashion-MNIST, paper claims")
    rp.add_argument(
        "--quick",
        action="store_true",
        help="20k-image subset, 55 s of training CPU time per arm, 800-step sweep",
    )
    rp.add_argument("--out", type=cli.output_folder, default="results/dlgn-gumbel")
    rp.add_argument(
        "--threads", type=cli.nonnegative_int, default=0, help="torch threads (0: torch's default)"
    )
    rp.set_defaults(func=_reproduce)

    return cli.run(parser, _dispatch, argv)


if __name__ == "__main__":
    sys.exit(main())
