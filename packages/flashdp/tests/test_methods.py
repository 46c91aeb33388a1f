"""Every way of clipping a linear weight (flashdp.plan's store, ghost and recompute, forced with
``linear_method``) releases the brute-force gradients and respects the sensitivity bound.

Oracles and tolerances are those of test_clipping.py (vmap per-example gradients, 1e-5 relative)
and test_sensitivity.py (removing one example moves the pre-noise sum by at most C_l, slack
1e-5); here they run on each method, the Triton ones under the interpreter (or compiled on a GPU).
"""

from __future__ import annotations

import copy

import pytest
import torch
from oracle import assert_matches, brute_force
from test_clipping import SEQS, make_case, sum_mse, tiny_gpt2
from test_sensitivity import SLACK, model_and_batch
from torch import nn

import flashdp
from kernels_common.testing import device_for_backend

# (clipping, method) pairs each backend offers for T > 1
REFERENCE_METHODS = [("per_layer", "store"), ("per_layer", "ghost"), ("flat", "ghost")]
TRITON_METHODS = [("per_layer", "store"), ("per_layer", "recompute"), ("flat", "recompute")]


def backend_and_device(kind: str, request) -> tuple[str, torch.device]:
    if kind == "reference":
        return "reference", torch.device("cpu")
    backend = request.getfixturevalue("triton_backend")
    return backend, device_for_backend(backend)


def private(model, clipping, method, backend, **options):
    return flashdp.make_private(
        model,
        max_grad_norm=1.5,
        noise_multiplier=0.0,
        clipping=clipping,
        loss_reduction="sum",
        backend=backend,
        linear_method=method,
        **options,
    )


CASES = [("reference", *pair) for pair in REFERENCE_METHODS] + [
    ("triton", *pair) for pair in TRITON_METHODS
]


@pytest.mark.parametrize(("path", "clipping", "method"), CASES)
@pytest.mark.parametrize("seq", SEQS[1:], ids=lambda s: f"seq{len(s)}")
@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_linear_methods_match_brute_force(kind, seq, path, clipping, method, request):
    backend, device = backend_and_device(path, request)
    model, x, y = make_case(kind, seq, torch.Generator().manual_seed(len(seq)))
    expected = brute_force(model, sum_mse, x, y, clipping, max_grad_norm=1.5)
    dp = private(copy.deepcopy(model).to(device), clipping, method, backend)
    sum_mse(dp(x.to(device)), y.to(device)).backward()
    plans = flashdp.get_controller(dp).plan()
    assert {plan.method for plan in plans.values()} == {method}
    assert_matches(dp.cpu(), expected)


@pytest.mark.parametrize(("path", "clipping", "method"), CASES)
def test_gpt2_matches_brute_force_with_every_method(path, clipping, method, request):
    """GPT-2 (Conv1D, LayerNorm, embeddings, LM head) called the usual way, mean-reduced loss."""
    backend, device = backend_and_device(path, request)
    model = tiny_gpt2()
    tokens = torch.randint(0, 32, (4, 10), generator=torch.Generator().manual_seed(0))

    def loss_fn(out, targets):
        logits = out.logits if hasattr(out, "logits") else out
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")

    expected = brute_force(model, loss_fn, tokens, tokens, clipping, max_grad_norm=1.5)
    dp = private(copy.deepcopy(model).to(device), clipping, method, backend)
    loss_fn(dp(tokens.to(device)), tokens.to(device)).backward()
    assert_matches(dp.cpu(), expected)


@pytest.mark.parametrize(("path", "method"), [("reference", "store"), ("triton", "store"),
                                              ("triton", "recompute")])  # fmt: skip
def test_removing_one_example_is_bounded_with_every_method(path, method, request):
    """The sensitivity audit of test_sensitivity.py (adversarial examples 10⁶ over the bound)."""
    backend, device = backend_and_device(path, request)
    model, tokens, targets, scales = model_and_batch()
    everyone = list(range(6))

    def pre_noise_sums(keep):
        dp = flashdp.make_private(
            copy.deepcopy(model).to(device),
            max_grad_norm=2.0,
            noise_multiplier=0.0,
            expected_batch_size=10,
            loss_reduction="sum",
            backend=backend,
            linear_method=method,
        )
        logits = dp(tokens[keep].to(device))
        per_token = nn.functional.cross_entropy(
            logits.reshape(-1, 13), targets[keep].to(device).reshape(-1), reduction="none"
        ).view(len(keep), -1)
        (per_token.sum(1) * scales[keep].to(device)).sum().backward()
        bounds = dict(flashdp.get_controller(dp).config.layer_norms)
        return {name: p.grad.cpu() * 10 for name, p in dp.named_parameters()}, bounds

    full, bounds = pre_noise_sums(everyone)
    for removed in everyone:
        partial, _ = pre_noise_sums([i for i in everyone if i != removed])
        for name, value in full.items():
            diff = (value - partial[name]).norm()
            assert diff <= bounds[name] * SLACK, f"{name}: {diff} > C_l = {bounds[name]}"
            if removed in (1, 4):  # clipped right at the bound
                assert diff >= 0.99 * bounds[name]


def test_store_clips_a_cancelling_example_to_its_bound():
    """The Gram form's weakness (rows that nearly cancel) does not exist for stored gradients:
    the released gradient is the measured one, scaled, so its norm is ≤ C up to one rounding."""
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(64, generator=generator)
    rows = torch.stack([base, base + 1e-3 * torch.randn(64, generator=generator)])
    u = 1e6 * torch.randn(64, generator=generator)
    dp = flashdp.make_private(
        nn.Linear(64, 64, bias=False),
        max_grad_norm=1.0,
        noise_multiplier=0.0,
        expected_batch_size=1,
        loss_reduction="sum",
        backend="reference",
        linear_method="store",
    )
    out = dp(rows[None])
    (out[0, 0] @ u - out[0, 1] @ u).backward()
    assert dp.weight.grad.norm() <= 1.0 * (1 + 1e-6)


def test_unavailable_methods_are_refused_clearly():
    with pytest.raises(ValueError, match="linear_method='store' needs clipping='per_layer'"):
        flashdp.make_private(
            nn.Linear(3, 2), max_grad_norm=1.0, noise_multiplier=0.0, clipping="flat",
            linear_method="store",
        )  # fmt: skip
    with pytest.raises(ValueError, match="linear_method must be one of"):
        flashdp.make_private(
            nn.Linear(3, 2), max_grad_norm=1.0, noise_multiplier=0.0, linear_method="fast"
        )
    dp = flashdp.make_private(
        nn.Linear(3, 2),
        max_grad_norm=1.0,
        noise_multiplier=0.0,
        backend="reference",
        linear_method="recompute",
    )
    with pytest.raises(ValueError, match=r"'recompute' is not available.*available \['ghost'"):
        dp(torch.randn(4, 5, 3)).sum().backward()
