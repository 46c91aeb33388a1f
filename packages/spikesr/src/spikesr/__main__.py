"""Command line: ``spikesr train | evaluate | upscale | reproduce``.

Bad arguments are refused with one line (``spikesr: error: ...``, exit code 2) before any work
starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from kernels_common import cli

SCALES = (2, 4)


def _images(args: argparse.Namespace, split: str) -> dict:
    """HR images: every image under ``--images``, or benchdata's photographs split by name."""
    from spikesr.data import benchmark_images, folder_images, split_images

    if args.images is not None:
        return folder_images(args.images)
    train, test = split_images(benchmark_images("all"))
    return train if split == "train" else test


def _train(args: argparse.Namespace) -> int:
    from spikesr import checkpoint
    from spikesr.data import PatchSampler, make_pairs
    from spikesr.model import SpikeSR, SpikeSRConfig, parameter_count
    from spikesr.train import TrainConfig, train

    config = SpikeSRConfig(
        scale=args.scale, width=args.width, groups=args.groups, blocks=args.blocks,
        time_steps=args.time_steps, neuron=args.neuron, hda=not args.no_hda, dsa=not args.no_dsa,
    )  # fmt: skip
    if not args.no_dsa and args.lr_patch < config.patch_size:
        raise cli.CommandError(
            f"--lr-patch {args.lr_patch} is smaller than the DSA's {config.patch_size}-pixel "
            "patches"
        )
    settings = TrainConfig(
        steps=args.steps, batch_size=args.batch_size, lr_patch=args.lr_patch, lr=args.lr,
        seed=args.seed,
    )  # fmt: skip
    sampler = PatchSampler(make_pairs(_images(args, "train"), args.scale), args.scale,
                           args.lr_patch, seed=args.seed)  # fmt: skip
    import torch

    torch.manual_seed(args.seed)
    model = SpikeSR(config)
    log = train(model, sampler, settings, device=args.device, progress=True)
    extra = {"train": settings.to_dict(), "images": len(sampler.pairs),
             "final_loss": sum(log.losses[-50:]) / len(log.losses[-50:])}  # fmt: skip
    checkpoint.save(model.cpu(), args.out, extra=extra, half=args.half)
    summary = {"out": str(args.out), "parameters": parameter_count(model),
               "first_loss": log.losses[0], "last_loss": log.losses[-1],
               "seconds_per_step": round(log.seconds_per_step, 4)}  # fmt: skip
    print(json.dumps(summary, indent=1))
    return 0


def _load(args: argparse.Namespace):
    from spikesr import checkpoint
    from spikesr.evaluate import network_scale

    path = args.weights if args.weights is not None else checkpoint.pretrained_path(args.scale)
    model, _ = checkpoint.load(path)
    if network_scale(model) != args.scale:
        raise ValueError(f"{path} is a x{network_scale(model)} network, not --scale {args.scale}")
    return model


def _evaluate(args: argparse.Namespace) -> int:
    from spikesr.data import make_pairs
    from spikesr.evaluate import bicubic_upscaler, evaluate, model_upscaler

    model = _load(args)
    pairs = make_pairs(_images(args, "test"), args.scale)
    rows = {
        "bicubic": evaluate(bicubic_upscaler(args.scale), pairs, args.scale).to_dict(),
        "model": evaluate(model_upscaler(model, tile=args.tile or None, device=args.device), pairs,
                          args.scale).to_dict(),
    }  # fmt: skip
    print(json.dumps(rows, indent=1))
    return 0


def _upscale(args: argparse.Namespace) -> int:
    from spikesr.data import read_image, write_image
    from spikesr.evaluate import upscale

    model = _load(args)
    image = read_image(args.input, repeat_gray=args.repeat_gray)
    out = upscale(model, image, tile=args.tile or None, device=args.device)
    write_image(args.output, out)
    print(f"{args.input} ({image.shape[1]}x{image.shape[0]}) -> {args.output} "
          f"({out.shape[1]}x{out.shape[0]})")  # fmt: skip
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from spikesr.reproduce import reproduce

    results = reproduce(args.out, quick=args.quick, device=args.device, progress=True)
    for claim in results.claims:
        verdict = "PASS" if claim.passed else "FAIL"
        print(f"{verdict}  {claim.name}: {claim.measured:.3g} {claim.unit} ({claim.expectation})")
    print(f"results in {args.out}")
    return 0


def _weights_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scale", type=int, choices=SCALES, default=4, help="upscaling factor")
    parser.add_argument(
        "--weights", type=cli.existing_file, help="from `spikesr train` (default: the shipped ones)"
    )
    parser.add_argument("--tile", type=cli.nonnegative_int, default=96,
                        help="LR tile side (0: the whole image at once)")  # fmt: skip
    parser.add_argument("--device", type=cli.device, default="cpu", help="cpu or cuda")


def _parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(prog="spikesr", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("train", help="train a SpikeSR network on LR/HR patches")
    p.add_argument("--out", type=cli.output_file, required=True, help="the .safetensors to write")
    p.add_argument("--images", type=cli.existing_folder,
                   help="HR images (default: benchdata's, less the test images)")  # fmt: skip
    p.add_argument("--scale", type=int, choices=SCALES, default=4)
    p.add_argument("--width", type=cli.positive_int, default=64)
    p.add_argument("--groups", type=cli.positive_int, default=4)
    p.add_argument("--blocks", type=cli.positive_int, default=2)
    p.add_argument("--time-steps", type=cli.positive_int, default=4)
    p.add_argument("--neuron", choices=("lif", "spikingjelly", "relu"), default="lif")
    p.add_argument("--no-hda", action="store_true", help="ablation: no hybrid-dimension attention")
    p.add_argument("--no-dsa", action="store_true", help="ablation: no similarity attention")
    p.add_argument("--steps", type=cli.positive_int, default=1000)
    p.add_argument("--batch-size", type=cli.positive_int, default=4)
    p.add_argument("--lr-patch", type=cli.positive_int, default=64, help="LR patch side (px)")
    p.add_argument("--lr", type=cli.positive_float, default=1e-4, help="Adam's learning rate")
    p.add_argument("--half", action="store_true", help="store the weights in float16")
    p.add_argument("--seed", type=cli.nonnegative_int, default=0)
    p.add_argument("--device", type=cli.device, default="cpu", help="cpu or cuda")

    p = commands.add_parser("evaluate", help="PSNR / SSIM of a network and of bicubic")
    _weights_arguments(p)
    p.add_argument("--images", type=cli.existing_folder,
                   help="HR test images (default: benchdata's test images)")  # fmt: skip

    p = commands.add_parser("upscale", help="upscale one image")
    p.add_argument("input", type=cli.existing_file, help="an RGB image (png, jpg, ...)")
    p.add_argument("output", type=cli.output_file, help="where to write the upscaled image")
    _weights_arguments(p)
    p.add_argument("--repeat-gray", action="store_true", help="accept a grayscale image (as RGB)")

    p = commands.add_parser("reproduce", help="the paper's claims at small scale, on a CPU")
    p.add_argument("--quick", action="store_true", help="the ~10 minute run")
    p.add_argument("--device", type=cli.device, default="cpu", help="cpu or cuda")
    p.add_argument("--out", type=cli.output_folder, default="spikesr-reproduce")
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return {
        "train": _train,
        "evaluate": _evaluate,
        "upscale": _upscale,
        "reproduce": _reproduce,
    }[args.command](args)


def main(argv: list[str] | None = None) -> int:
    return cli.run(_parser(), _dispatch, argv)


if __name__ == "__main__":
    sys.exit(main())
