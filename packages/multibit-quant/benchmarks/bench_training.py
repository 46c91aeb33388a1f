"""Training schemes side by side, one run, same data and epochs: dedicated per-bit QAT,
Any-Precision (per-bit BatchNorm, every bit-width on every batch), shared BatchNorm without
correction, ours (bias correction), ours with bit-wise coresets.

    python packages/multibit-quant/benchmarks/bench_training.py --out reports/bench/multibit-quant

Fashion-MNIST (benchdata) average-pooled to 14x14, pre-activation ResNet-20, bits {2, 4, 8}
trained, 3 / 5 / 6 evaluated untrained. Reports accuracy per bit-width and total training time
(scoring passes included) with its ratio to Any-Precision's, measured in this process, scheme
after scheme; then the coreset scheme with each importance score (EL2N, the classifier's
gradient norm, forgetting events, random subsets) at the same pruning rate.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from kernels_common import hardware_description
from multibit_quant import (
    TrainConfig,
    compare_schemes,
    fashion_mnist,
    preact_resnet20,
    run_scheme,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--train-images", type=int, default=4000)
    parser.add_argument("--test-images", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--downsample", type=int, default=2)
    parser.add_argument("--coreset", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=Path("reports/bench/multibit-quant"))
    args = parser.parse_args()

    train, test = fashion_mnist(args.train_images, args.test_images)
    train, test = train.downsample(args.downsample), test.downsample(args.downsample)
    device = torch.device(args.device)
    train.images, test.images = train.images.to(device), test.images.to(device)

    def factory():
        return preact_resnet20(width=args.width).to(device)

    config = TrainConfig(epochs=args.epochs, batch_size=128, lr=3e-3, resample_every=2)
    bits, evaluate_bits = (2, 4, 8), (2, 3, 4, 5, 6, 8)
    result = compare_schemes(
        factory, train, test, bits, evaluate_bits, config, coreset=args.coreset, progress=False
    )
    for score in ("grad_norm", "forgetting", "random"):
        row, _ = run_scheme(
            "ours_coreset", factory, train, test, bits, evaluate_bits,
            replace(config, coreset_score=score), coreset=args.coreset, progress=False,
        )  # fmt: skip
        result["schemes"][f"ours_coreset[{score}]"] = row.to_dict()
    anchor = result["schemes"]["any_precision"]["seconds"]
    lines = [
        f"### multi-bit training schemes, Fashion-MNIST {len(train)}/{len(test)}, "
        f"{train.images.shape[-1]}x{train.images.shape[-1]}, ResNet-20 width {args.width}, "
        f"{args.epochs} epochs, coreset fraction {args.coreset:g} (EL2N unless named)",
        "",
        f"{hardware_description(device)}; torch {torch.__version__}",
        "",
        "| scheme | time (s) | time vs Any-Precision | "
        + " | ".join(f"{b}-bit acc" for b in evaluate_bits)
        + " |",
        "|---|---:|---:|" + "---:|" * len(evaluate_bits),
    ]
    for name, row in result["schemes"].items():
        cells = ["-" if row["accuracy"][b] is None else f"{row['accuracy'][b]:.3f}"
                 for b in evaluate_bits]  # fmt: skip
        lines.append(
            f"| {name} | {row['seconds']:.1f} | {row['seconds'] / anchor:.2f}x | "
            + " | ".join(cells) + " |"
        )  # fmt: skip
    angles = ", ".join(f"{k}: {v:.1f}°" for k, v in result["alignment"].items())
    lines += ["", f"cross-bit gradient angles (ours): {angles}", ""]
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"training_{args.device}.md").write_text(table)
    (args.out / f"training_{args.device}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
