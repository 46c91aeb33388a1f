"""The hierarchical policy gradient against exact enumeration, and the budget projection."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qcs import QCSConfig, elastic_weights, hierarchical_gradient, project_budget
from qcs.policy import PolicyDraw

EPS = 0.1
LENGTHS = (2, 1)  # two sequences, three tokens: 2^5 = 32 outcomes


def objective(m: torch.Tensor, z: list[torch.Tensor]) -> torch.Tensor:
    """A quadratic function of the token weights w_it = m_i v_it (depends on the tokens of a
    sequence only when it is drawn, as a validation loss after training does)."""
    w = torch.cat([m[i] * (EPS + (1 - 2 * EPS) * z[i]) for i in range(len(z))])
    a = torch.tensor([[1.0, -0.5, 0.3], [-0.5, 2.0, 0.1], [0.3, 0.1, 0.7]], dtype=torch.float64)
    b = torch.tensor([0.4, -1.2, 0.9], dtype=torch.float64)
    return w @ a @ w + b @ w


def outcomes():
    """Every (m, z) with its factors, for the exact expectation."""
    for bits in itertools.product((0.0, 1.0), repeat=len(LENGTHS) + sum(LENGTHS)):
        m = torch.tensor(bits[: len(LENGTHS)], dtype=torch.float64)
        rest = list(bits[len(LENGTHS) :])
        z = []
        for n in LENGTHS:
            z.append(torch.tensor(rest[:n], dtype=torch.float64))
            rest = rest[n:]
        yield PolicyDraw(m, z)


def probability(draw: PolicyDraw, s, pi) -> torch.Tensor:
    p = torch.prod(s**draw.m * (1 - s) ** (1 - draw.m))
    for zi, pii in zip(draw.z, pi, strict=True):
        p = p * torch.prod(pii**zi * (1 - pii) ** (1 - zi))
    return p


def exact_gradient(s, pi):
    """∇ of E[f] by autograd through the enumerated expectation (the oracle)."""
    s = s.clone().requires_grad_(True)
    pi = [p.clone().requires_grad_(True) for p in pi]
    total = sum(probability(d, s, pi) * objective(d.m, d.z) for d in outcomes())
    total.backward()
    return s.grad, [p.grad for p in pi]


S = torch.tensor([0.3, 0.6], dtype=torch.float64)
PI = [torch.tensor([0.2, 0.7], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)]


def test_estimator_expectation_is_the_exact_gradient_without_baseline():
    expected_s, expected_pi = exact_gradient(S, PI)
    got_s = torch.zeros(2, dtype=torch.float64)
    got_pi = [torch.zeros_like(p) for p in PI]
    for draw in outcomes():  # E over one draw, exactly
        gs, gpi = hierarchical_gradient(objective(draw.m, draw.z).reshape(1), [draw], S, PI,
                                        baseline="none")  # fmt: skip
        p = probability(draw, S, PI)
        got_s += p * gs
        got_pi = [a + p * b for a, b in zip(got_pi, gpi, strict=True)]
    torch.testing.assert_close(got_s, expected_s, rtol=1e-12, atol=1e-12)
    for a, b in zip(got_pi, expected_pi, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_leave_one_out_is_unbiased_and_mean_baseline_shrinks_by_k_minus_one_over_k():
    """Enumerate every pair of independent draws (K = 2): 32² joint outcomes."""
    expected_s, expected_pi = exact_gradient(S, PI)
    draws = list(outcomes())
    probs = [probability(d, S, PI) for d in draws]
    values = [objective(d.m, d.z) for d in draws]
    for baseline, factor in (("leave_one_out", 1.0), ("mean", 0.5)):
        got_s = torch.zeros(2, dtype=torch.float64)
        got_pi = [torch.zeros_like(p) for p in PI]
        for (a, pa, va), (b, pb, vb) in itertools.product(
            zip(draws, probs, values, strict=False), repeat=2
        ):
            gs, gpi = hierarchical_gradient(torch.stack([va, vb]), [a, b], S, PI, baseline)
            got_s += pa * pb * gs
            got_pi = [x + pa * pb * y for x, y in zip(got_pi, gpi, strict=True)]
        torch.testing.assert_close(got_s, factor * expected_s, rtol=1e-10, atol=1e-12)
        for x, y in zip(got_pi, expected_pi, strict=True):
            torch.testing.assert_close(x, factor * y, rtol=1e-10, atol=1e-12)


def test_token_scores_only_inside_drawn_sequences():
    draw = PolicyDraw(torch.tensor([0.0, 1.0], dtype=torch.float64),
                      [torch.tensor([1.0, 0.0]), torch.tensor([1.0])])  # fmt: skip
    _, gpi = hierarchical_gradient(torch.tensor([2.0]), [draw], S, PI, baseline="none")
    assert torch.equal(gpi[0], torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(gpi[1], torch.tensor([2.0 * (1 - 0.5) / 0.25],
                                                    dtype=torch.float64))  # fmt: skip


def test_elastic_weights_take_the_two_values():
    w = elastic_weights([torch.tensor([1.0, 0.0, 1.0])], [3], 0.1)[0]
    torch.testing.assert_close(w, torch.tensor([0.9, 0.1, 0.9]))
    assert torch.equal(elastic_weights(None, [2], 0.1)[0], torch.ones(2))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-3, 3), min_size=2, max_size=12),
    st.floats(0.05, 0.95),
    st.integers(0, 2**31 - 1),
)
def test_projection_is_the_closest_feasible_point(values, share, seed):
    """Optimality of a Euclidean projection onto a convex set: ⟨x − p, y − p⟩ ≤ 0 for every
    feasible y (here random feasible points)."""
    x = torch.tensor(values, dtype=torch.float64)
    low, high = 0.01, 0.99
    total = low * len(x) + share * (high - low) * len(x)
    p = project_budget(x, total, low, high)
    assert abs(float(p.sum()) - total) < 1e-9
    assert float(p.min()) >= low
    assert float(p.max()) <= high
    generator = torch.Generator().manual_seed(seed)
    for _ in range(20):
        y = project_budget(torch.rand(len(x), generator=generator, dtype=torch.float64) * 4 - 2,
                           total, low, high)  # fmt: skip
        assert float((x - p) @ (y - p)) <= 1e-9


def test_projection_refuses_an_infeasible_total():
    with pytest.raises(ValueError, match="sums to"):
        project_budget(torch.zeros(3), 3.5)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("budget", 0.0, "budget must be in"),
        ("budget", 1.5, "budget must be in"),
        ("epsilon", 0.5, "epsilon must be in"),
        ("epsilon", -0.1, "epsilon must be in"),
        ("token_ratio", 0.0, "token_ratio must be in"),
        ("samples", 1, "leave-one-out"),
        ("baseline", "median", "baseline must be one of"),
    ],
)
def test_config_refuses_bad_settings(field, value, message):
    with pytest.raises(ValueError, match=message):
        QCSConfig(**{field: value})


def test_estimator_refuses_non_finite_values():
    draw = PolicyDraw(torch.ones(2, dtype=torch.float64), [torch.ones(2), torch.ones(1)])
    with pytest.raises(ValueError, match="NaN"):
        hierarchical_gradient(torch.tensor([float("nan"), 1.0]), [draw, draw], S, PI)
