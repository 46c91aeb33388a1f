"""Fake quantization of a weight and an activation, forward + backward: the fused Triton kernels
vs eager PyTorch, side by side.

    python packages/multibit-quant/benchmarks/bench_fakequant.py --out reports/bench/multibit-quant
    python packages/multibit-quant/benchmarks/bench_fakequant.py --device cuda

The anchor is eager PyTorch (the package's reference: per-channel DoReFa or LSQ, then mean and
variance bias correction, about a dozen kernels each way). Shapes are Any-Precision's CIFAR
ResNet-20 at width 80: a 3x3 conv of 320 to 320 channels, input batch 128 at 8x8. On CUDA the
Triton kernels join the tables; on the CPU the eager path runs (Triton needs a GPU). A second
table prices the correction: Any-Precision's own weight quantizer (per-tensor DoReFa, no
correction; a different function, so no error column) against ours, both eager.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch

from kernels_common import Backend, compare, resolve_backend
from multibit_quant import fake_quant_activation, fake_quant_weight


def weight_fwd_bwd(weight, step, grad, *, method, backend):
    inputs = (weight,) if step is None else (weight, step)
    out = fake_quant_weight(weight, 4, method, step, "mean_var", backend=backend)
    return torch.autograd.grad(out, inputs, grad)


def any_precision_weight(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """Any-Precision DNNs' DoReFa weights: per-tensor ``max |tanh|`` and ``mean |w|``."""
    t = torch.tanh(weight)
    u = t / (2 * t.abs().max()) + 0.5
    levels = 2**bits - 1
    code = u * levels
    code = code + (torch.round(code) - code).detach()
    return (2 * code / levels - 1) * weight.abs().mean().detach()


def any_precision_fwd_bwd(weight, grad):
    return torch.autograd.grad(any_precision_weight(weight, 4), (weight,), grad)


def activation_fwd_bwd(x, step, grad, *, method, backend):
    inputs = (x,) if step is None else (x, step)
    out = fake_quant_activation(x, 4, method, step, backend=backend)
    return torch.autograd.grad(out, inputs, grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("reports/bench/multibit-quant"))
    args = parser.parse_args()

    generator = torch.Generator(args.device).manual_seed(0)
    weight = torch.randn(320, 320 * 9, generator=generator, device=args.device) * 0.05
    weight_grad = torch.randn(weight.shape, generator=generator, device=args.device)
    x = torch.randn(128, 320, 8, 8, generator=generator, device=args.device).relu()
    x_grad = torch.randn(x.shape, generator=generator, device=args.device)
    weight.requires_grad_()
    x.requires_grad_()
    steps = {
        "weight": torch.full((320,), 0.02, device=args.device, requires_grad=True),
        "activation": torch.full((1,), 0.1, device=args.device, requires_grad=True),
    }
    backend = resolve_backend(None, [weight])
    jobs = {
        "weight": (weight_fwd_bwd, weight, weight_grad, ("dorefa", "lsq")),
        "activation": (activation_fwd_bwd, x, x_grad, ("clamp", "lsq")),
    }
    for kind, (fn, tensor, grad, methods) in jobs.items():
        for method in methods:
            step = steps[kind] if method == "lsq" else None
            run = functools.partial(fn, tensor, step, grad, method=method)
            candidates = {"eager torch (anchor)": functools.partial(run, backend="reference")}
            if backend is not Backend.REFERENCE:
                candidates[f"multibit-quant {backend.value}"] = functools.partial(
                    run, backend=backend
                )
            table = compare(
                candidates,
                baseline="eager torch (anchor)",
                title=f"{kind} fake-quant {method} 4-bit fwd+bwd, {tuple(tensor.shape)} float32",
                device=args.device,
                repeat=args.repeat,
            )
            print(table)
            table.save(args.out, f"fakequant_{kind}_{method}_{args.device}")
    cost_candidates = {
        "Any-Precision per-tensor (anchor)": functools.partial(
            any_precision_fwd_bwd, weight, weight_grad
        ),
        "ours eager, per-channel + correction": functools.partial(
            weight_fwd_bwd, weight, None, weight_grad, method="dorefa", backend="reference"
        ),
    }
    if backend is not Backend.REFERENCE:
        cost_candidates[f"ours {backend.value}"] = functools.partial(
            weight_fwd_bwd, weight, None, weight_grad, method="dorefa", backend=backend
        )
    cost = compare(
        cost_candidates,
        baseline="Any-Precision per-tensor (anchor)",
        title=f"the price of per-channel statistics and bias correction, {tuple(weight.shape)}",
        device=args.device,
        repeat=args.repeat,
        check_outputs=False,
    )
    print(cost)
    cost.save(args.out, f"fakequant_correction_cost_{args.device}")


if __name__ == "__main__":
    main()
