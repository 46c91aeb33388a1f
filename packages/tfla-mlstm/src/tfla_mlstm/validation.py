"""Input checks shared by every op: clear errors before any kernel runs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels_common.triton_utils import is_power_of_2

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_tensor(name: str, tensor: object) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    return tensor


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    step: bool = False,
) -> tuple[int, int, int, int, int]:
    """Check q, k, v, i, f of a sequence (``step=False``) or of one step; return the sizes.

    Sequence: q, k ``(B, NH, S, DQK)``, v ``(B, NH, S, DV)``, i, f ``(B, NH, S)``.
    Step: q, k ``(B, NH, DQK)``, v ``(B, NH, DV)``, i, f ``(B, NH, 1)``.

    Returns:
        ``(B, NH, S, DQK, DV)`` with ``S = 1`` for a step.
    """
    tensors = {"q": q, "k": k, "v": v, "i": i, "f": f}
    for name, tensor in tensors.items():
        _check_tensor(name, tensor)
        if tensor.dtype not in FLOAT_DTYPES:
            allowed = "float32, float16, bfloat16 or float64"
            raise TypeError(f"{name} must be {allowed}, got {tensor.dtype}")
    ndim = 3 if step else 4
    layout = "(B, NH, DQK)" if step else "(B, NH, S, DQK)"
    if q.ndim != ndim:
        raise ValueError(f"q must have shape {layout}, got {tuple(q.shape)}")
    if step:
        B, NH, DQK = q.shape
        S = 1
        expected_gate = (B, NH, 1)
        expected_v_prefix = (B, NH)
    else:
        B, NH, S, DQK = q.shape
        expected_gate = (B, NH, S)
        expected_v_prefix = (B, NH, S)
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.ndim != ndim or tuple(v.shape[:-1]) != expected_v_prefix:
        raise ValueError(
            f"v must have shape {(*expected_v_prefix, 'DV')}, got {tuple(v.shape)} "
            f"(q has {tuple(q.shape)})"
        )
    for name, gate in (("i", i), ("f", f)):
        if tuple(gate.shape) != expected_gate:
            raise ValueError(
                f"{name} (gate pre-activations) must have shape {expected_gate}, "
                f"got {tuple(gate.shape)}"
            )
    if min(B, NH, S, DQK, v.shape[-1]) < 1:
        raise ValueError(f"all sizes must be >= 1, got q {tuple(q.shape)}, v {tuple(v.shape)}")
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        found = ", ".join(f"{n}={t.dtype}" for n, t in tensors.items())
        raise TypeError(f"q, k, v, i, f must share one dtype, got {found}")
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        found = ", ".join(f"{n}={t.device}" for n, t in tensors.items())
        raise ValueError(f"q, k, v, i, f must be on one device, got {found}")
    return B, NH, S, DQK, v.shape[-1]


def check_state(
    state: Sequence[torch.Tensor] | None,
    names: Sequence[str],
    shapes: Sequence[tuple[int, ...]],
    device: torch.device,
) -> tuple[torch.Tensor, ...] | None:
    """Check a recurrent state against the expected component names and shapes."""
    if state is None:
        return None
    if not isinstance(state, tuple | list) or len(state) != len(names):
        raise TypeError(
            f"the state must be a tuple ({', '.join(names)}), got {type(state).__name__}"
            + (f" of length {len(state)}" if isinstance(state, tuple | list) else "")
        )
    for name, tensor, shape in zip(names, state, shapes, strict=True):
        _check_tensor(f"state.{name}", tensor)
        if tensor.dtype not in FLOAT_DTYPES:
            raise TypeError(f"state.{name} must be a floating tensor, got {tensor.dtype}")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"state.{name} must have shape {shape}, got {tuple(tensor.shape)}")
        if tensor.device != device:
            raise ValueError(f"state.{name} is on {tensor.device}, the inputs on {device}")
    return tuple(state)


def _check_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def check_chunk_size(chunk_size: int) -> None:
    """Chunk sizes are powers of two >= 16 (the Triton tiles are at least 16 wide)."""
    _check_int("chunk_size", chunk_size)
    if chunk_size < 16 or not is_power_of_2(chunk_size):
        raise ValueError(f"chunk_size must be a power of two >= 16, got {chunk_size}")


def check_length(sequence_length: int) -> None:
    _check_int("sequence_length", sequence_length)
    if sequence_length < 1:
        raise ValueError(f"sequence_length must be >= 1, got {sequence_length}")


def check_eps(eps: float) -> None:
    if not (isinstance(eps, int | float) and eps >= 0):
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
