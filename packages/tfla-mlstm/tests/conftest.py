"""Shared input factory of the tests: seeded mLSTM / mLSTMsig inputs as keyword arguments."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tfla_mlstm import MLSTMSigState, MLSTMState


def mlstm_inputs(
    B: int,
    NH: int,
    S: int,
    DQK: int,
    DV: int,
    *,
    sig: bool = False,
    state: bool = False,
    gate_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> Callable[[torch.Generator], dict]:
    """A factory for ``assert_kernel_matches``: q, k, v, i, f and optionally ``initial_state``,
    all requiring grad. Forget pre-activations are centred at +2 (mostly remembering, as trained
    models are) and scaled with the input gates by ``gate_scale``."""

    def make(generator: torch.Generator) -> dict:
        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator)

        inputs = {
            "q": randn(B, NH, S, DQK),
            "k": randn(B, NH, S, DQK),
            "v": randn(B, NH, S, DV),
            "i": gate_scale * randn(B, NH, S),
            "f": gate_scale * randn(B, NH, S) + 2.0,
        }
        inputs = {n: x.to(device, dtype).requires_grad_() for n, x in inputs.items()}
        if state:
            C, n = randn(B, NH, DQK, DV), randn(B, NH, DQK)
            parts = [C, n] if sig else [C, n, randn(B, NH, 1)]
            parts = [x.to(device).requires_grad_() for x in parts]
            inputs["initial_state"] = MLSTMSigState(*parts) if sig else MLSTMState(*parts)
        return inputs

    return make


@pytest.fixture
def make_inputs() -> Callable[..., Callable[[torch.Generator], dict]]:
    return mlstm_inputs


@pytest.fixture
def chunk_sizes_seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The chunk size of every call that reaches the chunkwise form, in order."""
    from tfla_mlstm import ops

    seen: list[int] = []
    chunkwise_op = ops.chunkwise_op

    def recording(*args, **kwargs):
        seen.append(kwargs["chunk_size"])
        return chunkwise_op(*args, **kwargs)

    monkeypatch.setattr(ops, "chunkwise_op", recording)
    return seen
