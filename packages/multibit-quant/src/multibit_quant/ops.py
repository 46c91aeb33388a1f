"""The fake quantizers, dispatched per call between the Triton kernels and the PyTorch reference
(see :func:`kernels_common.resolve_backend`), with the input checks both share."""

from __future__ import annotations

import numbers

import torch

from kernels_common import Backend, KernelOp
from multibit_quant.reference import (
    ACTIVATION_METHODS,
    CORRECTIONS,
    MAX_BITS,
    MIN_BITS,
    WEIGHT_METHODS,
    fake_quant_activation_reference,
    fake_quant_weight_reference,
)

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

fake_quant_weight_op = KernelOp(
    name="fake_quant_weight",
    reference=fake_quant_weight_reference,
    triton="multibit_quant.autograd:fake_quant_weight_triton",
)
fake_quant_activation_op = KernelOp(
    name="fake_quant_activation",
    reference=fake_quant_activation_reference,
    triton="multibit_quant.autograd:fake_quant_activation_triton",
)


def check_bits(bits: object, what: str = "bits") -> int:
    """``bits`` as an int in the quantized range, or a clear error."""
    integral = isinstance(bits, numbers.Integral) and not isinstance(bits, bool)
    if not integral or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(
            f"{what} must be an integer from {MIN_BITS} to {MAX_BITS} (32 = full precision is "
            f"handled by the layers, not the quantizer), got {bits!r}"
        )
    return int(bits)


def _float64_backend(tensor: torch.Tensor, backend: str | Backend | None):
    """float64 inputs run the reference, in float64 (the kernels compute in float32)."""
    if tensor.dtype != torch.float64:
        return backend
    if backend is None or str(getattr(backend, "value", backend)).lower() in ("auto", "reference"):
        return Backend.REFERENCE
    raise TypeError(
        f"float64 inputs run on the reference backend only (the Triton kernels compute in "
        f"float32); got backend={backend!r}"
    )


def _check_float(name: str, tensor: object) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float64, float16 or bfloat16, got {tensor.dtype}")
    return tensor


def _check_step(
    step: object, shape: tuple[int, ...], device: torch.device, values: bool
) -> torch.Tensor:
    step = _check_float("step", step)
    if tuple(step.shape) != shape:
        raise ValueError(f"step must have shape {shape}, got {tuple(step.shape)}")
    if step.device != device:
        raise ValueError(f"step is on {step.device}, the input on {device}")
    if values:
        detached = step.detach()
        bad = ~(torch.isfinite(detached) & (detached > 0))
        if bool(bad.any()):
            index = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"step must be finite and positive (LSQ's step size), got "
                f"{float(detached[index]):g} at index {index}"
            )
    return step


def fake_quant_weight(
    weight: torch.Tensor,
    bits: int,
    method: str = "dorefa",
    step: torch.Tensor | None = None,
    correction: str | None = "mean_var",
    grad_scale: float | None = None,
    *,
    backend: str | Backend | None = None,
    check_step: bool = True,
) -> torch.Tensor:
    """Per-output-channel fake quantization of a weight, with optional bias correction.

    Args:
        weight: ``(C, K)``, one row per output channel (reshape a conv weight to
            ``(C_out, -1)``); float32, float16 or bfloat16 (computed in float32), or float64
            (the reference, in float64).
        bits: 2 to 8.
        method: ``"dorefa"`` (tanh-normalised, ``2^bits`` symmetric levels) or ``"lsq"``
            (learned step ``step (C,)``, codes ``[−2^{b−1}, 2^{b−1} − 1]``).
        step: LSQ's per-channel steps (finite and positive; the layers keep them so),
            differentiable; ``None`` for DoReFa.
        correction: ``"mean_var"`` (realign each channel's mean and std to the full-precision
            channel), ``"mean"``, or ``None``.
        grad_scale: LSQ's step-gradient scale (default ``1/sqrt(K·Q_p)``).
        backend: ``None``/``"auto"``, ``"triton"``, ``"interpreter"`` or ``"reference"``.
        check_step: refuse a zero, negative or non-finite ``step`` (reads its values: one
            synchronisation on a GPU; the layers, whose steps are clamped positive, skip it).

    Returns:
        ``(C, K)`` in ``weight``'s dtype; gradients by the straight-through estimator.

    Example:
        >>> import torch
        >>> w = torch.randn(4, 9)
        >>> q = fake_quant_weight(w, bits=2, backend="reference")
        >>> torch.allclose(q.mean(1), w.mean(1), atol=1e-6)  # bias-corrected means
        True
    """
    weight = _check_float("weight", weight)
    if weight.dim() != 2 or weight.numel() == 0:
        raise ValueError(f"weight must be a non-empty (C, K), got shape {tuple(weight.shape)}")
    check_bits(bits)
    if method not in WEIGHT_METHODS:
        raise ValueError(f"unknown weight method {method!r}; choose one of {WEIGHT_METHODS}")
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown correction {correction!r}; choose one of {CORRECTIONS}")
    if method == "lsq":
        step = _check_step(step, (weight.shape[0],), weight.device, check_step)
    elif step is not None:
        raise ValueError("step is only used by method='lsq'")
    backend = _float64_backend(weight, backend)
    return fake_quant_weight_op(weight, bits, method, step, correction, grad_scale, backend=backend)


def fake_quant_activation(
    x: torch.Tensor,
    bits: int,
    method: str = "clamp",
    step: torch.Tensor | None = None,
    signed: bool = False,
    grad_scale: float | None = None,
    *,
    backend: str | Backend | None = None,
    check_step: bool = True,
) -> torch.Tensor:
    """Per-tensor fake quantization of an activation.

    Args:
        x: any non-empty shape, float32, float16 or bfloat16.
        bits: 2 to 8.
        method: ``"clamp"`` (``round(clamp(x, 0, 1)·(2^b − 1))/(2^b − 1)``; signed: ``[−1, 1]``
            with ``2^{b−1} − 1`` levels a side) or ``"lsq"`` (learned scalar ``step (1,)``).
        signed: codes on both sides of zero (inputs that are not after a ReLU).
        grad_scale: LSQ's step-gradient scale (default ``1/sqrt(numel·Q_p)``).
        backend: as :func:`fake_quant_weight`.
        check_step: as :func:`fake_quant_weight`.

    Returns:
        The fake-quantized ``x``; gradients by the straight-through estimator (zero where
        clamped) and, for LSQ, the step's gradient.
    """
    x = _check_float("x", x)
    if x.numel() == 0:
        raise ValueError(f"x must be non-empty, got shape {tuple(x.shape)}")
    check_bits(bits)
    if method not in ACTIVATION_METHODS:
        raise ValueError(
            f"unknown activation method {method!r}; choose one of {ACTIVATION_METHODS}"
        )
    if method == "lsq":
        step = _check_step(step, (1,), x.device, check_step)
    elif step is not None:
        raise ValueError("step is only used by method='lsq'")
    backend = _float64_backend(x, backend)
    return fake_quant_activation_op(x, bits, method, step, signed, grad_scale, backend=backend)
