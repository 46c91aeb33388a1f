"""The baselines against the dense ViT (where they must agree) and against brute force."""

from __future__ import annotations

import pytest
import torch
from helpers import random_vit

from lookwhere.baselines import (
    DenseClassifier,
    EViTClassifier,
    LowResClassifier,
    RandomTokenClassifier,
    ToMeClassifier,
    bipartite_merge,
    evit_locations,
    tome_tokens,
)
from lookwhere.vit import ViT, ViTConfig

ATOL = 1e-5  # float32, same operations in another order
CONFIG = ViTConfig(dim=32, depth=4, heads=4, patch_size=4, image_size=32, layer_scale=0.5)


def _vit(seed: int = 0) -> ViT:
    return random_vit(CONFIG, seed)


def _dense_and(cls, *args):
    vit = _vit()
    dense = DenseClassifier(vit, 3).eval()
    other = cls(vit, 3, *args).eval()
    other.head.load_state_dict(dense.head.state_dict())
    return dense, other


def test_tome_without_merges_and_evit_keeping_everything_are_the_dense_vit():
    images = torch.rand(2, 3, 32, 32)
    for cls, arg in ((ToMeClassifier, 0), (EViTClassifier, 1.0)):
        dense, other = _dense_and(cls, arg)
        with torch.no_grad():
            assert torch.allclose(other(images), dense(images), atol=ATOL)


def test_random_tokens_with_every_token_is_the_dense_vit():
    dense, other = _dense_and(RandomTokenClassifier, 64)
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(other(images), dense(images), atol=ATOL)


def _merge_brute_force(metric, tokens, size, r):
    """One image: each even token's best odd partner by cosine; the r best edges move."""
    metric = metric / metric.norm(dim=-1, keepdim=True)
    even, odd = list(range(0, len(tokens), 2)), list(range(1, len(tokens), 2))
    best = {}
    for i in even:
        scores = [float(metric[i] @ metric[j]) for j in odd]
        best[i] = (max(scores), odd[scores.index(max(scores))])
    moved = sorted(even, key=lambda i: -best[i][0])[:r]
    total = {j: tokens[j] * size[j] for j in odd}
    count = {j: size[j].clone() for j in odd}
    for i in moved:
        total[best[i][1]] = total[best[i][1]] + tokens[i] * size[i]
        count[best[i][1]] = count[best[i][1]] + size[i]
    kept = [i for i in sorted(even, key=lambda i: -best[i][0]) if i not in moved]
    out = [tokens[i] for i in kept] + [total[j] / count[j] for j in odd]
    sizes = [size[i] for i in kept] + [count[j] for j in odd]
    return torch.stack(out), torch.stack(sizes)


def test_bipartite_merge_matches_brute_force():
    torch.manual_seed(0)
    metric = torch.randn(2, 9, 5, dtype=torch.float64)
    tokens = torch.randn(2, 9, 3, dtype=torch.float64)
    size = torch.randint(1, 4, (2, 9, 1)).double()
    merged, merged_size = bipartite_merge(metric, tokens, size, 3)
    for b in range(2):
        expect, expect_size = _merge_brute_force(metric[b], tokens[b], size[b], 3)
        assert torch.allclose(merged[b], expect, atol=1e-12)
        assert torch.equal(merged_size[b], expect_size)
    # the sizes still count every original patch
    assert torch.equal(merged_size.sum(1), size.sum(1))


def test_tome_token_counts():
    assert tome_tokens(64, 4, 10) == [64, 54, 44, 34]
    assert tome_tokens(8, 4, 10) == [8, 4, 2, 1]


def test_evit_keeps_the_most_attended_tokens_and_fuses_the_rest():
    _, evit = _dense_and(EViTClassifier, 0.5, [1])
    captured = {}
    block = evit.vit.blocks[2]
    block.register_forward_pre_hook(lambda _m, args: captured.setdefault("x", args[0]))
    with torch.no_grad():
        evit(torch.rand(1, 3, 32, 32))
    assert captured["x"].shape[1] == 5 + 32 + 1  # prefix, half of 64 patches, one fused token


