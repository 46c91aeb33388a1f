"""The fused recurrent form (PyTorch and Triton-interpreted) against the float64 recurrence, and
the public wrappers' grouped heads, normalisation and FLA compatibility."""

from __future__ import annotations

import pytest
import torch

from jet_nemotron.ops.gated_delta import (
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    naive_recurrent_gated_delta_rule,
)
from kernels_common.testing import device_for_backend

# float32 kernels against the float64 recurrence: a few float32 ulps (1.2e-7) per accumulated term
# over sums of at most ~K·T terms of unit scale.
FLOAT32_RTOL = 2e-5
FLOAT64_RTOL = 1e-11

CASES = [  # (B, T, H, K, V), gate_logit_normalizer: every gate scale at the short shapes
    *[((1, 1, 1, 64, 64), n) for n in (0.1, 1.0, 10.0)],
    *[((1, 20, 2, 128, 128), n) for n in (0.1, 1.0, 10.0)],
    ((2, 63, 2, 60, 100), 1.0),
    ((1, 75, 1, 100, 60), 10.0),
    ((1, 500, 1, 16, 16), 10.0),  # 32 checkpoint segments, slow decay
]


@pytest.mark.parametrize(
    ("shape", "normalizer"),
    CASES,
    ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else c,
)
def test_fused_recurrent_triton_matches_recurrence(
    shape, normalizer, triton_backend, make_gdn_inputs, run_with_grads, all_close
):
    B, T, H, K, V = shape
    device = device_for_backend(triton_backend)
    inputs = make_gdn_inputs(B, T, H, K, V, gate_logit_normalizer=normalizer, device=device)
    expected = run_with_grads(
        naive_recurrent_gated_delta_rule,
        {n: x.detach().cpu().double().requires_grad_() for n, x in inputs.items()},
    )
    actual = run_with_grads(fused_recurrent_gated_delta_rule, inputs, backend=triton_backend)
    all_close(actual, expected, FLOAT32_RTOL)


def _per_value_head_oracle(q, k, v, g, beta, initial_state, output_final_state):
    """Grouped value heads from first principles: value head ``i`` runs the recurrence with query
    and key head ``i // (HV / H)``, one head at a time (float64)."""
    H, HV = q.shape[2], v.shape[2]
    outputs, states = [], []
    for i in range(HV):
        j = i // (HV // H)
        o, S = naive_recurrent_gated_delta_rule(
            q[:, :, j : j + 1], k[:, :, j : j + 1], v[:, :, i : i + 1], g[:, :, i : i + 1],
            beta[:, :, i : i + 1], initial_state=initial_state[:, i : i + 1],
            output_final_state=True,
        )  # fmt: skip
        outputs.append(o)
        states.append(S)
    return torch.cat(outputs, 2), torch.cat(states, 1)


