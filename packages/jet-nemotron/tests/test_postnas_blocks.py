"""The gated linear attention ops against their float64 recurrence and FLA's naive functions, and
the PostNAS candidate blocks against their equations written out token by token, their decode
and padding paths, their state size and their input checks."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from jet_nemotron.ops.gated_linear import chunk_gla, fused_recurrent_gla, naive_recurrent_gla
from jet_nemotron.postnas.blocks import (
    LINEAR_BLOCKS,
    LinearBlockState,
    ShortConvolution,
    build_linear_block,
    state_numel,
)

# float32 op against the float64 oracle: float32 rounding (1.2e-7) accumulated over at most 75
# steps and 100-wide dot products stays near 1e-5 of the tensor's scale; 1e-4 leaves margin while
# an indexing or decay error (order 1) fails at once.
FP32_RTOL = 1e-4
# a float64 block against its float64 equations: only the summation order differs
FP64_TOL = {"rtol": 1e-9, "atol": 1e-11}


def _gla_inputs(
    B: int, T: int, H: int, K: int, V: int, decay: str, strength: str, state: bool, seed: int
) -> dict[str, torch.Tensor]:
    """FLA's test distributions in float64 then cast to float32: q, v normal, k L2-normalised,
    ``g`` per key dim, per head or constant per head; ``strong`` decays (about -5.7 per token)
    would overflow any ``exp(-Σg)`` factor in float32 within one chunk of 16."""
    gen = torch.Generator().manual_seed(seed)
    shape = {"key": (B, T, H, K), "head": (B, T, H), "const": (H,)}[decay]
    logits = torch.randn(shape, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(logits) - 5 if strength == "strong" else F.logsigmoid(logits) / 16
    inputs = {
        "q": torch.randn(B, T, H, K, generator=gen, dtype=torch.float64),
        "k": F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1),
        "v": torch.randn(B, T, H, V, generator=gen, dtype=torch.float64),
        "g": g,
    }
    if state:
        inputs["initial_state"] = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)
    return {name: x.float().requires_grad_() for name, x in inputs.items()}


def _as_float64(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: x.detach().double().requires_grad_() for name, x in inputs.items()}


OP_CASES = [
    # (B, T, K, V, chunk, decay, strength, initial state)
    (1, 1, 60, 100, 16, "key", "weak", True),
    (2, 20, 32, 16, 16, "key", "strong", False),
    (1, 63, 60, 100, 64, "key", "strong", True),
    (2, 75, 32, 16, 64, "key", "weak", True),
    (1, 75, 60, 100, 16, "head", "strong", True),
    (2, 63, 32, 16, 64, "head", "weak", False),
    (1, 20, 60, 100, 64, "const", "weak", True),
    (2, 75, 32, 16, 16, "const", "strong", False),
]


@pytest.mark.parametrize(("B", "T", "K", "V", "chunk", "decay", "strength", "state"), OP_CASES)
def test_ops_match_float64_recurrence(
    B, T, K, V, chunk, decay, strength, state, run_with_grads, all_close
):
    inputs = _gla_inputs(B, T, 2, K, V, decay, strength, state, seed=T + K)
    expected = run_with_grads(naive_recurrent_gla, _as_float64(inputs))
    actual = run_with_grads(chunk_gla, inputs, chunk_size=chunk)
    all_close(actual, expected, FP32_RTOL)
    all_close(run_with_grads(fused_recurrent_gla, inputs), expected, FP32_RTOL)


def _fla(module: str, name: str):
    """A function of FLA's naive torch references (its import warns about Triton on CPU)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fla = pytest.importorskip(module)
    return getattr(fla, name)


