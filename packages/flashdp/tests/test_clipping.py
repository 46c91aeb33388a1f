"""With noise 0, the released gradients equal a brute-force per-example computation.

The oracle: torch.func.vmap over examples of the gradient of each example's loss through the
original (non-private) model, clipped explicitly (per parameter to C_l, or as a whole to C),
summed and divided by B. Tolerance: float32 with 1e-5 relative to the largest entry (sums of a
few hundred products reordered between the two computations; observed errors are ~1e-7).
"""

from __future__ import annotations

import copy

import pytest
import torch
from oracle import assert_matches, brute_force
from torch import nn

import flashdp
from flashdp import reference


def sum_mse(out, y):
    return (out - y).square().sum()


class Conv1DNet(nn.Module):
    """Two transformers GPT-2 Conv1D layers around a tanh."""

    def __init__(self, d_in, d_hidden, d_out):
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.a, self.b = Conv1D(d_hidden, d_in), Conv1D(d_out, d_hidden)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def make_case(kind, seq, generator):
    """(model, inputs, targets) of one supported layer type; ``seq`` = extra leading dims."""
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=generator)))
    batch = 5
    if kind == "linear":
        model = nn.Sequential(nn.Linear(7, 9), nn.Tanh(), nn.Linear(9, 4, bias=False))
        x = torch.randn(batch, *seq, 7, generator=generator)
        y = torch.randn(batch, *seq, 4, generator=generator)
    elif kind == "conv1d":
        model = Conv1DNet(7, 9, 4)
        x = torch.randn(batch, *seq, 7, generator=generator)
        y = torch.randn(batch, *seq, 4, generator=generator)
    elif kind == "embedding":
        model = nn.Sequential(nn.Embedding(11, 6, padding_idx=0), nn.Tanh())
        x = torch.randint(0, 11, (batch, *seq), generator=generator)
        y = torch.randn(batch, *seq, 6, generator=generator)
    elif kind == "rmsnorm":  # default eps (machine epsilon) and an explicit one
        model = nn.Sequential(nn.RMSNorm(6), nn.Tanh(), nn.RMSNorm((6,), eps=1e-3))
        x = 3 * torch.randn(batch, *seq, 6, generator=generator) + 1
        y = torch.randn(batch, *seq, 6, generator=generator)
    elif kind == "layernorm":
        model = nn.Sequential(nn.LayerNorm(6), nn.Tanh(), nn.LayerNorm((6,), bias=False))
        x = 3 * torch.randn(batch, *seq, 6, generator=generator) + 1
        y = torch.randn(batch, *seq, 6, generator=generator)
    else:
        raise AssertionError(kind)
    # scale up so that some examples are clipped and some are not
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0).add_(0.1 * torch.randn(p.shape, generator=generator))
    return model, x, y


KINDS = ["linear", "conv1d", "embedding", "layernorm", "rmsnorm"]
SEQS = [(), (3,), (2, 3)]


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
@pytest.mark.parametrize("seq", SEQS, ids=lambda s: f"seq{len(s)}")
@pytest.mark.parametrize("kind", KINDS)
def test_layer_matches_brute_force(kind, seq, clipping):
    model, x, y = make_case(kind, seq, torch.Generator().manual_seed(len(seq)))
    expected = brute_force(model, sum_mse, x, y, clipping, max_grad_norm=1.5)
    private = flashdp.make_private(
        copy.deepcopy(model),
        max_grad_norm=1.5,
        noise_multiplier=0.0,
        clipping=clipping,
        loss_reduction="sum",
        backend="reference",
    )
    sum_mse(private(x), y).backward()
    assert_matches(private, expected)


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
def test_mean_reduction_matches_sum(clipping):
    """The documented contract: backward on the batch mean gives the same release as on the sum."""
    model, x, y = make_case("linear", (3,), torch.Generator().manual_seed(7))
    expected = brute_force(model, sum_mse, x, y, clipping, max_grad_norm=1.0)
    private = flashdp.make_private(
        model, max_grad_norm=1.0, noise_multiplier=0.0, clipping=clipping, backend="reference"
    )
    (sum_mse(private(x), y) / x.shape[0]).backward()
    assert_matches(private, expected)


