"""State passing: two halves with the carried state equal one run; stepping equals chunkwise."""

from __future__ import annotations

import pytest
import torch

from tfla_mlstm import mlstm_chunkwise, mlstm_step, mlstmsig_chunkwise, mlstmsig_step

CHUNKWISE = {"mlstm": mlstm_chunkwise, "sig": mlstmsig_chunkwise}
STEP = {"mlstm": mlstm_step, "sig": mlstmsig_step}
# float32 sums of a few hundred O(1) terms, reordered: far below these bounds
ATOL = RTOL = 1e-5


def split(inputs: dict, cut: int) -> tuple[dict, dict]:
    names = "qkvif"
    first = {n: inputs[n][:, :, :cut].detach() for n in names}
    second = {n: inputs[n][:, :, cut:].detach() for n in names}
    return first, second


@pytest.mark.parametrize("variant", ["mlstm", "sig"])
@pytest.mark.parametrize("cut", [1, 40, 64])
def test_two_halves_with_the_carried_state_equal_one_run(make_inputs, variant, cut):
    op = CHUNKWISE[variant]
    inputs = make_inputs(2, 2, 100, 8, 12, sig=variant == "sig")(torch.Generator().manual_seed(0))
    full = {n: inputs[n].detach() for n in "qkvif"}
    h, state = op(**full, chunk_size=32, return_last_state=True, backend="reference")
    first, second = split(inputs, cut)
    h1, mid = op(**first, chunk_size=32, return_last_state=True, backend="reference")
    h2, last = op(
        **second, chunk_size=16, initial_state=mid, return_last_state=True, backend="reference"
    )
    torch.testing.assert_close(torch.cat([h1, h2], dim=2), h, atol=ATOL, rtol=RTOL)
    for carried, expected in zip(last, state, strict=True):
        torch.testing.assert_close(carried, expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("variant", ["mlstm", "sig"])
def test_steps_equal_the_chunkwise_output_and_last_state(make_inputs, variant):
    inputs = make_inputs(3, 2, 37, 8, 4, sig=variant == "sig")(torch.Generator().manual_seed(1))
    q, k, v, i, f = (inputs[n].detach() for n in "qkvif")
    h, state = CHUNKWISE[variant](
        q, k, v, i, f, chunk_size=16, return_last_state=True, backend="reference"
    )
    step_state = None
    for t in range(q.shape[2]):
        h_t, step_state = STEP[variant](
            q[:, :, t], k[:, :, t], v[:, :, t], i[:, :, t, None], f[:, :, t, None], step_state
        )
        torch.testing.assert_close(h_t, h[:, :, t], atol=ATOL, rtol=RTOL)
    assert type(step_state) is type(state)
    for stepped, expected in zip(step_state, state, strict=True):
        torch.testing.assert_close(stepped, expected, atol=ATOL, rtol=RTOL)
