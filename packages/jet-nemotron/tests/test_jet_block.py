"""The JetBlock against a from-scratch composition of its parts, its decode and padding paths,
and the dynamic-convolution initialisation that lets every weight learn."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from jet_nemotron.modules.dynamic_conv import DynamicShortConvolution
from jet_nemotron.modules.jet_block import JetBlock, JetBlockConfig
from jet_nemotron.ops.gated_delta import naive_recurrent_gated_delta_rule

CONFIG = JetBlockConfig(num_heads=2, head_dim=16, expand_v=1.5, chunk_size=16)
HIDDEN = 32


def _block(config: JetBlockConfig = CONFIG, seed: int = 0) -> JetBlock:
    torch.manual_seed(seed)
    block = JetBlock(HIDDEN, config, layer_idx=0)
    # a generator that is not at its (static) initial point, so the dynamic path is exercised
    torch.nn.init.normal_(block.dynamic_conv1d.kernel_generator.w2.weight, std=0.05)
    return block.double()


def _composed(block: JetBlock, x: torch.Tensor) -> torch.Tensor:
    """The block's equations written out: an explicit conv loop and the float64 recurrence."""
    cfg = block.config
    H, Dk, Dv, W = cfg.num_heads, cfg.head_dim, cfg.head_v_dim, cfg.conv_size
    B, T, _ = x.shape
    gen = block.dynamic_conv1d.kernel_generator
    kernels = (F.silu(x @ gen.w1.weight.T) @ gen.w2.weight.T + gen.w2.bias).view(B, T, -1, W)
    v_in = x @ block.v_proj.weight.T
    conv = torch.zeros_like(v_in)
    for t in range(T):
        for w in range(W):
            source = t - W + 1 + w
            if source >= 0:
                conv[:, t] += v_in[:, source] * kernels[:, t, :, w]
    q = F.silu(x @ block.q_proj.weight.T).view(B, T, H, Dk)
    k = F.silu(x @ block.k_proj.weight.T).view(B, T, H, Dk)
    q, k = (y / (y.square().sum(-1, keepdim=True) + 1e-6).sqrt() for y in (q, k))
    v = F.silu(conv).view(B, T, H, Dv)
    beta = torch.sigmoid(x @ block.b_proj.weight.T)
    g = -block.A_log.exp() * F.softplus(x @ block.a_proj.weight.T + block.dt_bias)
    o, _ = naive_recurrent_gated_delta_rule(q, k, v, g, beta)
    gate = (x @ block.g_proj.weight.T).view(B, T, H, Dv)
    normed = o / (o.square().mean(-1, keepdim=True) + cfg.norm_eps).sqrt() * block.o_norm.weight
    return (normed * F.silu(gate)).reshape(B, T, -1) @ block.o_proj.weight.T


@pytest.mark.parametrize("training", [True, False], ids=["chunk", "recurrent"])
def test_block_equals_its_equations(training):
    block = _block().train(training)
    x = torch.randn(2, 21, HIDDEN, dtype=torch.float64)
    actual, _ = block(x)
    torch.testing.assert_close(actual, _composed(block, x), rtol=1e-10, atol=1e-12)


def test_decode_after_prefill_equals_one_pass():
    block = _block().eval().float()
    x = torch.randn(2, 90, HIDDEN)
    whole, final = block(x, use_cache=True)  # 90 > 64: the chunked form
    prefix, state = block(x[:, :70], use_cache=True)
    steps = [prefix]
    for t in range(70, 90):  # one token at a time: the fused recurrent form and the conv step
        y, state = block(x[:, t : t + 1], state=state, use_cache=True)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 1), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.recurrent, final.recurrent, rtol=1e-5, atol=1e-5)
    # the conv state holds W_v x: one token's matmul may round differently from the whole batch's
    torch.testing.assert_close(state.conv, final.conv, rtol=1e-6, atol=1e-6)


def test_left_padding_leaves_rows_unchanged():
    block = _block().eval()
    x = torch.randn(2, 12, HIDDEN, dtype=torch.float64)
    alone, state = block(x, use_cache=True)
    padded = torch.cat([torch.randn(2, 5, HIDDEN, dtype=torch.float64), x], 1)
    mask = torch.cat([torch.zeros(2, 5), torch.ones(2, 12)], 1).long()
    out, padded_state = block(padded, attention_mask=mask, use_cache=True)
    torch.testing.assert_close(out[:, 5:], alone, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(padded_state.recurrent, state.recurrent, rtol=1e-10, atol=1e-12)


def test_every_weight_learns():
    """Both generator weights zero (the reference block's init) never move; ours all do."""
    x, target = torch.randn(2, 10, HIDDEN), torch.randn(2, 10, HIDDEN)

    def grads_after_one_step(conv: DynamicShortConvolution) -> dict[str, torch.Tensor]:
        optimizer = torch.optim.SGD(conv.parameters(), lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            y, _ = conv(x @ torch.ones(HIDDEN, HIDDEN) / HIDDEN, x)
            F.mse_loss(y, target).backward()
            optimizer.step()
        return {name: p.grad for name, p in conv.named_parameters()}

    torch.manual_seed(0)
    ours = DynamicShortConvolution(HIDDEN, generator_input_size=HIDDEN)
    assert torch.equal(
        ours.kernel_generator.w2.weight, torch.zeros_like(ours.kernel_generator.w2.weight)
    )
    assert all(grad.abs().sum() > 0 for grad in grads_after_one_step(ours).values())

    torch.manual_seed(0)
    both_zero = DynamicShortConvolution(HIDDEN, generator_input_size=HIDDEN)
    torch.nn.init.zeros_(both_zero.kernel_generator.w1.weight)
    grads = grads_after_one_step(both_zero)
    assert torch.equal(
        grads["kernel_generator.w1.weight"], torch.zeros_like(grads["kernel_generator.w1.weight"])
    )
    assert torch.equal(
        grads["kernel_generator.w2.weight"], torch.zeros_like(grads["kernel_generator.w2.weight"])
    )


def test_block_starts_as_a_static_convolution():
    """With the second generator weight at zero, every token gets the same kernel (the bias)."""
    torch.manual_seed(0)
    conv = DynamicShortConvolution(16, generator_input_size=8)
    kernels = conv.kernels(torch.randn(3, 5, 8))
    torch.testing.assert_close(
        kernels, conv.kernel_generator.w2.bias.view(16, 4).expand_as(kernels)
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"expand_v": 1.3, "head_dim": 16}, "expand_v"),
        ({"mode": "parallel"}, "mode must be one of"),
        ({"chunk_size": 128}, "chunk_size must be one of"),
        ({"num_heads": 0}, "positive integer"),
        ({"conv_size": 1}, r"conv_size must be in \[2, 8\]"),
    ],
)
def test_bad_config_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        JetBlockConfig(**fields)


def test_bad_hidden_states_are_refused():
    block = _block()
    with pytest.raises(ValueError, match="hidden_states must be"):
        block(torch.randn(2, 3, HIDDEN + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="attention_mask must be"):
        block(torch.randn(2, 3, HIDDEN, dtype=torch.float64), attention_mask=torch.ones(2, 4))
