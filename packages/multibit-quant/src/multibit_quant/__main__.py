"""Command line: ``multibit-quant train | evaluate | export | reproduce``.

Bad arguments are refused with one line (``multibit-quant: error: …``, exit code 2) before any
work starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from kernels_common import cli

DATASETS = ("fashion-mnist", "folder", "cifar10-bigbench")


def _bits_list(text: str) -> tuple[int, ...]:
    """``2,4,8``, ``2..8`` or a mix (``2..4,8``); ``32`` or ``fp`` is full precision."""
    values: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip().lower()
            if ".." in part:
                low, high = (int(v) for v in part.split(".."))
                if low > high:
                    raise ValueError
                values.extend(range(low, high + 1))
            else:
                values.append(32 if part == "fp" else int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bits must look like 2,4,8 or 2..8 (32 or fp: full precision), got {text!r}"
        ) from None
    bad = [b for b in values if not (2 <= b <= 8 or b == 32)]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"bit-widths must be 2 to 8 or 32, got {text!r}")
    return tuple(sorted(set(values)))


def _checkpoint(text: str) -> Path:
    """A folder written by ``multibit-quant train`` (its contents are checked when loaded)."""
    folder = cli.existing_folder(text)
    missing = [n for n in ("model.safetensors", "config.json") if not (folder / n).is_file()]
    if missing:
        raise argparse.ArgumentTypeError(
            f"{folder} is not a checkpoint: no {' or '.join(missing)} (as written by "
            "`multibit-quant train`)"
        )
    return folder


def _export_file(text: str) -> Path:
    if not text.endswith(".safetensors"):
        raise argparse.ArgumentTypeError(f"expected a .safetensors file name, got {text!r}")
    return cli.output_file(text)


def _subset(data, size: int | None, option: str, split: str):
    """A seeded, class-stratified subset of ``size`` images (as Fashion-MNIST's), or all."""
    from multibit_quant.data import stratified_subset

    if size is None:
        return data
    if size > len(data):
        raise ValueError(f"{option} {size} asks for more than the {len(data)} {split} images")
    return data.subset(stratified_subset(data.labels.numpy(), size, seed=0))


def _load_data(args: argparse.Namespace, normalization=None):
    """``(train, test)``; given a checkpoint's ``normalization``, scaled as in its training;
    ``--train-subset`` / ``--test-subset`` keep a seeded, class-stratified subset."""
    from multibit_quant.data import cifar10_bigbench, fashion_mnist, image_folder

    if args.dataset == "fashion-mnist":
        return fashion_mnist(
            args.train_subset, args.test_subset, path=args.data_path, normalization=normalization
        )
    if args.data_path is None:
        raise ValueError(f"--dataset {args.dataset} needs --data-path")
    if args.dataset == "folder":
        root = Path(args.data_path)
        train = image_folder(root / "train", normalization=normalization)
        test = image_folder(root / "test", normalization=train.normalization)
    else:
        train, test = cifar10_bigbench(args.data_path, normalization=normalization)  # 8,000 / 2,000
    return (
        _subset(train, args.train_subset, "--train-subset", "training"),
        _subset(test, args.test_subset, "--test-subset", "test"),
    )


def _checkpoint_data(args: argparse.Namespace, meta: dict):
    """The test split, standardised with the statistics the checkpoint was trained with."""
    normalization = meta.get("normalization")
    if normalization is None:
        logging.getLogger(__name__).warning(
            "%s records no input normalization: the test images use their own statistics",
            args.checkpoint,
        )
    _, test = _load_data(args, normalization)
    return test


def _quant_config(args: argparse.Namespace):
    from multibit_quant.layers import QuantConfig

    correction = None if args.correction == "none" else args.correction
    return QuantConfig(weight=args.weight, activation=args.activation, correction=correction)


def _architecture(args: argparse.Namespace, train) -> dict:
    height = train.images.shape[-1]
    if args.model == "resnet20":
        if args.dim is not None:
            raise ValueError("--dim sizes the ViT; the ResNet-20's width is --width")
        kwargs = {"width": args.width or 16}
    else:
        if args.width is not None:
            raise ValueError("--width sizes the ResNet-20; the ViT's width is --dim")
        patch = args.patch or next((p for p in (7, 4, 8, 2) if height % p == 0), 1)
        kwargs = {"image_size": height, "patch": patch, "dim": args.dim or 64}
    return {"name": args.model, "num_classes": len(train.classes),
            "in_channels": train.channels, "kwargs": kwargs}  # fmt: skip


def _train(args: argparse.Namespace) -> int:
    from multibit_quant.checkpoint import WEIGHTS, save_checkpoint
    from multibit_quant.model import quantize, switch_batchnorm
    from multibit_quant.models import build_model
    from multibit_quant.train import TrainConfig, evaluate, train_multibit

    if (args.out / WEIGHTS).exists() and not args.overwrite:
        raise ValueError(f"{args.out} already holds a checkpoint; pass --overwrite to replace it")
    config = TrainConfig(
        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, schedule=args.schedule,
        distill=args.distill, coreset=args.coreset, coreset_score=args.score,
        resample_every=args.resample_every, seed=args.seed,
    )  # fmt: skip
    quant = _quant_config(args)
    evaluate_bits = sorted(set(args.bits) | set(args.evaluate_bits or ()))
    lsq = "lsq" in (quant.weight, quant.activation)
    if lsq and all(b == 32 for b in args.bits) and any(b != 32 for b in evaluate_bits):
        raise ValueError("LSQ derives an untrained bit-width's steps from a trained one: "
                         "--bits must include a bit-width from 2 to 8")  # fmt: skip
    train, test = _load_data(args)
    architecture = _architecture(args, train)
    network = build_model(architecture["name"], architecture["num_classes"],
                          architecture["in_channels"], **architecture["kwargs"])  # fmt: skip
    model = quantize(network, args.bits, quant)
    if args.per_bit_bn:
        switch_batchnorm(model)
    result = train_multibit(model, train, config)
    accuracy = evaluate(model, test, evaluate_bits)
    report = {"accuracy": accuracy, **result.to_dict()}
    save_checkpoint(model, args.out, architecture, train.normalization)
    with cli.atomic_file(args.out / "train.json") as temporary:
        temporary.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"accuracy": accuracy, "seconds": round(result.seconds, 1)}, indent=2))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from multibit_quant.checkpoint import load_checkpoint
    from multibit_quant.train import evaluate

    model, meta = load_checkpoint(args.checkpoint)
    test = _checkpoint_data(args, meta)
    print(json.dumps(evaluate(model, test, args.bits), indent=2))
    return 0


