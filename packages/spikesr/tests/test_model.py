"""The network: patch matching against brute force, shapes, determinism, state, gradients,
parameter counts against the anchor's, and refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY

from spikesr.dcn import DeformableConv2d
from spikesr.model import (
    HybridDimensionAttention,
    SpikeSR,
    SpikeSRConfig,
    match_patches,
    parameter_count,
)


def match_brute_force(crops: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    """For every patch, the other patch of the same image with the largest similarity."""
    b, n = crops.shape[:2]
    out = torch.empty_like(crops)
    norm = norm.requires_grad_(False)
    for i in range(b):
        means = [norm(crops[i, j].mean(dim=(-2, -1))) for j in range(n)]
        for j in range(n):
            scores = [float(means[j] @ means[k]) if k != j else -float("inf") for k in range(n)]
            out[i, j] = crops[i, max(range(n), key=scores.__getitem__)]
    return out


def test_eval_matching_is_the_brute_force_argmax_within_each_image():
    torch.manual_seed(0)
    crops = torch.randn(3, 7, 5, 3, 3, dtype=torch.float64)  # B > 1, odd sizes
    norm = torch.nn.LayerNorm(5).double()
    torch.nn.init.normal_(norm.weight)
    got = match_patches(crops, norm, hard_gumbel=False)
    assert torch.equal(got, match_brute_force(crops, norm))


def test_training_matching_picks_one_other_patch_of_the_same_image():
    torch.manual_seed(1)
    crops = torch.randn(2, 6, 4, 3, 3, dtype=torch.float64)
    got = match_patches(crops, torch.nn.LayerNorm(4).double(), hard_gumbel=True)
    for i in range(2):
        for j in range(6):
            same = [k for k in range(6) if torch.allclose(got[i, j], crops[i, k], atol=1e-12)]
            assert len(same) == 1
            assert same[0] != j


def test_hda_matches_hand_computation():
    torch.manual_seed(2)
    config = SpikeSRConfig(width=16, time_steps=3, time_kernel=3, channel_kernel=3)
    hda = HybridDimensionAttention(config).double()
    x = torch.randn(3, 2, 16, 4, 5, dtype=torch.float64)
    m = torch.nn.functional.pad(x.mean(dim=(3, 4)).transpose(0, 1), (1, 1, 1, 1))  # (B, T+2, C+2)
    wt, wc = hda.conv_t.weight, hda.conv_c.weight  # (T, T, 3), (C, C, 3)
    t_steps, b_size, c_size = 3, 2, 16
    expected = torch.empty_like(x)
    for b in range(b_size):
        mb = m[b]  # zero-padded on both axes
        for t in range(t_steps):
            for c in range(c_size):
                # conv over the time axis's neighbours in C with T in/out channels, and over T
                # with C in/out channels, exactly as the anchor's TCJA lays them out
                along_t = sum(
                    wt[t, u, k] * mb[u + 1, c + k] for u in range(t_steps) for k in range(3)
                )
                along_c = sum(
                    wc[c, d, k] * mb[t + k, d + 1] for d in range(c_size) for k in range(3)
                )
                expected[t, b, c] = x[t, b, c] * torch.sigmoid(along_t * along_c)
    torch.testing.assert_close(hda(x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("scale", "shape"), [(2, (2, 3, 17, 23)), (4, (1, 3, 16, 30))])
def test_output_shape_any_size_and_batch(scale, shape):
    torch.manual_seed(3)
    model = SpikeSR(TINY, scale=scale).eval()
    with torch.no_grad():
        out = model(torch.rand(shape))
    assert out.shape == (shape[0], 3, scale * shape[2], scale * shape[3])
    assert torch.isfinite(out).all()


def test_each_image_of_a_batch_is_upscaled_on_its_own():
    torch.manual_seed(4)
    model = SpikeSR(TINY).eval()
    x = torch.rand(3, 3, 18, 21)
    with torch.no_grad():
        batched = model(x)
        single = torch.cat([model(x[i : i + 1]) for i in range(3)])
    # the anchor's eval matching indexes across the batch; here images never mix
    torch.testing.assert_close(batched, single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("neuron", ["lif", "spikingjelly"])
def test_two_identical_calls_give_identical_outputs(neuron):
    if neuron == "spikingjelly":
        pytest.importorskip("spikingjelly", reason="peer not installed")
    torch.manual_seed(5)
    model = SpikeSR(TINY, neuron=neuron).eval()
    x = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        first = model(x)
        model(torch.rand(2, 3, 16, 16))  # another input in between: no state may leak
        second = model(x)
    assert torch.equal(first, second)


def test_spikingjelly_neurons_give_our_lif_network():
    pytest.importorskip("spikingjelly", reason="peer not installed")
    torch.manual_seed(6)
    ours = SpikeSR(TINY).eval()
    theirs = SpikeSR(TINY, neuron="spikingjelly").eval()
    theirs.load_state_dict(ours.state_dict())
    x = torch.rand(1, 3, 16, 20)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), ours(x), rtol=1e-5, atol=1e-6)


def test_training_step_reaches_every_parameter():
    torch.manual_seed(7)
    model = SpikeSR(TINY).train()
    out = model(torch.rand(2, 3, 16, 16))
    (out - torch.rand_like(out)).abs().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


def test_ablations_remove_their_part():
    full = parameter_count(SpikeSR(TINY))
    no_hda = SpikeSR(TINY, hda=False)
    no_dsa = SpikeSR(TINY, dsa=False)
    assert parameter_count(no_hda) < full
    assert parameter_count(no_dsa) < full
    assert no_dsa.min_size == 1
    assert SpikeSR(TINY).min_size == 16
    with torch.no_grad():
        assert no_dsa.eval()(torch.rand(1, 3, 5, 7)).shape == (1, 3, 10, 14)


def test_relu_twin_has_the_same_parameters():
    assert parameter_count(SpikeSR(TINY, neuron="relu")) == parameter_count(SpikeSR(TINY))


def _dcn_parameters(width: int) -> int:
    return parameter_count(DeformableConv2d(width, width))


@pytest.mark.parametrize(
    ("width", "anchor_count"),
    [(64, 3_084_580), (56, 2_452_338), (40, 1_399_711), (32, 979_294)],
)
def test_parameter_counts_match_the_anchor_code(width, anchor_count):
    # the anchor builds a deformable conv in all three attention layers of each DSA and uses only
    # the first: its counts (its own network built at each width and counted) are ours plus two
    # unused DCNs per DSA (8 blocks)
    ours = parameter_count(SpikeSR(width=width))
    assert ours + 8 * 2 * _dcn_parameters(width) == anchor_count


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale": 3}, "scale must be one of"),
        ({"width": 8}, "width must be >= 16"),
        ({"patch_step": 20}, "patch_step must be in"),
        ({"neuron": "gelu"}, "neuron must be one of"),
        ({"time_kernel": 2}, "must be odd"),
    ],
)
def test_bad_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpikeSRConfig(**kwargs)


def test_bad_inputs_are_refused():
    model = SpikeSR(TINY).eval()
    with pytest.raises(ValueError, match="at least 16x16"):
        model(torch.rand(1, 3, 15, 40))
    with pytest.raises(ValueError, match="3 channels, got 1"):
        model(torch.rand(1, 1, 16, 16))
    with pytest.raises(ValueError, match="shape"):
        model(torch.rand(3, 16, 16))
    with pytest.raises(ValueError, match="floating-point"):
        model(torch.zeros(1, 3, 16, 16, dtype=torch.uint8))


# -- the anchor's SAB attention, written out literally (func.py GPA / Block / Match, TCJA) -------


def _anchor_patch_divide(x, step, ps):
    _, _, h, w = x.shape
    crops = []
    for i in range(0, h + step - ps, step):
        top, down = (h - ps, h) if i + ps > h else (i, i + ps)
        for j in range(0, w + step - ps, step):
            left, right = (w - ps, w) if j + ps > w else (j, j + ps)
            crops.append(x[:, :, top:down, left:right])
    return torch.stack(crops, dim=1)


def _anchor_patch_reverse(crops, x, step, ps):
    _, _, h, w = x.shape
    out, index = torch.zeros_like(x), 0
    for i in range(0, h + step - ps, step):
        top, down = (h - ps, h) if i + ps > h else (i, i + ps)
        for j in range(0, w + step - ps, step):
            left, right = (w - ps, w) if j + ps > w else (j, j + ps)
            out[:, :, top:down, left:right] += crops[:, index]
            index += 1
    for i in range(step, h + step - ps, step):
        top = h - ps if i + ps > h else i
        out[:, :, top : i + ps - step, :] /= 2
    for j in range(step, w + step - ps, step):
        left = w - ps if j + ps > w else j
        out[:, :, :, left : j + ps - step] /= 2
    return out


def _anchor_gpa(x, dsa):
    """GPA.forward in eval mode with B = 1, our DSA's weights, the anchor's operations."""
    ps, step = 16, 14
    crops = _anchor_patch_divide(x, step, ps)
    b, n, c, h, w = crops.shape
    q = dsa.match_norm(crops.mean(dim=(-2, -1)))
    attn = q @ q.transpose(-1, -2) * c**-0.5 - 100 * torch.eye(n)
    y = crops.flatten(0, 1)[attn.argmax(-1).flatten()].view(b, n, c, h, w)
    tokens = crops.flatten(3).flatten(0, 1).transpose(1, 2)  # (b n) (h w) c
    y = y.flatten(3).flatten(0, 1).transpose(1, 2)
    for i, (norm1, layer, norm2, ffn) in enumerate(dsa.layers):
        normed = norm1(tokens)  # PreNorm: only x is normed, the support is not
        if i == 0:
            image = normed.transpose(1, 2).reshape(-1, c, 16, 16)
            deformed = layer.dcn(image).flatten(2).transpose(1, 2)
            qq, kk, vv = layer.to_q(deformed), layer.to_k(y), layer.to_v(y)
        else:
            qq, kk, vv = layer.to_q(normed), layer.to_k(normed), layer.to_v(normed)
        weights = (qq @ kk.transpose(-1, -2) * layer.scale).softmax(-1)
        tokens = weights @ vv + tokens
        tokens = ffn(norm2(tokens)) + tokens
    crops = tokens.transpose(1, 2).reshape(b, n, c, h, w)
    return x + dsa.mid_conv(_anchor_patch_reverse(crops, x, step, ps))


def _anchor_sab(x_tb, sab):
    """Spiking_Residual_Block.forward (with TCJA) on ``(T, B, C, H, W)``."""
    shortcut = x_tb.clone()
    out = sab.residual(x_tb) + sab.shortcut(x_tb)
    x_seq = out.transpose(0, 1)  # B T C H W
    m = x_seq.mean(dim=[3, 4])
    att = torch.sigmoid(sab.hda.conv_c(m.permute(0, 2, 1)).permute(0, 2, 1) * sab.hda.conv_t(m))
    y1 = x_seq * att[:, :, :, None, None]
    y2 = torch.stack([_anchor_gpa(x_seq[:, t], sab.dsa) for t in range(x_seq.shape[1])], dim=1)
    return F.gelu(y1 + y2).transpose(0, 1) + shortcut


@pytest.mark.parametrize("size", [(32, 32), (16, 44)])
def test_spiking_attention_block_equals_the_anchors_wiring(size):
    from spikesr.model import SpikingAttentionBlock

    torch.manual_seed(8)
    config = SpikeSRConfig(width=16, time_steps=3)
    sab = SpikingAttentionBlock(config).eval()
    for module in sab.modules():  # non-trivial weights everywhere, the DCN's offsets included
        for p in module.parameters(recurse=False):
            torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(3, 1, 16, *size)
    with torch.no_grad():
        torch.testing.assert_close(sab(x), _anchor_sab(x, sab), rtol=1e-4, atol=1e-5)