def test_naive_matches_fla_naive_gla():
    fla_naive = _fla("fla.ops.gla.naive", "naive_recurrent_gla")
    inputs = {
        n: x.detach() for n, x in _gla_inputs(2, 20, 3, 60, 100, "key", "weak", True, 5).items()
    }
    o_fla, S_fla = fla_naive(
        inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["initial_state"], True
    )
    o, S = chunk_gla(**inputs, output_final_state=True, chunk_size=16)
    torch.testing.assert_close(o, o_fla, rtol=FP32_RTOL, atol=FP32_RTOL)
    torch.testing.assert_close(S, S_fla, rtol=FP32_RTOL, atol=FP32_RTOL)


def test_constant_decay_matches_fla_naive_retention():
    fla_retention = _fla("fla.ops.retention.naive", "naive_retention")
    H = 4
    inputs = _gla_inputs(2, 75, H, 32, 16, "key", "weak", False, 6)
    q, k, v = (inputs[n].detach() for n in ("q", "k", "v"))
    expected = fla_retention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    log_gamma = torch.log1p(-(2.0 ** (-5.0 - torch.arange(H, dtype=torch.float32))))
    o, _ = chunk_gla(q, k, v, log_gamma, chunk_size=64)
    torch.testing.assert_close(o, expected, rtol=FP32_RTOL, atol=FP32_RTOL)


# ---------------------------------------------------------------- blocks

HIDDEN, HEADS, HEAD_DIM, HEAD_V_DIM = 24, 2, 6, 10


def _block(name: str, seed: int = 0) -> torch.nn.Module:
    """A float64 candidate whose every parameter is moved off its initial value (so gates, conv
    biases, norm weights and ``D`` all matter)."""
    torch.manual_seed(seed)
    block = build_linear_block(
        name, HIDDEN, HEADS, HEAD_DIM, head_v_dim=HEAD_V_DIM, layer_idx=0, initializer_range=0.2
    ).double()
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return block


def _linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    out = x @ layer.weight.T
    return out if layer.bias is None else out + layer.bias


def _conv_silu(x: torch.Tensor, conv: ShortConvolution) -> torch.Tensor:
    """``SiLU(Σ_w weight[:, w] x_{t-W+1+w} + bias)`` by an explicit loop."""
    weight, W = conv.weight[:, 0], conv.weight.shape[-1]
    y = torch.zeros_like(x) + (0 if conv.bias is None else conv.bias)
    for t in range(x.shape[1]):
        for w in range(W):
            if t - W + 1 + w >= 0:
                y[:, t] = y[:, t] + weight[:, w] * x[:, t - W + 1 + w]
    return F.silu(y)


def _equations(name: str, block, x: torch.Tensor) -> torch.Tensor:
    """The candidate's output from its equations: project, gate, loop over tokens."""
    B, T, _ = x.shape
    H, K, V = HEADS, HEAD_DIM, HEAD_V_DIM
    q, k, v = (_linear(x, block.q_proj), _linear(x, block.k_proj), _linear(x, block.v_proj))
    if name in ("mamba2", "gated_deltanet"):
        q, k, v = _conv_silu(torch.cat([q, k, v], -1), block.conv1d).split(
            [H * K, H * K, H * V], -1
        )
        dt = F.softplus(_linear(x, block.a_proj) + block.dt_bias)
        alpha = torch.exp(-block.A_log.exp() * dt)  # (B, T, H)
    q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, H, V)
    if name == "gla":
        low_rank = _linear(_linear(x, block.gk_proj[0]), block.gk_proj[1])
        alpha = torch.exp(F.logsigmoid(low_rank) / 16).view(B, T, H, K)
    elif name == "retnet":
        alpha = torch.tensor([1 - 2 ** (-5 - h) for h in range(H)], dtype=x.dtype).expand(B, T, H)
    elif name == "gated_deltanet":
        q, k = (y / (y.square().sum(-1, keepdim=True) + 1e-6).sqrt() for y in (q, k))
        beta = torch.sigmoid(_linear(x, block.b_proj))
    S = x.new_zeros(B, H, K, V)
    o = x.new_zeros(B, T, H, V)
    for t in range(T):
        decay = alpha[:, t, :, :, None] if name == "gla" else alpha[:, t, :, None, None]
        S = decay * S
        if name == "gated_deltanet":
            error = v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S)
            S = S + beta[:, t, :, None, None] * k[:, t, :, :, None] * error[:, :, None]
        else:
            write = v[:, t] * dt[:, t, :, None] if name == "mamba2" else v[:, t]
            S = S + k[:, t, :, :, None] * write[:, :, None]
        scale = 1.0 if name == "mamba2" else K**-0.5
        o[:, t] = scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    if name == "mamba2":
        o = o + block.D[:, None] * v
    gate = _linear(x, block.g_proj).view(B, T, H, V)
    eps = block.o_norm.eps
    normed = o / (o.square().mean(-1, keepdim=True) + eps).sqrt() * block.o_norm.weight
    return _linear((normed * F.silu(gate)).reshape(B, T, H * V), block.o_proj)


