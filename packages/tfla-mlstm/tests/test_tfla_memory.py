"""What the TFLA kernels keep and allocate: no float32 copy of the output or of q, k, v, their
gradients in the inputs' dtype, and a last state that does not hold every chunk's state.

Runs on the CPU interpreter under ``TRITON_INTERPRET=1`` and compiled on CUDA. The checks count
tensors, not bytes of device memory: a ``TorchDispatchMode`` records every tensor each PyTorch op
returns (the kernels' output buffers included), and the storages behind the tensors autograd
saved are compared with the sizes of what may legitimately be kept.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels_common.testing import device_for_backend
from tfla_mlstm import mlstm_chunkwise, mlstmsig_chunkwise

# S = 40 in chunks of 16: three chunks, the last one partial (S_PAD = 48). The states of all
# chunks, (B·NH, 4, DQK, DV), differ in size from every per-step tensor below.
B, NH, S, DQK, DV, CHUNK = 1, 2, 40, 8, 16, 16
S_PAD = 48
OPS = {"mlstm": mlstm_chunkwise, "sig": mlstmsig_chunkwise}


class RecordOutputs(TorchDispatchMode):
    """Records ``(op, shape, dtype)`` of every tensor an op returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[tuple[str, tuple[int, ...], torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        results = out if isinstance(out, tuple | list) else (out,)
        for result in results:
            if isinstance(result, torch.Tensor):
                self.outputs.append((str(func), tuple(result.shape), result.dtype))
        return out


def inputs(device: str, dtype: torch.dtype, grad: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shapes = {"q": (DQK,), "k": (DQK,), "v": (DV,), "i": (), "f": ()}
    return {
        name: torch.randn(B, NH, S, *tail, generator=generator)
        .to(device, dtype)
        .requires_grad_(grad)
        for name, tail in shapes.items()
    }


def float32_per_step_blocks(outputs) -> list:
    """Float32 tensors with one row of DQK or DV values per step (a float32 h, q, k, v, dh or
    gradient), in any layout: flat, per head, padded or not."""
    sizes = {B * NH * steps * d for steps in (S, S_PAD) for d in (DQK, DV)}
    return [o for o in outputs if o[2] == torch.float32 and torch.Size(o[1]).numel() in sizes]


@pytest.mark.parametrize("variant", OPS)
def test_forward_without_grad_allocates_no_float32_output(triton_backend, variant):
    x = inputs(device_for_backend(triton_backend), torch.float16, grad=False)
    with torch.no_grad(), RecordOutputs() as recorded:
        h = OPS[variant](**x, chunk_size=CHUNK, backend=triton_backend)
    assert h.dtype == torch.float16
    assert h.shape == (B, NH, S, DV)
    assert recorded.outputs, "the dispatch mode saw no op"
    assert float32_per_step_blocks(recorded.outputs) == []


@pytest.mark.parametrize("variant", OPS)
def test_forward_and_backward_make_no_float32_copies(triton_backend, variant):
    """float16 inputs: outputs and gradients are written in float16 by the kernels, and neither
    pass makes a float32 tensor of q, k, v, h or their gradients (the gate gradients need only
    per-step row sums, the normalizer's gradient no saved h)."""
    x = inputs(device_for_backend(triton_backend), torch.float16, grad=True)
    dh = torch.randn(B, NH, S, DV, generator=torch.Generator().manual_seed(1)).to(x["q"])
    with RecordOutputs() as recorded:
        h = OPS[variant](**x, chunk_size=CHUNK, backend=triton_backend)
        h.backward(dh)
    assert h.dtype == torch.float16
    assert all(x[n].grad.dtype == torch.float16 for n in "qkvif")
    # the backward's kernel buffers were seen: the dispatch mode covered the backward pass too
    assert sum(shape == (B, NH, S, DQK) for _, shape, _ in recorded.outputs) >= 2
    assert float32_per_step_blocks(recorded.outputs) == []


@pytest.mark.parametrize("variant", OPS)
def test_saved_and_returned_state_do_not_hold_every_chunk_state(triton_backend, variant):
    """The returned last state owns storage of exactly its own size, and every tensor saved for
    the backward pass is an input or one of: the state (B·NH·DQK·DV, B·NH·DQK, B·NH floats), the
    per-step denominator and normalizer (B·NH·S_PAD floats)."""
    x = inputs(device_for_backend(triton_backend), torch.float32, grad=True)
    h, state = OPS[variant](**x, chunk_size=CHUNK, return_last_state=True, backend=triton_backend)
    expected = {"C": B * NH * DQK * DV * 4, "n": B * NH * DQK * 4, "m": B * NH * 4}
    for name, part in zip(state._fields, state, strict=True):
        assert part.untyped_storage().nbytes() == expected[name], name
    input_storages = {t.untyped_storage().data_ptr() for t in x.values()}
    allowed = set(expected.values()) | {B * NH * S_PAD * 4}
    saved = h.grad_fn.saved_tensors
    assert len(saved) > len(x)
    for tensor in saved:
        storage = tensor.untyped_storage()
        assert storage.data_ptr() in input_storages or storage.nbytes() in allowed, tensor.shape


@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_chunk_states_shrink_with_the_chunk_size(triton_backend, chunk_size):
    """The memory side of a larger chunk: the forward pass allocates the states of
    ``ceil(S / chunk_size) + 1`` chunk boundaries, and nothing else of the states' shape (the
    interpreter copies a kernel's arguments, so one buffer may be seen more than once)."""
    x = inputs(device_for_backend(triton_backend), torch.float16, grad=False)
    with torch.no_grad(), RecordOutputs() as recorded:
        mlstm_chunkwise(**x, chunk_size=chunk_size, backend=triton_backend)
    # (B·NH, boundaries, DQK, DV); the initial and last states are (B, NH, DQK, DV), B = 1
    states = [s for _, s, _ in recorded.outputs if len(s) == 4 and s[0] == B * NH]
    assert set(states) == {(B * NH, -(-S // chunk_size) + 1, DQK, DV)}
