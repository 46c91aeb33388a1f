"""SwiGLU gate, forward + backward: kernels-common's op vs eager PyTorch, side by side.

    python kernels-common/benchmarks/bench_swiglu.py --out reports/bench/kernels-common
    python kernels-common/benchmarks/bench_swiglu.py --device cuda --dtype bfloat16

The anchor is eager PyTorch, ``silu(a) * b`` in the inputs' dtype (three kernels forward, several
backward). On CUDA the Triton kernel joins the table; on the CPU the reference path is what runs.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch

from kernels_common import Backend, compare, resolve_backend
from kernels_common.swiglu import swiglu


def eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(a) * b


def forward_backward(fn, a, b, grad):
    # Stateless: nothing allocated by one call outlives it (no .grad left on the leaves), so each
    # call's peak memory is measured from the same baseline.
    return torch.autograd.grad(fn(a, b), (a, b), grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("reports/bench/kernels-common"))
    args = parser.parse_args()

    on_cuda = torch.device(args.device).type == "cuda"
    dtype = getattr(torch, args.dtype or ("bfloat16" if on_cuda else "float32"))
    rows = args.rows or (16384 if on_cuda else 1024)
    generator = torch.Generator(args.device).manual_seed(0)
    shape = (rows, args.cols)
    a, b, grad = (
        torch.randn(shape, generator=generator, device=args.device, dtype=dtype) for _ in range(3)
    )
    a.requires_grad_()
    b.requires_grad_()

    candidates = {
        "eager torch (anchor)": functools.partial(forward_backward, eager, a, b, grad),
        "kernels-common reference": functools.partial(
            forward_backward, functools.partial(swiglu, backend="reference"), a, b, grad
        ),
    }
    backend = resolve_backend(None, [a])
    if backend is not Backend.REFERENCE:
        candidates[f"kernels-common {backend.value}"] = functools.partial(
            forward_backward, functools.partial(swiglu, backend=backend), a, b, grad
        )
    table = compare(
        candidates,
        baseline="eager torch (anchor)",
        title=f"swiglu fwd+bwd, {rows}x{args.cols} {str(dtype).removeprefix('torch.')}",
        device=args.device,
        repeat=args.repeat,
    )
    print(table)
    table.save(args.out, f"swiglu_{args.device}")


if __name__ == "__main__":
    main()