def test_evit_locations_follow_the_paper():
    assert evit_locations(12) == [3, 6, 9]
    assert evit_locations(4) == [1, 2, 3]


def test_low_res_classifier_resizes_position_embeddings():
    vit = _vit()
    low = LowResClassifier(vit, 3, 16)
    assert low.vit.pos_embed.shape == (1, 16, 32)
    with torch.no_grad():
        assert low(torch.rand(2, 3, 32, 32)).shape == (2, 3)
    with pytest.raises(ValueError, match="multiple of the patch"):
        LowResClassifier(vit, 3, 18)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda vit: EViTClassifier(vit, 3, 0.0), "keep_rate"),
        (lambda vit: ToMeClassifier(vit, 3, -1), "r must be"),
        (lambda vit: RandomTokenClassifier(vit, 3, 65), r"\[1, 64\]"),
    ],
)
def test_bad_settings_are_refused(build, message):
    with pytest.raises(ValueError, match=message):
        build(_vit())


def _explicit_attention(block, x, bias=None):
    """One block's attention half with an explicit softmax; returns x, probabilities, keys."""
    attn = block.attn
    h = block.norm1(x)
    q, k, v = attn.qkv(h).reshape(x.shape[0], x.shape[1], 3, attn.heads, -1).unbind(2)
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) * attn.head_dim**-0.5
    if bias is not None:
        logits = logits + bias[:, None, None, :]
    probs = logits.softmax(-1)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(x.shape)
    return x + block.ls1(attn.proj(out)), probs, k


def _mlp(block, x):
    return x + block.ls2(block.fc2(torch.nn.functional.gelu(block.fc1(block.norm2(x)))))


def test_evit_matches_an_explicit_implementation():
    _, evit = _dense_and(EViTClassifier, 0.6)
    vit = evit.vit
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        logits = evit(images)
        expect = []
        for image in images:
            x = torch.cat([vit.prefix(1), vit.embed(image[None])], 1)
            for index, block in enumerate(vit.blocks):
                if index not in evit.locations:
                    x, _ = block(x)
                    continue
                x, probs, _ = _explicit_attention(block, x)
                attention = probs[0, :, 0, 5:].mean(0).tolist()  # CLS -> each non-prefix token
                ranked = sorted(range(len(attention)), key=lambda i: -attention[i])
                keep = -(-len(ranked) * 6 // 10)  # ceil(0.6 n)
                tokens = x[0, 5:]
                fused = sum(attention[i] * tokens[i] for i in ranked[keep:])
                x = torch.cat([x[:, :5], tokens[ranked[:keep]][None], fused[None, None]], 1)
                x = _mlp(block, x)
            expect.append(evit.head(vit.norm(x)[0, 0]))
    assert torch.allclose(logits, torch.stack(expect), atol=ATOL)


def test_tome_matches_an_explicit_implementation():
    _, tome = _dense_and(ToMeClassifier, 7)
    vit = tome.vit
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        logits = tome(images)
        expect = []
        for image in images:
            x = torch.cat([vit.prefix(1), vit.embed(image[None])], 1)
            size = torch.ones(x.shape[1], 1)
            for block in vit.blocks:
                # proportional attention: log(size) added to every key's logit
                x, _, k = _explicit_attention(block, x, size[:, 0].log()[None])
                metric = k[0].mean(1)[5:]  # keys, mean over heads, patch tokens
                patches, patch_size = _merge_brute_force(metric, x[0, 5:], size[5:], 7)
                x = torch.cat([x[:, :5], patches[None]], 1)
                size = torch.cat([size[:5], patch_size])
                x = _mlp(block, x)
            expect.append(tome.head(vit.norm(x)[0, 0]))
    assert torch.allclose(logits, torch.stack(expect), atol=ATOL)