def test_explicit_layer_norms():
    model, x, y = make_case("linear", (), torch.Generator().manual_seed(3))
    bounds = {"0.weight": 0.3, "0.bias": 0.05, "2.weight": 0.5}
    expected = brute_force(model, sum_mse, x, y, "per_layer", 1.0, layer_norms=bounds)
    private = flashdp.make_private(
        model,
        max_grad_norm=1.0,
        noise_multiplier=0.0,
        layer_norms=bounds,
        loss_reduction="sum",
        backend="reference",
    )
    sum_mse(private(x), y).backward()
    assert_matches(private, expected)


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=32,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="eager",  # vmap of the oracle has no batching rule for CPU SDPA
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()  # eval: no dropout, deterministic


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
def test_gpt2_matches_brute_force(clipping):
    """A whole GPT-2 (Conv1D, Embedding, LayerNorm, Linear head), untied, positions per example."""
    model = tiny_gpt2()
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 32, (3, 8), generator=generator)

    class Wrapper(nn.Module):
        def __init__(self, gpt):
            super().__init__()
            self.gpt = gpt

        def forward(self, ids):
            pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
            return self.gpt(input_ids=ids, position_ids=pos).logits

    def token_loss(logits, ids):
        return nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, 32), ids[:, 1:].reshape(-1), reduction="sum"
        )

    expected = brute_force(Wrapper(model), token_loss, tokens, tokens, clipping, 1.0)
    private = flashdp.make_private(
        Wrapper(copy.deepcopy(model)),
        max_grad_norm=1.0,
        noise_multiplier=0.0,
        clipping=clipping,
        loss_reduction="sum",
        backend="reference",
    )
    token_loss(private(tokens), tokens).backward()
    assert_matches(private, expected)


@pytest.mark.parametrize(
    ("tokens", "d_in", "d_out"),
    [(1, 5, 3), (4, 3, 2), (4, 16, 16)],
    ids=["rank-one", "blockwise", "gram"],
)
def test_linear_norm2_paths(tokens, d_in, d_out):
    """Each exact method of the reference norm equals the norm of the materialised gradient."""
    generator = torch.Generator().manual_seed(tokens)
    x = torch.randn(6, tokens, d_in, generator=generator)
    g = torch.randn(6, tokens, d_out, generator=generator)
    explicit = torch.einsum("bto,bti->boi", g, x).square().sum((1, 2))
    torch.testing.assert_close(reference.linear_weight_norm2(x, g), explicit, rtol=1e-5, atol=0)


def test_blockwise_chunks(monkeypatch):
    """Chunked materialisation gives the same norms as one chunk."""
    generator = torch.Generator().manual_seed(0)
    x, g = torch.randn(5, 4, 3, generator=generator), torch.randn(5, 4, 2, generator=generator)
    whole = reference.linear_weight_norm2(x, g)
    monkeypatch.setattr(reference, "MAX_CHUNK_ELEMENTS", 12)  # two examples per chunk
    torch.testing.assert_close(reference.linear_weight_norm2(x, g), whole, rtol=1e-6, atol=0)


def test_autocast_bfloat16_matches_float32():
    """Under CPU autocast the matmuls run in bfloat16 while the weights stay float32."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, 3))
    x = torch.randn(5, 4, 6)
    grads = {}
    for precision in ("float32", "bfloat16"):
        private = flashdp.make_private(
            copy.deepcopy(model), max_grad_norm=1.0, noise_multiplier=0.0, backend="reference"
        )
        inputs = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            out = private(inputs)
        out.float().square().mean().backward()
        assert inputs.grad.dtype == torch.float32
        grads[precision] = {k: p.grad for k, p in private.named_parameters()}
    for name, value in grads["float32"].items():
        # bfloat16 keeps 8 bits of mantissa: rounding 2⁻⁸ = 0.4% per operand, a few operands
        # per entry (observed ≤ 0.6% of the largest entry)
        error = (grads["bfloat16"][name] - value).abs().max()
        assert error <= 0.02 * value.abs().max(), name


@pytest.mark.parametrize("eps", [None, 1e-3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_norm_layers_match_stock_autograd(dtype, eps):
    """16-bit LayerNorm and RMSNorm (RMSNorm's eps=None is float32's machine epsilon, as in
    F.rms_norm) with a bound no example reaches: the input gradient and the released weight
    gradient equal autograd through the stock layer on the same values. Small activations
    (rms 0.02) make a wrong eps visible. Tolerance: a few 16-bit ulps (rtol 1.6e-2) of the
    largest entry, both sides rounding once to the 16-bit output."""
    generator = torch.Generator().manual_seed(0)
    for stock in (nn.RMSNorm(16, eps=eps), nn.LayerNorm(16, eps=eps or 1e-5)):
        with torch.no_grad():
            stock.weight.add_(0.1 * torch.randn(16, generator=generator))
        stock = stock.to(dtype)
        x = (0.02 * torch.randn(4, 5, 16, generator=generator)).to(dtype)
        grad = torch.randn(4, 5, 16, generator=generator).to(dtype)
        private = flashdp.make_private(
            copy.deepcopy(stock),
            max_grad_norm=1e6,
            noise_multiplier=0.0,
            loss_reduction="sum",
            expected_batch_size=1,
            backend="reference",
        )
        grads = []
        for layer in (stock, private):
            x_ = x.clone().requires_grad_()
            layer(x_).backward(grad)
            grads.append((x_.grad.float(), layer.weight.grad.float()))
        for expected, got in zip(grads[0], grads[1], strict=True):
            scale = expected.abs().max()
            torch.testing.assert_close(got, expected, rtol=0, atol=1.6e-2 * scale)