@pytest.mark.parametrize("training", [True, False], ids=["chunk", "recurrent"])
@pytest.mark.parametrize("name", ["gla", "retnet", "mamba2", "gated_deltanet"])
def test_block_equals_its_equations(name, training):
    """Chunked over 70 tokens (two chunks even at the default 64) and recurrent over 21 (under
    the recurrent threshold). The JetBlock has its own equations test in test_jet_block.py."""
    block = _block(name).train(training)
    x = torch.randn(2, 70 if training else 21, HIDDEN, dtype=torch.float64)
    actual, _ = block(x)
    torch.testing.assert_close(actual, _equations(name, block, x), **FP64_TOL)


def _states_close(actual, expected) -> None:
    for a, e in zip(actual, expected, strict=True):
        if e is None:
            assert a is None
        else:
            torch.testing.assert_close(a, e, **FP64_TOL)


@pytest.mark.parametrize("name", LINEAR_BLOCKS)
def test_prefill_then_decode_equals_one_pass(name):
    """70 tokens in one pass (chunked: over the recurrent threshold) against 66 chunked tokens
    then 4 recurrent single-token steps, each from the state before it."""
    block = _block(name).eval()
    x = torch.randn(2, 70, HIDDEN, dtype=torch.float64)
    full, full_state = block(x, use_cache=True)
    outputs, state = [], None
    for start, stop in ((0, 66), (66, 67), (67, 68), (68, 69), (69, 70)):
        out, state = block(x[:, start:stop], state=state, use_cache=True)
        outputs.append(out)
    torch.testing.assert_close(torch.cat(outputs, dim=1), full, **FP64_TOL)
    _states_close(state, full_state)


@pytest.mark.parametrize("training", [True, False], ids=["chunk", "recurrent"])
@pytest.mark.parametrize("name", LINEAR_BLOCKS)
def test_left_padding_equals_unpadded(name, training):
    block = _block(name).train(training)
    x = torch.randn(1, 9, HIDDEN, dtype=torch.float64)
    padded = torch.cat([100 * torch.randn(1, 3, HIDDEN, dtype=torch.float64), x], dim=1)
    mask = torch.tensor([[0, 0, 0] + [1] * 9])
    expected, expected_state = block(x, use_cache=True)
    actual, state = block(padded, attention_mask=mask, use_cache=True)
    torch.testing.assert_close(actual[:, 3:], expected, **FP64_TOL)
    _states_close(state, expected_state)


@pytest.mark.parametrize("training", [True, False], ids=["chunk", "recurrent"])
@pytest.mark.parametrize("name", LINEAR_BLOCKS)
def test_padding_leaves_the_recurrent_state_untouched(name, training):
    """Padded tokens after a prefix neither write to nor decay the recurrent state (the conv
    window, as the JetBlock's, moves on over zero inputs)."""
    block = _block(name).train(training)
    _, state = block(torch.randn(2, 5, HIDDEN, dtype=torch.float64), use_cache=True)
    padding = 100 * torch.randn(2, 4, HIDDEN, dtype=torch.float64)
    _, after = block(padding, torch.zeros(2, 4), state=state, use_cache=True)
    torch.testing.assert_close(after.recurrent, state.recurrent, rtol=0, atol=0)


