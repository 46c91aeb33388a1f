"""Public mLSTM / mLSTMsig ops: chunkwise (TFLA or PyTorch), parallel, recurrent and one step.

Calling convention of ``mlstm-kernels``: q, k ``(B, NH, S, DQK)``, v ``(B, NH, S, DV)``, gate
pre-activations i, f ``(B, NH, S)``; the mLSTM state is ``(C, n, m)`` with shapes
``(B, NH, DQK, DV)``, ``(B, NH, DQK)``, ``(B, NH, 1)``, the mLSTMsig state ``(C, n)``. Outputs have
the inputs' dtype; states are float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from kernels_common.backend import Backend, KernelOp
from tfla_mlstm.reference.chunkwise import chunkwise_forward
from tfla_mlstm.reference.parallel import parallel_forward
from tfla_mlstm.reference.recurrent import recurrent_forward, recurrent_step
from tfla_mlstm.states import MLSTMSigState, MLSTMState
from tfla_mlstm.validation import check_chunk_size, check_eps, check_inputs, check_state
from tfla_mlstm.variant import MLSTM, Variant, mlstmsig

State = MLSTMState | MLSTMSigState
Output = torch.Tensor | tuple[torch.Tensor, State]

chunkwise_op = KernelOp(
    name="mlstm_chunkwise",
    reference=chunkwise_forward,
    triton="tfla_mlstm.autograd:tfla_chunkwise",
)


def _initial_state(
    state: Sequence[torch.Tensor] | None,
    variant: Variant,
    sizes: tuple[int, int, int, int, int],
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The state as float32 (float64 for float64 inputs) ``(C, n, m)``; a missing state is zero
    with ``m = -inf`` (mLSTM) or 0 (mLSTMsig)."""
    B, NH, _, DQK, DV = sizes
    dtype = torch.promote_types(dtype, torch.float32)
    shapes = [(B, NH, DQK, DV), (B, NH, DQK), (B, NH, 1)]
    names = ["C", "n", "m"] if variant.stabilized else ["C", "n"]
    checked = check_state(state, names, shapes[: len(names)], device)
    if checked is None:
        C = torch.zeros(shapes[0], device=device, dtype=dtype)
        n = torch.zeros(shapes[1], device=device, dtype=dtype)
        m0 = -math.inf if variant.stabilized else 0.0
        return C, n, torch.full(shapes[2], m0, device=device, dtype=dtype)
    C, n = checked[0].to(dtype), checked[1].to(dtype)
    zeros = torch.zeros(shapes[2], device=device, dtype=dtype)
    m = checked[2].to(dtype) if variant.stabilized else zeros
    return C, n, m


def _packed(state: tuple[torch.Tensor, torch.Tensor, torch.Tensor], variant: Variant) -> State:
    C, n, m = state
    return MLSTMState(C, n, m) if variant.stabilized else MLSTMSigState(C, n)


def _run(
    form: Callable[..., tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    initial_state: Sequence[torch.Tensor] | None,
    return_last_state: bool,
    variant: Variant,
    eps: float,
    **options: object,
) -> Output:
    sizes = check_inputs(q, k, v, i, f)
    check_eps(eps)
    state = _initial_state(initial_state, variant, sizes, q.device, q.dtype)
    h, last = form(q, k, v, i, f, state, variant, eps, **options)
    h = h.to(q.dtype)
    return (h, _packed(last, variant)) if return_last_state else h


def mlstm_chunkwise(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    chunk_size: int = 128,
    initial_state: Sequence[torch.Tensor] | None = None,
    return_last_state: bool = False,
    eps: float = 1e-6,
    backend: str | Backend | None = None,
) -> Output:
    """mLSTM over a sequence in chunkwise form: TFLA's Triton kernels or the PyTorch path.

    The same function as ``mlstm-kernels``' ``parallel--native_autograd`` (``q`` scaled by
    ``1/sqrt(DQK)``, ``h = N / (max(|z|, exp(-m)) + eps)``), computed in linear memory.

    Args:
        q: ``(B, NH, S, DQK)`` queries. All five inputs are float32, float16 or bfloat16, of
            one dtype and on one device.
        k: ``(B, NH, S, DQK)`` keys.
        v: ``(B, NH, S, DV)`` values.
        i: ``(B, NH, S)`` input gate pre-activations.
        f: ``(B, NH, S)`` forget gate pre-activations.
        chunk_size: a power of two >= 16; any ``S >= 1`` works (padded internally).
        initial_state: ``(C (B, NH, DQK, DV), n (B, NH, DQK), m (B, NH, 1))`` or ``None``.
        return_last_state: also return the state after the last step.
        eps: added to the denominator.
        backend: ``None``/``"auto"`` (Triton on CUDA, the interpreter under
            ``TRITON_INTERPRET=1``, PyTorch otherwise), ``"triton"``, ``"interpreter"`` or
            ``"reference"``.

    Returns:
        ``h (B, NH, S, DV)`` in the inputs' dtype, or ``(h, MLSTMState)`` (float32 state).

    Example:
        >>> import torch
        >>> q = k = torch.randn(1, 2, 20, 8)
        >>> v, i, f = torch.randn(1, 2, 20, 4), torch.randn(1, 2, 20), torch.randn(1, 2, 20)
        >>> h, (C, n, m) = mlstm_chunkwise(
        ...     q, k, v, i, f, chunk_size=16, return_last_state=True, backend="reference"
        ... )
        >>> h.shape, C.shape, m.shape
        (torch.Size([1, 2, 20, 4]), torch.Size([1, 2, 8, 4]), torch.Size([1, 2, 1]))
    """
    check_chunk_size(chunk_size)
    return _run(
        lambda *args, **kw: chunkwise_op(*args, **kw, backend=backend),
        q, k, v, i, f, initial_state, return_last_state, MLSTM, eps, chunk_size=chunk_size,
    )  # fmt: skip


def mlstmsig_chunkwise(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    chunk_size: int = 128,
    initial_state: Sequence[torch.Tensor] | None = None,
    return_last_state: bool = False,
    normalize: bool = True,
    eps: float = 1e-6,
    backend: str | Backend | None = None,
) -> Output:
    """mLSTMsig (sigmoid input gate, no max state) in chunkwise form; see :func:`mlstm_chunkwise`.

    ``h = N / (max(|z|, 1) + eps)`` when ``normalize``, else ``h = N``; the state is
    ``(C (B, NH, DQK, DV), n (B, NH, DQK))``. Same function as ``mlstm-kernels``'
    ``parallel--native_siging_autograd``.

    Example:
        >>> import torch
        >>> q = k = torch.randn(1, 1, 5, 8)
        >>> v, i, f = torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5), torch.randn(1, 1, 5)
        >>> mlstmsig_chunkwise(q, k, v, i, f, chunk_size=16, backend="reference").shape
        torch.Size([1, 1, 5, 8])
    """
    check_chunk_size(chunk_size)
    return _run(
        lambda *args, **kw: chunkwise_op(*args, **kw, backend=backend),
        q, k, v, i, f, initial_state, return_last_state, mlstmsig(normalize), eps,
        chunk_size=chunk_size,
    )  # fmt: skip


def mlstm_parallel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    initial_state: Sequence[torch.Tensor] | None = None,
    return_last_state: bool = False,
    eps: float = 1e-6,
) -> Output:
    """mLSTM in quadratic parallel form (``O(S^2)`` memory; the reference). Arguments and result
    as :func:`mlstm_chunkwise`."""
    return _run(parallel_forward, q, k, v, i, f, initial_state, return_last_state, MLSTM, eps)


