"""LookWhere inference against the dense ViT it replaces, side by side in one process, at the
paper's shapes: a DINOv2-with-registers ViT (14-pixel patches, 4 registers) at 518 px, 37x37 =
1,369 patches; the selector keeps 3 blocks and sees 154 px (11x11 patches).

    python packages/lookwhere/benchmarks/bench_lookwhere.py --out reports/bench/lookwhere

The baseline is transformers' ``Dinov2WithRegistersModel`` (the dense model users run today),
with random weights; our ViT loaded from its saved folder must give the same features (checked),
then LookWhere built from it runs at k = 128 / 256 / 512 kept tokens. Reported: time ratios and
counted FLOPs ratios against the dense model. The paper reports 1.36x less time on ImageNet and
4x on Traffic Signs (ViT-B on a GPU); the CPU default here is ViT-S (``--width base`` for ViT-B).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from kernels_common import compare, hardware_description
from lookwhere import count_flops, load_dinov2, lookwhere_from_teacher

WIDTHS = {"small": (384, 6), "base": (768, 12)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", choices=sorted(WIDTHS), default="small")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ks", default="128,256,512")
    parser.add_argument("--out", type=Path, default=Path("reports/bench/lookwhere"))
    args = parser.parse_args()

    import transformers

    torch.manual_seed(0)
    dim, heads = WIDTHS[args.width]
    config = transformers.Dinov2WithRegistersConfig(
        hidden_size=dim, num_hidden_layers=12, num_attention_heads=heads, patch_size=14,
        image_size=518, num_register_tokens=4, attn_implementation="sdpa",
    )  # fmt: skip
    hf = transformers.Dinov2WithRegistersModel(config).eval().to(args.device)
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        teacher = load_dinov2(folder).to(args.device)
    images = torch.randn(args.batch, 3, 518, 518, device=args.device)
    with torch.no_grad():
        expect = hf(pixel_values=images).last_hidden_state[:, 5:]
        error = (teacher(images).patches - expect).abs().max().item()
    if error > 1e-3:
        raise SystemExit(f"our ViT differs from transformers' by {error:.2e}: not benchmarking")

    model = lookwhere_from_teacher(teacher, selector_depth=3, selector_size=154, num_classes=0)
    model = model.eval().to(args.device)
    ks = [int(k) for k in args.ks.split(",")]
    functions = {"hf-dense": lambda: hf(pixel_values=images), "ours-dense": lambda: teacher(images)}
    for k in ks:
        functions[f"lookwhere k={k}"] = lambda k=k: model(images, k=k)
    one = images[:1]
    # counted on our ViT, which computes the HF model's function (checked above) with the same
    # matrix products: the dense FLOPs of both
    flops = {"hf-dense": count_flops(lambda: teacher(one))}
    flops["ours-dense"] = flops["hf-dense"]
    for k in ks:
        flops[f"lookwhere k={k}"] = count_flops(lambda k=k: model(one, k=k))

    def no_grad(fn):
        def call():
            with torch.no_grad():
                return fn()

        return call

    comparison = compare(
        {name: no_grad(fn) for name, fn in functions.items()}, baseline="hf-dense",
        title=f"ViT-{args.width[0].upper()}/14-reg4 at 518 px, batch {args.batch}", warmup=1,
        repeat=args.repeat, memory=False, check_outputs=False, device=args.device,
    )  # fmt: skip
    comparison.save(args.out, f"lookwhere_{args.width}")
    print(comparison)
    lines = [f"{hardware_description(args.device)}; ViT-{args.width} 518 px, batch {args.batch}, "
             f"median of {args.repeat}", "", "| model | tokens | time / dense | FLOPs / dense |",
             "|---|---:|---:|---:|"]  # fmt: skip
    for name in functions:
        tokens = "1369" if "dense" in name else name.split("=")[1]
        ratio = comparison.row(name).time_ratio
        lines.append(f"| {name} | {tokens} | {ratio:.3f} | {flops[name] / flops['hf-dense']:.3f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"lookwhere_{args.width}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
