"""Small helpers shared by Triton kernel modules.

``cdiv`` and ``next_power_of_2`` are plain Python; ``autotune`` and ``triton_dtype`` import Triton
when called, so importing this module stays cheap (kernel modules call them at import time, and
those modules are only imported once a Triton backend was chosen).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernels_common.backend import interpreter_enabled


def cdiv(numerator: int, denominator: int) -> int:
    """Ceiling division of non-negative ``numerator`` by positive ``denominator``.

    >>> cdiv(129, 64)
    3
    """
    if denominator <= 0:
        raise ValueError(f"cdiv denominator must be positive, got {denominator}")
    if numerator < 0:
        raise ValueError(f"cdiv numerator must be non-negative, got {numerator}")
    return -(-numerator // denominator)


def next_power_of_2(n: int) -> int:
    """Smallest power of two that is ``>= n`` (1 for ``n <= 1``).

    >>> next_power_of_2(17), next_power_of_2(64), next_power_of_2(0)
    (32, 64, 1)
    """
    if n <= 1:
        return 1
    return 1 << (int(n) - 1).bit_length()


def is_power_of_2(n: int) -> bool:
    """True for 1, 2, 4, ...

    >>> is_power_of_2(128), is_power_of_2(96)
    (True, False)
    """
    return n > 0 and n & (n - 1) == 0


def autotune(
    configs: Sequence[Any], key: Sequence[str], *, interpreter_config: int = 0, **kwargs: Any
) -> Callable[[Any], Any]:
    """``triton.autotune`` that keeps a single config under the interpreter.

    The autotuner times configs on a GPU; under ``TRITON_INTERPRET=1`` it would run every config on
    the CPU for nothing, so only ``configs[interpreter_config]`` is kept there.
    """
    import triton

    if not configs:
        raise ValueError("autotune needs at least one config")
    if interpreter_enabled():
        if not 0 <= interpreter_config < len(configs):
            raise ValueError(
                f"interpreter_config={interpreter_config} is out of range "
                f"for {len(configs)} configs"
            )
        configs = [configs[interpreter_config]]
    return triton.autotune(configs=list(configs), key=list(key), **kwargs)


def triton_dtype(dtype: torch.dtype) -> Any:
    """The ``triton.language`` dtype matching a torch dtype (for ``tl.constexpr`` dtype args).

    Raises:
        TypeError: the dtype has no Triton counterpart.
    """
    import triton.language as tl

    mapping = {
        torch.float32: tl.float32,
        torch.float16: tl.float16,
        torch.bfloat16: tl.bfloat16,
        torch.float64: tl.float64,
        torch.int8: tl.int8,
        torch.int16: tl.int16,
        torch.int32: tl.int32,
        torch.int64: tl.int64,
        torch.uint8: tl.uint8,
        torch.bool: tl.int1,
    }
    try:
        return mapping[dtype]
    except KeyError:
        supported = ", ".join(sorted(str(d).removeprefix("torch.") for d in mapping))
        raise TypeError(f"no Triton dtype for {dtype}; supported: {supported}") from None


def device_guard(tensor: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """Make ``tensor``'s CUDA device current for a kernel launch (Triton launches on the current
    device, not on the tensor's); a no-op for CPU tensors (the interpreter)."""
    if tensor.device.type == "cuda":
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()