@pytest.mark.parametrize("name", LINEAR_BLOCKS)
def test_state_numel_counts_the_carried_state(name):
    block = _block(name).eval()
    _, state = block(torch.randn(3, 5, HIDDEN, dtype=torch.float64), use_cache=True)
    carried = sum(s.numel() for s in state if s is not None) // 3
    assert state_numel(block) == carried
    assert (block.num_heads, block.head_dim, block.head_v_dim) == (HEADS, HEAD_DIM, HEAD_V_DIM)
    for proj, shape in (("q_proj", (12, 24)), ("k_proj", (12, 24)), ("v_proj", (20, 24)),
                        ("o_proj", (24, 20))):  # fmt: skip
        layer = getattr(block, proj)
        assert layer.bias is None
        assert tuple(layer.weight.shape) == shape


def test_linear_weights_follow_initializer_range():
    torch.manual_seed(0)
    block = build_linear_block("gla", 256, 4, 64, initializer_range=0.05)
    assert math.isclose(block.q_proj.weight.std().item(), 0.05, rel_tol=0.02)
    assert torch.equal(block.gk_proj[1].bias, torch.zeros(256))


# ---------------------------------------------------------------- bad input


def test_op_input_errors():
    q = torch.randn(1, 5, 2, 8)
    v = torch.randn(1, 5, 2, 4)
    with pytest.raises(ValueError, match=r"g must be \(B, T, H, K\)"):
        chunk_gla(q, q, v, torch.zeros(1, 5, 8))
    with pytest.raises(ValueError, match="chunk_size must be one of"):
        chunk_gla(q, q, v, torch.zeros(2), chunk_size=8)
    with pytest.raises(ValueError, match="q and k must both be"):
        fused_recurrent_gla(q, q[..., :4], v, torch.zeros(2))
    with pytest.raises(ValueError, match=r"v must be \(B, T, H, V\)"):
        naive_recurrent_gla(q, q, v[:, :4], torch.zeros(2))
    with pytest.raises(TypeError, match="must be float32, float16"):
        chunk_gla(q, q, v.long(), torch.zeros(2))
    with pytest.raises(TypeError, match="share one dtype"):
        chunk_gla(q, q, v.double(), torch.zeros(2))
    with pytest.raises(ValueError, match=r"initial_state must be \(B, H, K, V\)"):
        chunk_gla(q, q, v, torch.zeros(2), initial_state=torch.zeros(1, 2, 4, 8))
    with pytest.raises(ValueError, match="scale must be positive"):
        chunk_gla(q, q, v, torch.zeros(2), scale=-1.0)


def test_block_input_errors():
    with pytest.raises(ValueError, match="allowed: jet, gated_deltanet, gla, retnet, mamba2"):
        build_linear_block("mamba3", 24, 2, 6)
    with pytest.raises(ValueError, match="head_dim must be a positive integer"):
        build_linear_block("jet", 24, 2, 0)
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        build_linear_block("retnet", 24, 2.0, 6)
    block = _block("mamba2")
    x = torch.randn(2, 4, HIDDEN, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"hidden_states must be \(B, T, 24\)"):
        block(torch.randn(2, 4, 23, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"attention_mask must be \(B, T\)"):
        block(x, attention_mask=torch.ones(2, 5))
    with pytest.raises(TypeError, match="LinearBlockState"):
        block(x, state=torch.zeros(2, 2, 6, 10))
    _, state = block(x, use_cache=True)
    with pytest.raises(ValueError, match=r"conv state must be \(B, channels, conv_size\)"):
        block(x, state=LinearBlockState(state.recurrent, state.conv[..., :3]))
    with pytest.raises(TypeError, match="build_linear_block"):
        state_numel(torch.nn.Linear(2, 2))
