"""Dynamic causal convolution: a depthwise causal convolution whose kernel changes every token.

The JetBlock's convolution (Jet-Nemotron): a generator network turns each token into
its own kernel ``K_t (D, W)``, applied to the last ``W`` inputs without activation:

    y_t[d] = Σ_{w=0}^{W-1} x_{t-W+1+w}[d] · K_t[d, w].

The convolution state ``(B, D, W)`` holds the last ``W`` inputs, oldest first (column ``W - 1`` is
the newest). A pass that starts from a state reads ``x_{-W+1} .. x_{-1}`` from its last ``W - 1``
columns; without one those positions are zero. The final state is the last ``W`` inputs of the
state followed by the sequence. A decode step rolls the state left, appends the new input and
convolves the result with that token's kernel, so stepping token by token from a zero state gives
the same outputs and state as one pass.
"""

from __future__ import annotations

import torch

from kernels_common.backend import Backend, KernelOp

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
MIN_WIDTH, MAX_WIDTH = 2, 8


def dynamic_causal_conv_reference(
    x: torch.Tensor, kernels: torch.Tensor, conv_state: torch.Tensor | None
) -> torch.Tensor:
    """The convolution by unfolding the padded sequence into windows (the oracle of the kernels).

    No validation: :func:`dynamic_causal_conv` checks the inputs and calls this as its
    ``reference`` backend.

    Args:
        x: ``(B, T, D)`` inputs.
        kernels: ``(B, T, D, W)`` per-token kernels.
        conv_state: ``(B, D, W)`` the inputs before ``x`` (oldest first), or ``None`` (zeros).

    Returns:
        ``y (B, T, D)`` in ``x``'s dtype, computed in float32 (float64 for float64 inputs).
    """
    W = kernels.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    sequence = x.transpose(1, 2).to(dtype)
    if conv_state is None:
        past = sequence.new_zeros(*sequence.shape[:2], W - 1)
    else:
        past = conv_state[..., 1:].to(dtype)
    windows = torch.cat([past, sequence], dim=-1).unfold(-1, W, 1)  # (B, D, T, W)
    y = (windows.transpose(1, 2) * kernels.to(dtype)).sum(-1)
    return y.to(x.dtype)


def dynamic_causal_conv_step_reference(
    x: torch.Tensor, kernels: torch.Tensor, conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: the state rolled left with ``x`` appended, convolved with ``kernels``.

    Args:
        x: ``(B, D)`` the new input; kernels: ``(B, D, W)`` its kernel.
        conv_state: ``(B, D, W)`` the last ``W`` inputs (not modified).

    Returns:
        ``y (B, D)`` in ``x``'s dtype (computed in float32, or float64) and the new state
        ``(B, D, W)``.
    """
    new_state = torch.cat([conv_state[..., 1:], x[..., None]], dim=-1)
    dtype = torch.promote_types(x.dtype, torch.float32)
    y = (new_state.to(dtype) * kernels.to(dtype)).sum(-1)
    return y.to(x.dtype), new_state


dynamic_causal_conv_op = KernelOp(
    name="dynamic_causal_conv",
    reference=dynamic_causal_conv_reference,
    triton="jet_nemotron.ops.dynamic_conv_triton:dynamic_causal_conv_triton",
)
dynamic_causal_conv_step_op = KernelOp(
    name="dynamic_causal_conv_step",
    reference=dynamic_causal_conv_step_reference,
    triton="jet_nemotron.ops.dynamic_conv_triton:dynamic_causal_conv_step_triton",
)


def _check_tensor(
    name: str, value: object, dims: str, x: torch.Tensor | None = None
) -> torch.Tensor:
    """``value`` if it is a tensor of rank ``len(dims)`` with a supported dtype, and of ``x``'s
    dtype and device when ``x`` is given."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {dims}, got {type(value)}")
    if value.dim() != len(dims.split(",")):
        raise ValueError(f"{name} must have shape {dims}, got {tuple(value.shape)}")
    if value.dtype not in DTYPES:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise TypeError(f"{name} has dtype {value.dtype}; allowed: {allowed}")
    if x is not None and value.dtype != x.dtype:
        raise TypeError(
            f"{name} has dtype {value.dtype} but x has {x.dtype}; give all inputs one dtype"
        )
    if x is not None and value.device != x.device:
        raise ValueError(
            f"{name} is on {value.device} but x is on {x.device}; move all inputs to one device"
        )
    return value


