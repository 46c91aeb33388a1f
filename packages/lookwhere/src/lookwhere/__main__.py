"""Command line: ``lookwhere pretrain | finetune | evaluate | reproduce``.

Bad arguments are refused with one line (``lookwhere: error: ...``, exit code 2) before any work
starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from kernels_common import cli

TASKS = ("sparse", "global")


def _k_range(text: str) -> tuple[int, int]:
    values = cli.int_list()(text)
    if len(values) != 2 or values[0] > values[1]:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH with LOW <= HIGH, got {text!r}")
    return values[0], values[1]


def _task(args: argparse.Namespace, split: str, count: int):
    from lookwhere.data import global_images, sparse_canvases

    if args.task == "sparse":
        return sparse_canvases(
            split, count, size=args.size, distractors=args.distractors, seed=args.seed
        )
    return global_images(split, count, size=args.size, seed=args.seed)


def _train_config(args: argparse.Namespace, steps: int, lr: float):
    from lookwhere.train import TrainConfig

    return TrainConfig(steps=steps, batch_size=args.batch_size, lr=lr, seed=args.seed)


def _saved_teacher(path):
    from lookwhere import checkpoint
    from lookwhere.baselines import DenseClassifier

    model, _ = checkpoint.load(path)
    if type(model) is not DenseClassifier:
        raise ValueError(f"{path} holds a {type(model).__name__}, not a ViT teacher")
    return model


def _check_geometry(args: argparse.Namespace, patch: int, depth: int, hf: bool) -> tuple[int, int]:
    """Refuse sizes the teacher's patches do not divide and a selector deeper than the teacher,
    before any work; the selector's size and depth."""
    if args.size % patch:
        raise cli.CommandError(
            f"--size {args.size} is not a multiple of the teacher's {patch}-pixel patches"
        )
    selector_size = args.selector_size
    if selector_size is None:  # the paper's 154 / 518 for DINOv2, half the resolution otherwise
        ratio = 154 / 518 if hf else 0.5
        selector_size = max(patch, round(args.size * ratio / patch) * patch)
    if selector_size % patch:
        raise cli.CommandError(
            f"--selector-size {selector_size} is not a multiple of the teacher's {patch}-pixel "
            "patches"
        )
    patches = (args.size // patch) ** 2
    if args.k_range[1] > patches:
        raise cli.CommandError(
            f"--k-range {args.k_range[0]},{args.k_range[1]} exceeds the {patches} patches of a "
            f"{args.size}px image"
        )
    selector_depth = args.selector_depth
    if selector_depth is None:  # the paper's 3 of DINOv2's blocks; 1 of a small teacher's
        selector_depth = 3 if hf else 1
    if not 1 <= selector_depth <= depth:
        raise cli.CommandError(
            f"--selector-depth {selector_depth} must be in [1, {depth}], the teacher's blocks"
        )
    return selector_size, selector_depth


def _pretrain(args: argparse.Namespace) -> int:
    from lookwhere import checkpoint
    from lookwhere.model import lookwhere_from_teacher
    from lookwhere.pretrain import pretrain

    if args.hf is not None and args.teacher is not None:
        raise cli.CommandError("give --teacher or --hf, not both")
    dense = None
    if args.hf is not None:
        from lookwhere.hf import hf_geometry

        patch, depth = hf_geometry(args.hf)
    elif args.teacher is not None:
        dense = _saved_teacher(args.teacher)
        patch, depth = dense.vit.config.patch_size, dense.vit.config.depth
        if dense.vit.config.image_size != args.size:
            raise ValueError(
                f"the teacher is for {dense.vit.config.image_size}px images, not --size {args.size}"
            )
    else:
        patch, depth = args.patch, args.depth
    selector_size, selector_depth = _check_geometry(args, patch, depth, hf=args.hf is not None)
    lr = args.lr if args.lr is not None else (2e-5 if args.hf is not None else 5e-4)
    train = _task(args, "train", args.train_images)
    if args.hf is not None:
        from lookwhere.hf import lookwhere_from_dinov2

        # our images are [0, 1]: DINOv2's ImageNet normalisation goes into its patch embedding
        vit, model = lookwhere_from_dinov2(
            args.hf, image_size=args.size, selector_depth=selector_depth,
            selector_size=selector_size, k=args.k_range[1], normalize=True,
        )  # fmt: skip
    else:
        if dense is None:
            dense = _train_teacher(args, train)
        vit = dense.vit
        model = lookwhere_from_teacher(
            vit, selector_depth=selector_depth, selector_size=selector_size,
            num_classes=dense.head.out_features, k=args.k_range[1],
        )  # fmt: skip
        model.head.load_state_dict(dense.head.state_dict())
        checkpoint.save(dense, args.out / "teacher", extra={"task": args.task})
    vit, model = vit.to(args.device), model.to(args.device)
    log = pretrain(
        model, vit, train, _train_config(args, args.steps, lr), k_range=args.k_range,
        progress="pretrain",
    )  # fmt: skip
    extra = {
        "task": args.task,
        "size": args.size,
        "k_range": list(args.k_range),
        "stage": "pretrained",
    }
    checkpoint.save(model, args.out, extra=extra)
    print(json.dumps({"out": str(args.out), "first_loss": log[0], "last_loss": log[-1]}, indent=1))
    return 0


def _train_teacher(args: argparse.Namespace, train):
    """A supervised ViT teacher trained here: 4-patch object crops, then the task itself."""
    from lookwhere.data import global_images
    from lookwhere.teacher import train_teacher
    from lookwhere.vit import ViTConfig

    config = ViTConfig(dim=args.dim, depth=args.depth, heads=args.heads, patch_size=args.patch)
    crops = global_images("train", len(train), size=4 * args.patch, seed=args.seed)
    stages = [(crops, args.teacher_steps), (train, args.teacher_steps)]
    return train_teacher(
        config, stages, _train_config(args, 1, args.teacher_lr), num_classes=len(train.classes),
        device=args.device, progress=True,
    )  # fmt: skip


def _load_lookwhere(path):
    from lookwhere import checkpoint
    from lookwhere.model import LookWhere

    model, extra = checkpoint.load(path)
    if not isinstance(model, LookWhere):
        raise ValueError(f"{path} holds a {type(model).__name__}, not a LookWhere model")
    return model, extra


def _finetune(args: argparse.Namespace) -> int:
    import torch

    from lookwhere import checkpoint
    from lookwhere.experiment import MethodSettings, finetune_lookwhere

    model, extra = _load_lookwhere(args.checkpoint)
    high = model.extractor.grid**2
    if args.k_range[1] > high:
        raise ValueError(f"--k-range {args.k_range} exceeds the {high} patches of the grid")
    train = _task(args, "train", args.train_images)
    if isinstance(model.head, torch.nn.Identity):  # features only (a DINOv2 teacher): a new head
        model.head = torch.nn.Linear(model.extractor.vit.config.dim, len(train.classes))
    model = model.to(args.device)
    settings = MethodSettings(
        finetune=_train_config(args, args.steps, args.lr), k_range=args.k_range
    )
    finetune_lookwhere(model, train, settings, progress=True)
    checkpoint.save(model, args.out, extra=extra | {"stage": "finetuned", "task": args.task})
    print(json.dumps({"out": str(args.out)}, indent=1))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import torch

    from lookwhere import checkpoint
    from lookwhere.evaluate import judge, target_recall
    from lookwhere.model import LookWhere

    model, extra = checkpoint.load(args.checkpoint)
    vit = model.extractor.vit if isinstance(model, LookWhere) else model.vit
    if args.size is None:  # the resolution it was trained at
        args.size = int(extra.get("size", vit.config.image_size))
    if isinstance(model, LookWhere):
        if isinstance(model.head, torch.nn.Identity):
            raise ValueError(f"{args.checkpoint} has no classification head: fine-tune it first")
        if args.size != vit.config.image_size:
            raise cli.CommandError(
                f"--size {args.size}: the checkpoint's extractor takes {vit.config.image_size}px "
                "images"
            )
        patches = model.extractor.grid**2
        for k in args.k or []:
            if not 1 <= k <= patches:
                raise cli.CommandError(
                    f"--k {k} must be in [1, {patches}], the patches of a {args.size}px image"
                )
    elif args.k:
        raise cli.CommandError("--k is for LookWhere checkpoints; this one is a dense ViT")
    elif args.size % vit.config.patch_size:
        raise cli.CommandError(
            f"--size {args.size} is not a multiple of the model's {vit.config.patch_size}-pixel "
            "patches"
        )
    model = model.to(args.device)
    test = _task(args, "test", args.test_images)
    rows = []
    if isinstance(model, LookWhere):
        for k in args.k or [model.k]:
            recall = target_recall(model, test, k) if args.task == "sparse" else None
            point = judge("lookwhere", f"k={k}", lambda x, k=k: model(x, k=k).logits, test,
                          tokens=k, target_recall=recall, device=args.device)  # fmt: skip
            rows.append(point.to_dict())
    else:
        tokens = model.vit.config.grid**2
        rows.append(judge("dense", "all", model, test, tokens=tokens, device=args.device).to_dict())
    print(json.dumps(rows, indent=1))
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from lookwhere.reproduce import reproduce

    results = reproduce(args.out, quick=args.quick, device=args.device, progress=True)
    for claim in results.claims:
        verdict = "PASS" if claim.passed else "FAIL"
        print(f"{verdict}  {claim.name}: {claim.measured:.3g} {claim.unit} ({claim.expectation})")
    print(f"results in {args.out}")
    return 0


def _data_arguments(parser: argparse.ArgumentParser, *, train: bool) -> None:
    parser.add_argument("--task", choices=TASKS, default="sparse", help="benchmark task")
    if train:
        parser.add_argument("--size", type=cli.positive_int, default=96, help="image side (px)")
    else:
        parser.add_argument("--size", type=cli.positive_int,
                            help="image side (px; default the checkpoint's)")  # fmt: skip
    parser.add_argument("--distractors", type=cli.nonnegative_int, default=2,
                        help="MNIST digits per sparse canvas")  # fmt: skip
    parser.add_argument("--seed", type=cli.nonnegative_int, default=0)
    parser.add_argument("--device", type=cli.device, default="cpu", help="cpu or cuda")
    if train:
        parser.add_argument("--train-images", type=cli.positive_int, default=8000)
        parser.add_argument("--batch-size", type=cli.positive_int, default=64)
    else:
        parser.add_argument("--test-images", type=cli.positive_int, default=1000)


def _parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(prog="lookwhere", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("pretrain", help="distil a teacher into a selector and extractor")
    _data_arguments(p, train=True)
    p.add_argument("--out", type=cli.output_folder, required=True)
    p.add_argument("--teacher", type=cli.existing_folder, help="a saved ViT teacher folder")
    p.add_argument("--hf", type=cli.existing_folder,
                   help="a Hugging Face DINOv2-with-registers folder as the teacher")  # fmt: skip
    p.add_argument("--teacher-steps", type=cli.positive_int, default=600,
                   help="steps per stage when the teacher is trained here")  # fmt: skip
    p.add_argument("--dim", type=cli.positive_int, default=64)
    p.add_argument("--depth", type=cli.positive_int, default=4)
    p.add_argument("--heads", type=cli.positive_int, default=4)
    p.add_argument("--patch", type=cli.positive_int, default=8)
    p.add_argument(
        "--selector-depth",
        type=cli.positive_int,
        help="teacher blocks the selector keeps (default 1; the paper's 3 with --hf)",
    )
    p.add_argument(
        "--selector-size",
        type=cli.positive_int,
        help="the selector's resolution (default half --size; 154/518 of it with --hf)",
    )
    p.add_argument("--steps", type=cli.positive_int, default=300)
    p.add_argument(
        "--lr",
        type=cli.positive_float,
        help="peak learning rate (default 5e-4; 2e-5 with --hf, in the anchor's sweep)",
    )
    p.add_argument(
        "--teacher-lr",
        type=cli.positive_float,
        default=1.5e-3,
        help="peak learning rate of a teacher trained here",
    )
    p.add_argument("--k-range", type=_k_range, default=(4, 36), help="LOW,HIGH tokens per step")

    p = commands.add_parser("finetune", help="train the extractor and head, selector frozen")
    _data_arguments(p, train=True)
    p.add_argument("--checkpoint", type=cli.existing_folder, required=True)
    p.add_argument("--out", type=cli.output_folder, required=True)
    p.add_argument("--steps", type=cli.positive_int, default=200)
    p.add_argument("--lr", type=cli.positive_float, default=3e-4)
    p.add_argument("--k-range", type=_k_range, default=(4, 36))

    p = commands.add_parser("evaluate", help="accuracy, FLOPs and time of a saved model")
    _data_arguments(p, train=False)
    p.add_argument("--checkpoint", type=cli.existing_folder, required=True)
    p.add_argument("--k", type=cli.int_list(), help="tokens to keep, e.g. 6,12,24")

    p = commands.add_parser("reproduce", help="the paper's claims at small scale, on a CPU")
    p.add_argument("--quick", action="store_true", help="the ~10 minute run")
    p.add_argument("--device", type=cli.device, default="cpu", help="cpu or cuda")
    p.add_argument("--out", type=cli.output_folder, default="lookwhere-reproduce")
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return {
        "pretrain": _pretrain,
        "finetune": _finetune,
        "evaluate": _evaluate,
        "reproduce": _reproduce,
    }[args.command](args)


def main(argv: list[str] | None = None) -> int:
    return cli.run(_parser(), _dispatch, argv)


if __name__ == "__main__":
    sys.exit(main())