def mlstmsig_parallel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    initial_state: Sequence[torch.Tensor] | None = None,
    return_last_state: bool = False,
    normalize: bool = True,
    eps: float = 1e-6,
) -> Output:
    """mLSTMsig in quadratic parallel form; arguments as :func:`mlstmsig_chunkwise`."""
    variant = mlstmsig(normalize)
    return _run(parallel_forward, q, k, v, i, f, initial_state, return_last_state, variant, eps)


def mlstm_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    initial_state: Sequence[torch.Tensor] | None = None,
    return_last_state: bool = False,
    eps: float = 1e-6,
) -> Output:
    """mLSTM as a loop of :func:`mlstm_step` over the sequence; arguments as
    :func:`mlstm_chunkwise`."""
    return _run(recurrent_forward, q, k, v, i, f, initial_state, return_last_state, MLSTM, eps)


def mlstmsig_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    initial_state: Sequence[torch.Tensor] | None = None,
    return_last_state: bool = False,
    normalize: bool = True,
    eps: float = 1e-6,
) -> Output:
    """mLSTMsig as a loop of :func:`mlstmsig_step`; arguments as :func:`mlstmsig_chunkwise`."""
    variant = mlstmsig(normalize)
    return _run(recurrent_forward, q, k, v, i, f, initial_state, return_last_state, variant, eps)


def _step(q, k, v, i, f, state, variant: Variant, eps: float) -> tuple[torch.Tensor, State]:
    sizes = check_inputs(q, k, v, i, f, step=True)
    check_eps(eps)
    h, new_state = recurrent_step(
        q, k, v, i, f, _initial_state(state, variant, sizes, q.device, q.dtype), variant, eps
    )
    return h.to(q.dtype), _packed(new_state, variant)


def mlstm_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    state: Sequence[torch.Tensor] | None = None,
    *,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, MLSTMState]:
    """One mLSTM step (generation): O(1) memory in the sequence length.

    Args:
        q: ``(B, NH, DQK)`` query.
        k: ``(B, NH, DQK)`` key.
        v: ``(B, NH, DV)`` value.
        i: ``(B, NH, 1)`` input gate pre-activation.
        f: ``(B, NH, 1)`` forget gate pre-activation.
        state: ``(C, n, m)`` from the previous step or a chunkwise call, or ``None`` (start).

    Returns:
        ``h (B, NH, DV)`` and the new :class:`MLSTMState`.

    Example:
        >>> import torch
        >>> q = k = torch.randn(2, 3, 8)
        >>> v, i, f = torch.randn(2, 3, 4), torch.zeros(2, 3, 1), torch.zeros(2, 3, 1)
        >>> h, state = mlstm_step(q, k, v, i, f)
        >>> h.shape, state.m.shape
        (torch.Size([2, 3, 4]), torch.Size([2, 3, 1]))
    """
    return _step(q, k, v, i, f, state, MLSTM, eps)


def mlstmsig_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    state: Sequence[torch.Tensor] | None = None,
    *,
    normalize: bool = True,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, MLSTMSigState]:
    """One mLSTMsig step; see :func:`mlstm_step` (the state is ``(C, n)``)."""
    return _step(q, k, v, i, f, state, mlstmsig(normalize), eps)