def _check_inputs(
    x: object, kernels: object, conv_state: object, *, step: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Types, ranks, shapes, dtypes and devices of a convolution (``step=False``) or decode step."""
    x_dims, k_dims = ("(B, D)", "(B, D, W)") if step else ("(B, T, D)", "(B, T, D, W)")
    x = _check_tensor("x", x, x_dims)
    kernels = _check_tensor("kernels", kernels, k_dims, x)
    if conv_state is not None or step:
        conv_state = _check_tensor("conv_state", conv_state, "(B, D, W)", x)
    if x.numel() == 0:
        raise ValueError(f"x {x_dims} must not be empty, got shape {tuple(x.shape)}")
    if kernels.shape[:-1] != x.shape:
        raise ValueError(
            f"kernels must have shape {k_dims} with {x_dims} = x's {tuple(x.shape)}, "
            f"got {tuple(kernels.shape)}"
        )
    W = kernels.shape[-1]
    if not MIN_WIDTH <= W <= MAX_WIDTH:
        raise ValueError(f"the kernel width W = {W} must be in [{MIN_WIDTH}, {MAX_WIDTH}]")
    if conv_state is not None:
        expected = (x.shape[0], x.shape[-1], W)
        if conv_state.shape != expected:
            raise ValueError(
                f"conv_state must have shape (B, D, W) = {expected} to match x and kernels, "
                f"got {tuple(conv_state.shape)}"
            )
    return x, kernels, conv_state


def _final_state(x: torch.Tensor, conv_state: torch.Tensor | None, width: int) -> torch.Tensor:
    """The last ``width`` inputs of the state followed by ``x (B, T, D)``: ``(B, D, width)``."""
    recent = x[:, -width:].transpose(1, 2)
    if conv_state is None:
        conv_state = recent.new_zeros(*recent.shape[:2], width)
    return torch.cat([conv_state, recent], dim=-1)[..., -width:].contiguous()


def dynamic_causal_conv(
    x: torch.Tensor,
    kernels: torch.Tensor,
    *,
    conv_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str | Backend | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dynamic causal convolution of a sequence: ``y_t = Σ_w x_{t-W+1+w} ⊙ K_t[:, w]``.

    Differentiable in ``x``, ``kernels`` and ``conv_state`` on every backend.

    Args:
        x: ``(B, T, D)`` inputs, ``T >= 1``; float32, float16, bfloat16 or float64, and all
            three tensors of one dtype and on one device.
        kernels: ``(B, T, D, W)`` one kernel per token, ``2 <= W <= 8``.
        conv_state: ``(B, D, W)`` the last ``W`` inputs before ``x``, oldest first (its last
            ``W - 1`` columns are read), or ``None`` for zeros.
        output_final_state: also return the state after ``x``.
        backend: ``None``/``"auto"`` (Triton on CUDA, the interpreter under
            ``TRITON_INTERPRET=1``, PyTorch otherwise), ``"triton"``, ``"interpreter"`` or
            ``"reference"``.

    Returns:
        ``y (B, T, D)`` in ``x``'s dtype (accumulated in float32, float64 for float64 inputs)
        and the final state ``(B, D, W)`` (zeros where the state and ``x`` hold fewer than
        ``W`` inputs), or ``None`` without ``output_final_state``.

    Raises:
        TypeError: a non-tensor input, an unsupported dtype or mixed dtypes.
        ValueError: wrong ranks or shapes, ``W`` out of range, an empty ``x``, or mixed devices.

    Example:
        >>> import torch
        >>> x, kernels = torch.randn(2, 5, 8), torch.randn(2, 5, 8, 4)
        >>> y, state = dynamic_causal_conv(x, kernels, output_final_state=True, backend="reference")
        >>> y.shape, state.shape
        (torch.Size([2, 5, 8]), torch.Size([2, 8, 4]))
        >>> torch.equal(state, x[:, -4:].transpose(1, 2))
        True
    """
    x, kernels, conv_state = _check_inputs(x, kernels, conv_state, step=False)
    y = dynamic_causal_conv_op(x, kernels, conv_state, backend=backend)
    final_state = _final_state(x, conv_state, kernels.shape[-1]) if output_final_state else None
    return y, final_state


def dynamic_causal_conv_step(
    x: torch.Tensor,
    kernels: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    backend: str | Backend | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step of :func:`dynamic_causal_conv`: the state takes ``x`` and drops its
    oldest column, and ``y = Σ_w new_state[..., w] ⊙ kernels[..., w]``.

    Out of place: ``conv_state`` is not modified. Differentiable in all three inputs.

    Args:
        x: ``(B, D)`` the new input; kernels: ``(B, D, W)`` its kernel, ``2 <= W <= 8``.
        conv_state: ``(B, D, W)`` the last ``W`` inputs, oldest first (zeros at the start).
        backend: as in :func:`dynamic_causal_conv`.

    Returns:
        ``y (B, D)`` in ``x``'s dtype and the new state ``(B, D, W)``.

    Example:
        >>> import torch
        >>> x, kernels, state = torch.randn(2, 8), torch.randn(2, 8, 4), torch.zeros(2, 8, 4)
        >>> y, state = dynamic_causal_conv_step(x, kernels, state, backend="reference")
        >>> torch.allclose(y, x * kernels[..., -1]), torch.equal(state[..., -1], x)
        (True, True)
    """
    x, kernels, conv_state = _check_inputs(x, kernels, conv_state, step=True)
    return dynamic_causal_conv_step_op(x, kernels, conv_state, backend=backend)
