"""Shared settings and input factories of the tests (FLA's test distributions).

One thread: the CI machine has two cores shared by the session.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

torch.set_num_threads(1)


def gdn_inputs(
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    *,
    HV: int | None = None,
    gate_logit_normalizer: float = 1.0,
    state: bool = True,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, torch.Tensor]:
    """q, k ``(B, T, H, K)`` (k L2-normalised), v ``(B, T, HV, V)``, ``g = logsigmoid(rand) /
    normalizer``, ``beta = sigmoid(rand)`` and an initial state, all requiring grad."""
    HV = H if HV is None else HV
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=generator, dtype=torch.float64)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    inputs = {
        "q": randn(B, T, H, K),
        "k": F.normalize(randn(B, T, H, K), p=2, dim=-1),
        "v": randn(B, T, HV, V),
        "g": F.logsigmoid(rand(B, T, HV)) / gate_logit_normalizer,
        "beta": rand(B, T, HV).sigmoid(),
    }
    if state:
        inputs["initial_state"] = randn(B, HV, K, V)
    state_dtype = torch.promote_types(dtype, torch.float32)
    return {
        name: x.to(device, state_dtype if name == "initial_state" else dtype).requires_grad_()
        for name, x in inputs.items()
    }


def output_and_grads(fn, inputs: dict[str, torch.Tensor], seed: int = 1, **options):
    """Run ``fn(**inputs, output_final_state=True, **options)``, push one random gradient into
    both outputs, return ``{"o", "final_state", "d<name>"...}`` in float64."""
    o, final = fn(**inputs, output_final_state=True, **options)
    generator = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=generator, dtype=torch.float64).to(o.device)
    dS = torch.randn(final.shape, generator=generator, dtype=torch.float64).to(o.device)
    loss = (o.double() * do).sum() + (final.double() * dS).sum()
    grads = torch.autograd.grad(loss, list(inputs.values()))
    result = {"o": o.double().cpu(), "final_state": final.double().cpu()}
    result.update(
        {f"d{name}": grad.double().cpu() for name, grad in zip(inputs, grads, strict=True)}
    )
    return result


@pytest.fixture
def make_gdn_inputs():
    return gdn_inputs


@pytest.fixture
def run_with_grads():
    return output_and_grads


def assert_all_close(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], rtol: float
) -> None:
    """Every tensor of ``actual`` within ``rtol · max(1, max|expected|) + rtol · |expected|`` of
    ``expected`` (an absolute floor on the tensor's own scale: cancellations make elements near
    zero carry the error of the large terms they came from)."""
    from kernels_common.testing import Tolerance, compare_tensors

    failures = []
    for name, reference in expected.items():
        scale = max(1.0, reference.detach().abs().max().item()) if reference.numel() else 1.0
        comparison = compare_tensors(name, actual[name], reference, Tolerance(rtol * scale, rtol))
        if not comparison.ok:
            failures.append(comparison.row())
    assert not failures, "\n".join(failures)


@pytest.fixture
def all_close():
    return assert_all_close


@pytest.fixture
def fla_naive():
    """FLA's reference recurrence (a peer, arguments ``q, k, v, beta, g``). Importing FLA on a
    CPU-only machine warns that Triton is unsupported and pulls torch modules that emit
    deprecation warnings at import: those import-time warnings of the peer are silenced here."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    return naive_recurrent_gated_delta_rule