@pytest.mark.parametrize("form", ["chunk", "fused_recurrent"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_grouped_value_heads(form, backend, make_gdn_inputs, run_with_grads, all_close, request):
    """HV = 6 value heads on H = 2 query/key heads (three value heads per key head)."""
    if backend == "triton":
        backend = request.getfixturevalue("triton_backend")
    op = chunk_gated_delta_rule if form == "chunk" else fused_recurrent_gated_delta_rule
    options = {"chunk_size": 16} if form == "chunk" else {}
    inputs = make_gdn_inputs(1, 21, 2, 32, 16, HV=6, device=device_for_backend(backend))
    actual = run_with_grads(op, inputs, backend=backend, **options)
    expected = run_with_grads(
        _per_value_head_oracle,
        {n: x.detach().cpu().double().requires_grad_() for n, x in inputs.items()},
    )
    all_close(actual, expected, FLOAT32_RTOL)


def test_state_passing_two_halves_equal_one_run(make_gdn_inputs):
    inputs = {n: x.detach().double() for n, x in make_gdn_inputs(2, 30, 2, 16, 8).items()}
    whole, final = fused_recurrent_gated_delta_rule(**inputs, output_final_state=True)
    first = {n: x[:, :13] if n != "initial_state" else x for n, x in inputs.items()}
    o1, middle = fused_recurrent_gated_delta_rule(**first, output_final_state=True)
    second = {n: x[:, 13:] for n, x in inputs.items() if n != "initial_state"}
    o2, last = fused_recurrent_gated_delta_rule(
        **second, initial_state=middle, output_final_state=True
    )
    torch.testing.assert_close(torch.cat([o1, o2], 1), whole, rtol=0, atol=1e-12)
    torch.testing.assert_close(last, final, rtol=0, atol=1e-12)


def test_recurrence_equals_fla_naive(make_gdn_inputs, fla_naive, all_close):
    """Peer: FLA's reference recurrence (arguments q, k, v, beta, g; it computes in float32)."""
    x = {n: t.detach().double() for n, t in make_gdn_inputs(2, 40, 3, 24, 20).items()}
    ours, ours_state = naive_recurrent_gated_delta_rule(**x, scale=0.3, output_final_state=True)
    theirs, their_state = fla_naive(
        x["q"], x["k"], x["v"], x["beta"], x["g"], scale=0.3,
        initial_state=x["initial_state"], output_final_state=True,
    )  # fmt: skip
    all_close({"o": theirs, "S": their_state}, {"o": ours, "S": ours_state}, FLOAT32_RTOL)


def test_l2norm_in_kernel_is_fla_formula(make_gdn_inputs):
    x = {n: t.detach().double() for n, t in make_gdn_inputs(1, 6, 1, 8, 4).items()}
    q, k = (
        torch.randn(1, 6, 1, 8, dtype=torch.float64),
        torch.randn(1, 6, 1, 8, dtype=torch.float64),
    )
    normalised = {"q": q / (q.square().sum(-1, keepdim=True) + 1e-6).sqrt(),
                  "k": k / (k.square().sum(-1, keepdim=True) + 1e-6).sqrt()}  # fmt: skip
    expected, _ = naive_recurrent_gated_delta_rule(**{**x, **normalised})
    actual, _ = fused_recurrent_gated_delta_rule(
        **{**x, "q": q, "k": k}, use_qk_l2norm_in_kernel=True
    )
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


def test_half_precision_kernel_close_to_float32(triton_backend, make_gdn_inputs):
    x = make_gdn_inputs(
        1, 12, 1, 32, 32, dtype=torch.bfloat16, device=device_for_backend(triton_backend)
    )
    o, _ = fused_recurrent_gated_delta_rule(**x, backend=triton_backend)
    o = o.cpu()
    reference, _ = naive_recurrent_gated_delta_rule(
        **{n: t.detach().cpu().float() for n, t in x.items()}
    )
    assert o.dtype == torch.bfloat16
    # inputs are exact in both runs; only the output's bf16 rounding (2^-8 relative) differs
    torch.testing.assert_close(o.float(), reference, rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"k": torch.randn(1, 4, 2, 9)}, "k must have shape"),
        ({"v": torch.randn(1, 4, 3, 8)}, "multiple of the query/key heads"),
        ({"g": torch.randn(1, 4)}, "g must have shape"),
        ({"beta": torch.randn(1, 4, 2, 1)}, "beta must have shape"),
        ({"initial_state": torch.randn(1, 2, 8, 9)}, "initial_state must have shape"),
        ({"q": torch.randn(1, 4, 2, 8).long()}, "must be float32"),
        ({"v": torch.randn(1, 4, 2, 8).half()}, "share one dtype"),
        ({"scale": -1.0}, "scale must be positive"),
        ({"q": torch.randn(4, 2, 8)}, r"q, k must be \(B, T, H, K\)"),
    ],
)
def test_bad_input_is_refused_clearly(change, message):
    x = {"q": torch.randn(1, 4, 2, 8), "k": torch.randn(1, 4, 2, 8), "v": torch.randn(1, 4, 2, 8),
         "g": -torch.rand(1, 4, 2), "beta": torch.rand(1, 4, 2)}  # fmt: skip
    with pytest.raises((ValueError, TypeError), match=message):
        fused_recurrent_gated_delta_rule(**{**x, **change})


def test_kernel_head_dim_limit_and_chunk_size(triton_backend):
    q = k = torch.randn(1, 3, 1, 257)
    v, g, beta = torch.randn(1, 3, 1, 4), -torch.rand(1, 3, 1), torch.rand(1, 3, 1)
    with pytest.raises(ValueError, match="up to 256"):
        fused_recurrent_gated_delta_rule(q, k, v, g, beta, backend=triton_backend)
    with pytest.raises(ValueError, match="up to 256"):
        chunk_gated_delta_rule(q, k, v, g, beta, backend=triton_backend)
    # the PyTorch forms have no such limit
    assert (
        fused_recurrent_gated_delta_rule(q, k, v, g, beta, backend="reference")[0].shape == v.shape
    )
    with pytest.raises(ValueError, match="chunk_size must be one of"):
        chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=48, backend="reference")
