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
from kernels_common.triton_utils import next_power_of_2
from tfla_mlstm.reference.chunkwise import chunkwise_forward
from tfla_mlstm.reference.parallel import parallel_forward
from tfla_mlstm.reference.recurrent import recurrent_forward, recurrent_step
from tfla_mlstm.states import MLSTMSigState, MLSTMState
from tfla_mlstm.validation import (
    check_chunk_size,
    check_eps,
    check_inputs,
    check_length,
    check_state,
)
from tfla_mlstm.variant import MLSTM, Variant, mlstmsig

State = MLSTMState | MLSTMSigState
Output = torch.Tensor | tuple[torch.Tensor, State]

chunkwise_op = KernelOp(
    name="mlstm_chunkwise",
    reference=chunkwise_forward,
    triton="tfla_mlstm.autograd:tfla_chunkwise",
)

LARGEST_DEFAULT_CHUNK = 128


def default_chunk_size(sequence_length: int) -> int:
    """The chunk size the chunkwise ops use for ``S`` steps when given none: 128 from ``S = 128``
    on (the anchor's default, which its benchmarks found fastest), below that the smallest power
    of two >= ``S`` and >= 16, so a short sequence is one chunk with the least padding.

    Larger chunks trade compute for memory: the chunk states, ``(B, NH, ceil(S / chunk_size) +
    1, DQK, DV)`` float32 in the forward pass and again (recomputed, with their gradients) in the
    backward pass, shrink in proportion, while each query attends to more keys inside its chunk.
    This is what ``mlstm-kernels`` offers as keeping every ``k``-th state (its
    ``chunk_size_intra = k * chunk_size_inter``); here ``chunk_size=k * 128`` is that layout. The
    anchor requires ``S`` to be a multiple of the chunk; here the last chunk is padded, so a
    large chunk on a short remainder costs up to ``chunk_size - 1`` masked steps.

    Example:
        >>> [default_chunk_size(s) for s in (1, 20, 64, 100, 128, 8192)]
        [16, 32, 64, 128, 128, 128]
    """
    check_length(sequence_length)
    return min(LARGEST_DEFAULT_CHUNK, max(16, next_power_of_2(sequence_length)))


def _chunkwise(chunk_size: int | None, backend: str | Backend | None) -> Callable[..., object]:
    """The chunkwise form with a checked chunk size, or :func:`default_chunk_size` of the
    inputs' length for ``None``."""
    if chunk_size is not None:
        check_chunk_size(chunk_size)

    def form(q: torch.Tensor, *args: object, **options: object) -> object:
        size = default_chunk_size(q.shape[-2]) if chunk_size is None else chunk_size
        return chunkwise_op(q, *args, **options, chunk_size=size, backend=backend)

    return form


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
    chunk_size: int | None = None,
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
        chunk_size: a power of two >= 16, or ``None`` for :func:`default_chunk_size` of ``S``
            (128 from ``S = 128`` on); any ``S >= 1`` works (padded internally). Larger chunks
            hold fewer chunk states (memory) for more work inside each chunk.
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
        ...     q, k, v, i, f, return_last_state=True, backend="reference"
        ... )
        >>> h.shape, C.shape, m.shape
        (torch.Size([1, 2, 20, 4]), torch.Size([1, 2, 8, 4]), torch.Size([1, 2, 1]))
    """
    return _run(
        _chunkwise(chunk_size, backend),
        q, k, v, i, f, initial_state, return_last_state, MLSTM, eps,
    )  # fmt: skip


def mlstmsig_chunkwise(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    chunk_size: int | None = None,
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
    return _run(
        _chunkwise(chunk_size, backend),
        q, k, v, i, f, initial_state, return_last_state, mlstmsig(normalize), eps,
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
