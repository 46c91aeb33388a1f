"""Kernels whose sm_90 resources are known in closed form, for test_compile_check.py.

Imported only in a process without the Triton interpreter (``compile_workload``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.triton_utils import autotune


@triton.jit
def dot_kernel(a, b, c, N: tl.constexpr, IEEE: tl.constexpr):
    rows = tl.arange(0, N)
    tile = rows[:, None] * N + rows[None, :]
    x = tl.load(a + tile)
    y = tl.load(b + tile)
    product = tl.dot(x, y, input_precision="ieee") if IEEE else tl.dot(x, y)
    tl.store(c + tile, product)


@triton.jit
def held_kernel(a, steps, N: tl.constexpr):
    """An N×N float32 tile held in registers across a loop of run-time length."""
    rows = tl.arange(0, N)
    tile = rows[:, None] * N + rows[None, :]
    x = tl.load(a + tile)
    for k in range(tl.load(steps)):
        x = x * x + k
    tl.store(a + tile, x)


@autotune(
    [triton.Config({"BLOCK": 32}, num_warps=1), triton.Config({"BLOCK": 64}, num_warps=2),
     triton.Config({"BLOCK": 128}, num_warps=4)],
    key=["n"],
)  # fmt: skip
@triton.jit
def scale_kernel(x, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + offsets, 2 * tl.load(x + offsets, mask=offsets < n), mask=offsets < n)


def dots() -> None:
    """bf16 64×64 (a warpgroup's tile), bf16 32×32 (under it), float32 IEEE 64×64."""
    for dtype, n in ((torch.bfloat16, 64), (torch.bfloat16, 32), (torch.float32, 64)):
        a = torch.ones(n, n, dtype=dtype)
        out = torch.zeros(n, n)
        dot_kernel[(1,)](a, a, out, N=n, IEEE=dtype == torch.float32)
        if out.any():
            raise AssertionError("a compile-only launch ran the kernel")


def held(n: int = 128) -> None:
    held_kernel[(1,)](torch.ones(n, n), torch.zeros(1, dtype=torch.int32), N=n, num_warps=1)


def tuned(calls: int = 2) -> None:
    """The same autotuned launch ``calls`` times: each config is compiled once."""
    x = torch.ones(1000)
    for _ in range(calls):
        scale_kernel[lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)](x, 1000)


def every_case() -> None:
    """dots(), held(), then tuned(): the kernels of the three, in that order."""
    dots()
    held()
    tuned()


def failing() -> None:
    raise ValueError("this workload fails")