def _export(args: argparse.Namespace) -> int:
    import torch

    from kernels_common import measure
    from multibit_quant.checkpoint import load_checkpoint
    from multibit_quant.export import export_integer, export_sizes, to_integer

    model, meta = load_checkpoint(args.checkpoint)
    test = _checkpoint_data(args, meta)
    images = test.images[: args.verify]
    with torch.no_grad(), model.bits_as(args.bits):
        fake = model(images)
    integer = to_integer(model, args.bits)
    with torch.no_grad():
        real = integer(images)
        seconds = measure(lambda: integer(images), warmup=1, repeat=3, memory=False).median_s
    export_integer(model, args.bits, args.out, {"checkpoint": meta})
    sizes = export_sizes(model, [args.bits])[args.bits]
    report = {
        "file": str(args.out),
        "bits": args.bits,
        "predictions_equal": int((fake.argmax(1) == real.argmax(1)).sum()),
        "of": len(images),
        "max_logit_difference": float((fake - real).abs().max()),
        "integer_images_per_s": len(images) / seconds,
        **sizes,
    }
    print(json.dumps(report, indent=2))
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from multibit_quant.reproduce import run

    with cli.atomic_folder(args.out) as staging:  # the results appear whole, or not at all
        results = run(staging, quick=args.quick)
    print(json.dumps({c.name: c.measured for c in results.claims}, indent=2))
    return 0


