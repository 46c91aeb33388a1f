"""Bad input is refused before any computation, with messages that say what is wrong."""

from __future__ import annotations

import pytest
import torch

from tfla_mlstm import (
    default_chunk_size,
    mlstm_chunkwise,
    mlstm_parallel,
    mlstm_step,
    mlstmsig_chunkwise,
)


def inputs(B=1, NH=2, S=5, DQK=4, DV=3, dtype=torch.float32):
    return (
        torch.randn(B, NH, S, DQK, dtype=dtype),
        torch.randn(B, NH, S, DQK, dtype=dtype),
        torch.randn(B, NH, S, DV, dtype=dtype),
        torch.randn(B, NH, S, dtype=dtype),
        torch.randn(B, NH, S, dtype=dtype),
    )


def test_mismatched_shapes():
    q, k, v, i, f = inputs()
    with pytest.raises(ValueError, match=r"k must have the shape of q \(1, 2, 5, 4\)"):
        mlstm_chunkwise(q, k[:, :, :3], v, i, f)
    with pytest.raises(ValueError, match=r"v must have shape \(1, 2, 5, 'DV'\)"):
        mlstm_chunkwise(q, k, v[:, :1], i, f)
    with pytest.raises(ValueError, match=r"f \(gate pre-activations\) must have shape \(1, 2, 5\)"):
        mlstm_parallel(q, k, v, i, f[..., None])
    with pytest.raises(ValueError, match=r"q must have shape \(B, NH, S, DQK\)"):
        mlstm_chunkwise(q[0], k, v, i, f)
    with pytest.raises(ValueError, match=r"q must have shape \(B, NH, DQK\)"):
        mlstm_step(q, k, v, i, f)


def test_mismatched_dtypes_and_devices():
    q, k, v, i, f = inputs()
    with pytest.raises(TypeError, match=r"share one dtype.*v=torch.float16"):
        mlstm_chunkwise(q, k, v.half(), i, f)
    with pytest.raises(TypeError, match=r"i must be float32, float16, bfloat16 or float64"):
        mlstm_chunkwise(q, k, v, i.long(), f)
    with pytest.raises(TypeError, match=r"q must be a torch.Tensor, got list"):
        mlstm_chunkwise([1.0], k, v, i, f)
    with pytest.raises(ValueError, match=r"one device.*f=meta"):
        mlstm_chunkwise(q, k, v, i, f.to("meta"))


@pytest.mark.parametrize("chunk_size", [0, 8, 48, 100])
def test_chunk_size_must_be_a_power_of_two_of_at_least_16(chunk_size):
    with pytest.raises(ValueError, match=rf"power of two >= 16, got {chunk_size}"):
        mlstm_chunkwise(*inputs(), chunk_size=chunk_size)
    with pytest.raises(TypeError, match=r"chunk_size must be an int"):
        mlstmsig_chunkwise(*inputs(), chunk_size=32.0)


def test_default_chunk_size_takes_a_positive_int_length():
    with pytest.raises(ValueError, match=r"sequence_length must be >= 1, got 0"):
        default_chunk_size(0)
    with pytest.raises(TypeError, match=r"sequence_length must be an int, got float"):
        default_chunk_size(128.0)
    with pytest.raises(TypeError, match=r"chunk_size must be an int, got str"):
        mlstm_chunkwise(*inputs(), chunk_size="auto")


def test_bad_states():
    q, k, v, i, f = inputs()
    C, n, m = torch.zeros(1, 2, 4, 3), torch.zeros(1, 2, 4), torch.zeros(1, 2, 1)
    with pytest.raises(TypeError, match=r"state must be a tuple \(C, n, m\).*length 2"):
        mlstm_chunkwise(q, k, v, i, f, initial_state=(C, n))
    with pytest.raises(ValueError, match=r"state.C must have shape \(1, 2, 4, 3\)"):
        mlstm_chunkwise(q, k, v, i, f, initial_state=(C.transpose(-1, -2), n, m))
    with pytest.raises(TypeError, match=r"state must be a tuple \(C, n\)"):
        mlstmsig_chunkwise(q, k, v, i, f, initial_state=(C, n, m))


def test_empty_sequence_and_bad_eps():
    with pytest.raises(ValueError, match=r"all sizes must be >= 1"):
        mlstm_chunkwise(*inputs(S=0))
    with pytest.raises(ValueError, match=r"eps must be a non-negative number"):
        mlstm_chunkwise(*inputs(), eps=-1.0)
    with pytest.raises(ValueError, match=r"unknown backend 'cuda-fast'"):
        mlstm_chunkwise(*inputs(), backend="cuda-fast")