def _data_options(parser: argparse.ArgumentParser, subsets: bool = True) -> None:
    parser.add_argument("--dataset", choices=DATASETS, default="fashion-mnist")
    parser.add_argument(
        "--data-path",
        help="Fashion-MNIST IDX folder, ImageFolder root (train/, test/) or CIFAR-10 task.json",
    )
    if subsets:
        parser.add_argument(
            "--train-subset",
            type=cli.positive_int,
            help="keep N training images (seeded, by class)",
        )
    parser.add_argument(
        "--test-subset", type=cli.positive_int, help="keep N test images (seeded, by class)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="multibit-quant",
        description="Multi-bit quantization networks: train, evaluate, export, reproduce.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    tr = sub.add_parser("train", help="train one multi-bit network")
    tr.add_argument("--model", choices=("resnet20", "vit"), default="resnet20")
    tr.add_argument("--width", type=cli.positive_int, help="ResNet-20 base width (default 16)")
    tr.add_argument("--dim", type=cli.positive_int, help="ViT embedding width (default 64)")
    tr.add_argument("--patch", type=cli.positive_int, help="ViT patch size (default: 7, 4, 8 or 2, "
                    "the first that divides the image)")  # fmt: skip
    tr.add_argument("--bits", type=_bits_list, default=(2, 4, 8), help="trained bit-widths")
    tr.add_argument("--evaluate-bits", type=_bits_list, help="also evaluate these (e.g. 3,5,6)")
    tr.add_argument("--coreset", type=cli.fraction, help="bit-wise coreset fraction in (0, 1]")
    tr.add_argument("--score", choices=("el2n", "grad_norm", "forgetting", "random"),
                    default="el2n")  # fmt: skip
    tr.add_argument("--resample-every", type=cli.positive_int, default=1, help="epochs")
    tr.add_argument("--weight", choices=("dorefa", "lsq"), default="dorefa")
    tr.add_argument("--activation", choices=("clamp", "lsq"), default="clamp")
    tr.add_argument("--correction", choices=("mean_var", "mean", "none"), default="mean_var")
    tr.add_argument("--per-bit-bn", action="store_true", help="one BatchNorm per bit-width")
    tr.add_argument("--schedule", choices=("all", "round_robin", "sampled"), default="all")
    tr.add_argument("--distill", choices=("none", "highest", "recursive"), default="none")
    tr.add_argument("--epochs", type=cli.positive_int, default=3)
    tr.add_argument("--batch-size", type=cli.positive_int, default=64)
    tr.add_argument("--lr", type=cli.positive_float, default=3e-3)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--out", type=cli.output_folder, required=True, help="checkpoint folder")
    tr.add_argument("--overwrite", action="store_true", help="replace a checkpoint in --out")
    _data_options(tr)
    tr.set_defaults(func=_train)

    ev = sub.add_parser("evaluate", help="accuracy of a checkpoint at several bit-widths")
    ev.add_argument("--checkpoint", type=_checkpoint, required=True)
    ev.add_argument("--bits", type=_bits_list, default=tuple(range(2, 9)), help="e.g. 2..8")
    _data_options(ev, subsets=False)
    ev.set_defaults(func=_evaluate, train_subset=1)  # only the test split is used

    ex = sub.add_parser("export", help="packed integer weights + integer inference check")
    ex.add_argument("--checkpoint", type=_checkpoint, required=True)
    ex.add_argument("--bits", type=int, choices=range(2, 9), default=8)
    ex.add_argument("--out", type=_export_file, required=True, help="the .safetensors to write")
    ex.add_argument("--verify", type=cli.positive_int, default=1000, help="test images compared")
    _data_options(ex, subsets=False)
    ex.set_defaults(func=_export, train_subset=1)  # only the test split is used

    rp = sub.add_parser("reproduce", help="the paper's headline comparison at small scale")
    rp.add_argument("--quick", action="store_true", help="the ~10-minute CPU run")
    rp.add_argument("--out", type=cli.output_folder, default=Path("reports/multibit-quant"))
    rp.set_defaults(func=_reproduce)
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command == "reproduce" else logging.WARNING,
        format="%(asctime)s %(name)s: %(message)s",
    )
    try:
        return args.func(args)
    except (ImportError, NotImplementedError) as error:  # a missing extra, an unsupported mix
        raise cli.CommandError(str(error)) from error


def main(argv: list[str] | None = None) -> int:
    return cli.run(_parser(), _dispatch, argv)


if __name__ == "__main__":
    sys.exit(main())
