"""The ViT, selector, extractor and LookWhere model against brute force and the dense ViT."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import random_vit

from lookwhere.model import (
    LookWhere,
    gather_tokens,
    idw_upsample,
    lookwhere_from_teacher,
    scatter_tokens,
    topk_indices,
)
from lookwhere.vit import ViT, ViTConfig, resize_pos_embed

# float32 on the same ops in another order: differences are rounding, ~1e-6 at these widths
ATOL = 1e-5

CONFIG = ViTConfig(dim=32, depth=3, heads=4, patch_size=4, image_size=32, layer_scale=0.5)


def _vit(config: ViTConfig = CONFIG, seed: int = 0) -> ViT:
    return random_vit(config, seed)


def _model(k: int = 8, dense: bool = False) -> LookWhere:
    teacher = _vit()
    model = lookwhere_from_teacher(
        teacher, selector_depth=2, selector_size=16, num_classes=5, k=k, dense=dense
    )
    return model.eval()


def test_extractor_with_every_token_is_the_dense_vit():
    teacher = _vit()
    model = lookwhere_from_teacher(teacher, selector_depth=1, selector_size=16, k=64)
    images = torch.rand(3, 3, 32, 32)
    everything = torch.randperm(64).expand(3, -1)  # any order: attention is permutation-equivariant
    prefix = teacher.prefix(3)
    with torch.no_grad():
        ours = model.extractor(images, prefix, everything)
        dense = teacher(images)
    assert torch.allclose(ours.cls, dense.cls, atol=ATOL)
    assert torch.allclose(ours.patches, dense.patches[:, everything[0]], atol=ATOL)


def test_gather_and_scatter_match_indexing():
    tokens = torch.randn(4, 10, 3)
    indices = torch.stack([torch.randperm(10)[:6] for _ in range(4)])
    gathered = gather_tokens(tokens, indices)
    for b in range(4):
        for j in range(6):
            assert torch.equal(gathered[b, j], tokens[b, indices[b, j]])
    grid = scatter_tokens(gathered, indices, 10)
    for b in range(4):
        for n in range(10):
            expect = tokens[b, n] if n in indices[b].tolist() else torch.zeros(3)
            assert torch.equal(grid[b, n], expect)


def _idw_direct(values, indices, grid, valid=None, neighbours=5):
    """Loops: every cell, the `neighbours` nearest kept (valid) tokens by (distance, kept order)."""
    batch, kept = indices.shape
    out = torch.zeros(batch, grid * grid, values.shape[-1], dtype=torch.float64)
    for b in range(batch):
        slots = [j for j in range(kept) if valid is None or bool(valid[b, j])]
        for cell in range(grid * grid):
            r, c = divmod(cell, grid)
            dist = []
            for j in slots:
                kr, kc = divmod(int(indices[b, j]), grid)
                dist.append((math.hypot(r - kr, c - kc), j))
            near = sorted(dist)[: min(neighbours, len(slots))]
            weights = torch.tensor([1 / (d + 1e-8) for d, _ in near], dtype=torch.float64)
            weights /= weights.sum()
            for w, (_, j) in zip(weights, near, strict=True):
                out[b, cell] += w * values[b, j].double()
    return out


def test_idw_upsampling_matches_a_direct_computation():
    torch.manual_seed(1)
    grid, kept = 6, 9
    indices = torch.stack([torch.randperm(grid * grid)[:kept] for _ in range(2)])
    values = torch.randn(2, kept, 4, dtype=torch.float64)
    ours = idw_upsample(values, indices, grid)
    assert torch.allclose(ours, _idw_direct(values, indices, grid), atol=1e-12)
    # a kept cell is its own token (weight 1/1e-8 against <= 1 for the others)
    for b in range(2):
        assert torch.allclose(ours[b, indices[b]], values[b], atol=1e-6)


def test_idw_upsampling_skips_hidden_slots():
    torch.manual_seed(2)
    grid, kept = 5, 8
    indices = torch.stack([torch.randperm(grid * grid)[:kept] for _ in range(3)])
    values = torch.randn(3, kept, 2, dtype=torch.float64)
    valid = torch.arange(kept).expand(3, -1) < torch.tensor([[3], [8], [1]])
    ours = idw_upsample(values, indices, grid, valid=valid)
    assert torch.allclose(ours, _idw_direct(values, indices, grid, valid), atol=1e-12)


def test_idw_refuses_an_image_without_visible_tokens():
    valid = torch.tensor([[True, False], [False, False]])
    with pytest.raises(ValueError, match="at least one valid"):
        idw_upsample(torch.randn(2, 2, 3), torch.tensor([[0, 1], [2, 3]]), 4, valid=valid)


@pytest.mark.parametrize(
    ("values", "indices", "neighbours", "message"),
    [
        (torch.randn(1, 6, 2), torch.tensor([[0, 5, 10]]), 5, r"one token per index \(1, 3\)"),
        (torch.randn(1, 2, 2), torch.tensor([[0, 5, 10]]), 5, r"one token per index \(1, 3\)"),
        (torch.randn(1, 3, 2), torch.tensor([[0, 99, 5]]), 5, r"\[0, 16\)"),
        (torch.randn(1, 3, 2), torch.tensor([[0, -7, 5]]), 5, r"\[0, 16\)"),
        (torch.randn(1, 3, 2), torch.tensor([[0.0, 5.0, 10.0]]), 5, "int64"),
        (torch.randn(1, 3, 2), torch.tensor([[0, 5, 10]]), 0, "neighbours must be an int >= 1"),
        (torch.randn(1, 3, 2), torch.tensor([[0, 5, 10]]), -2, "neighbours must be an int >= 1"),
        (torch.randn(3, 2), torch.tensor([[0, 5, 10]]), 5, r"\(B, k, D\)"),
    ],
)
def test_idw_refuses_bad_values_indices_and_neighbours(values, indices, neighbours, message):
    with pytest.raises(ValueError, match=message):
        idw_upsample(values, indices, 4, neighbours=neighbours)


def test_hidden_slots_are_the_same_as_running_on_fewer_tokens():
    model = _model()
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        selected = model.selector(images)
        indices = topk_indices(selected.saliency, 12)
        valid = (torch.arange(12) < 5).expand(2, -1)
        masked = model.extractor(images, selected.prefix, indices, valid)
        short = model.extractor(images, selected.prefix, indices[:, :5])
    assert torch.allclose(masked.cls, short.cls, atol=ATOL)
    assert torch.allclose(masked.patches[:, :5], short.patches, atol=ATOL)


def test_topk_is_the_most_salient_first():
    saliency = torch.tensor([[0.1, 0.9, 0.5, 0.7], [3.0, 1.0, 2.0, 0.0]])
    assert topk_indices(saliency, 3).tolist() == [[1, 3, 2], [0, 2, 1]]


def test_selector_map_is_the_head_subgrid_resized():
    model = _model()
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        out = model.selector(images)
        low = torch.nn.functional.interpolate(
            images, size=(16, 16), mode="bilinear", antialias=True
        )
        patches = model.selector.vit(low).patches  # (2, 16, D): a 4x4 low grid
        logits = model.selector.head(patches)  # subgrid s = ceil(8 / 4) = 2
    assert model.selector.subgrid == 2
    # cell (r, c) of the 8x8 map is sub-cell (r % 2, c % 2) of low patch (r // 2, c // 2)
    for r in range(8):
        for c in range(8):
            expect = logits[:, (r // 2) * 4 + c // 2, (r % 2) * 2 + c % 2]
            assert torch.allclose(out.saliency[:, r * 8 + c], expect, atol=ATOL)
    assert out.prefix.shape == (2, 5, 32)


def test_selector_starts_from_the_teachers_first_blocks():
    teacher = _vit()
    model = lookwhere_from_teacher(teacher, selector_depth=2, selector_size=32, k=4)
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        tokens = torch.cat([teacher.prefix(2), teacher.embed(images)], 1)
        expect = teacher.run_blocks(tokens, 5, depth=2)
        ours = model.selector.vit(images)
    assert torch.allclose(ours.patches, expect.patches, atol=ATOL)


def test_classification_reads_cls_and_dense_prediction_fills_the_grid():
    images = torch.rand(2, 3, 32, 32)
    model, dense_model = _model(k=10), _model(k=10, dense=True)
    with torch.no_grad():
        out, dense = model(images), dense_model(images)
        selected = dense_model.selector(images)
        kept = dense_model.extractor(images, selected.prefix, dense.indices)
        filled = idw_upsample(kept.patches, dense.indices, 8)  # (2, 64, D)
        expect = dense_model.head(filled).transpose(1, 2).reshape(2, 5, 8, 8)
        own = dense_model.head(kept.patches[0, 0])
    assert out.logits.shape == (2, 5)
    assert out.indices.shape == (2, 10)
    assert torch.allclose(out.logits, model.head(out.features.cls), atol=ATOL)
    assert torch.allclose(dense.logits, expect, atol=ATOL)
    # a kept patch's prediction is its own token's (IDW weight 1 / 1e-8 on itself)
    r, c = divmod(int(dense.indices[0, 0]), 8)
    assert torch.allclose(dense.logits[0, :, r, c], own, atol=1e-4)


def test_resize_pos_embed_is_identity_at_its_own_grid_and_bicubic_elsewhere():
    pos = torch.randn(1, 16, 6)
    assert resize_pos_embed(pos, (4, 4)) is pos
    image = pos.reshape(1, 4, 4, 6).permute(0, 3, 1, 2)
    expect = torch.nn.functional.interpolate(image, size=(6, 6), mode="bicubic")
    assert torch.allclose(
        resize_pos_embed(pos, (6, 6)), expect.permute(0, 2, 3, 1).reshape(1, 36, 6)
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m(torch.rand(1, 3, 32, 32), k=65), r"k = 65 must be in \[1, 64\]"),
        (lambda m: m(torch.rand(1, 3, 32, 32), k=0), r"k = 0"),
        (lambda m: m.extractor(torch.rand(1, 3, 30, 30), torch.zeros(1, 5, 32), None), "30x30"),
        (lambda m: m(torch.rand(1, 1, 32, 32)), "1 channels"),
        (lambda m: m(torch.rand(3, 32, 32)), r"\(B, C, H, W\)"),
        (lambda m: m.extractor(torch.rand(1, 3, 64, 64), torch.zeros(1, 5, 32), None), "32x32"),
    ],
)
def test_bad_input_is_refused_clearly(call, message):
    with pytest.raises(ValueError, match=message):
        call(_model())


def test_config_refuses_an_image_size_that_is_not_a_multiple_of_the_patch():
    with pytest.raises(ValueError, match="not a multiple of patch_size"):
        ViTConfig(patch_size=7, image_size=30)
    with pytest.raises(ValueError, match="not a multiple of heads"):
        ViTConfig(dim=30, heads=4)


def test_selector_and_extractor_widths_must_agree():
    teacher = _vit()
    other = _vit(CONFIG.replace(dim=16, heads=2))
    model = lookwhere_from_teacher(teacher, selector_depth=1, selector_size=16, k=4)
    from lookwhere.model import Extractor

    with pytest.raises(ValueError, match="width"):
        LookWhere(model.selector, Extractor(other), 3, 4)


def test_idw_upsampling_in_bfloat16_is_off_only_by_the_values_rounding():
    """Distances are computed in float32 from integer coordinates: only the values' own bf16
    rounding remains (relative 2^-8 per operand)."""
    torch.manual_seed(4)
    grid, kept = 37, 128
    indices = torch.stack([torch.randperm(grid * grid)[:kept] for _ in range(2)])
    values = torch.randn(2, kept, 8)
    ours = idw_upsample(values.bfloat16(), indices, grid).double()
    expect = idw_upsample(values.double(), indices, grid)
    assert torch.allclose(ours, expect, atol=0.05)
    for b in range(2):  # a kept cell is its own token, to bf16 rounding
        assert torch.allclose(ours[b, indices[b]], values[b].bfloat16().double(), atol=1e-2)


def test_downsample_of_16_bit_images_is_the_float32_resize_rounded():
    from lookwhere.vit import downsample

    images = torch.rand(2, 3, 32, 32).bfloat16()
    expect = torch.nn.functional.interpolate(
        images.float(), size=(12, 12), mode="bilinear", antialias=True
    ).bfloat16()
    assert torch.equal(downsample(images, 12), expect)
    assert downsample(images.double(), 12).dtype == torch.float64


@pytest.mark.parametrize("dense", [False, True])
def test_bfloat16_forward_is_the_float32_forward_to_bf16_rounding(dense):
    """bf16 rounds each operand to relative 2^-8 (0.4%); through the ~30 rounded operations in
    sequence of a 2-block selector and a 3-block extractor this model's relative error measured
    0.35-2.5% over five weight seeds, so 5% is twice the worst (a wrong resize or wrong tokens
    is off by order 1). k = every patch: rounding cannot change which tokens are kept."""
    model = lookwhere_from_teacher(
        _vit(), selector_depth=2, selector_size=16, num_classes=5, k=64, dense=dense
    ).eval()
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        expect = model(images)
        out = model.to(torch.bfloat16)(images.bfloat16())
    for ours, ref in ((out.logits, expect.logits), (out.saliency, expect.saliency)):
        assert ours.dtype == torch.bfloat16
        assert float((ours.float() - ref).norm() / ref.norm()) < 0.05


def test_selector_map_resized_when_the_subgrid_overshoots():
    """The paper's geometry: 11x11 low patches, s = ceil(37 / 11) = 4, 44x44 resized to 37x37."""
    torch.manual_seed(0)
    vit = ViT(ViTConfig(dim=16, depth=1, heads=2, patch_size=2, image_size=22)).eval()
    from lookwhere.model import Selector

    selector = Selector(vit, high_grid=37).eval()
    assert selector.subgrid == 4
    images = torch.rand(2, 3, 74, 74)
    with torch.no_grad():
        out = selector(images).saliency
        low = torch.nn.functional.interpolate(
            images, size=(22, 22), mode="bilinear", antialias=True
        )
        logits = selector.head(vit(low).patches)  # (2, 121, 16)
        grid = torch.empty(2, 1, 44, 44)
        for h in range(11):
            for w in range(11):
                for i in range(4):
                    for j in range(4):
                        grid[:, 0, h * 4 + i, w * 4 + j] = logits[:, h * 11 + w, i * 4 + j]
        expect = torch.nn.functional.interpolate(
            grid, size=(37, 37), mode="bilinear", antialias=True
        ).flatten(1)
    assert torch.allclose(out, expect, atol=ATOL)


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        (torch.tensor([[0, 64]]), r"\[0, 64\)"),
        (torch.tensor([[0.0, 1.0]]), "int64"),
        (torch.tensor([0, 1]), r"\(B, k\)"),
    ],
)
def test_extractor_refuses_bad_indices(indices, message):
    model = _model()
    with pytest.raises(ValueError, match=message):
        model.extractor(torch.rand(1, 3, 32, 32), torch.zeros(1, 5, 32), indices)


@pytest.mark.parametrize(
    ("valid", "message"),
    [
        ((torch.arange(6) < 3).float().expand(1, -1), "bool mask"),  # would be an additive bias
        ((torch.arange(6) < 3).long().expand(1, -1), "bool mask"),
        (torch.ones(1, 4, dtype=torch.bool), r"\(1, 6\) mask like indices, got \(1, 4\)"),
    ],
)
def test_extractor_refuses_a_valid_mask_that_is_not_bool_like_indices(valid, message):
    model = _model()
    with pytest.raises(ValueError, match=message):
        model.extractor(
            torch.rand(1, 3, 32, 32), torch.zeros(1, 5, 32), torch.arange(6)[None], valid
        )


def test_extractor_refuses_a_prefix_of_another_batch():
    model = _model()
    with pytest.raises(ValueError, match="prefix must be"):
        model.extractor(torch.rand(2, 3, 32, 32), torch.zeros(1, 5, 32), torch.zeros(2, 3).long())


def test_copies_of_a_frozen_teacher_are_trainable():
    from lookwhere.model import extractor_from_teacher

    teacher = _vit().requires_grad_(False)
    extractor = extractor_from_teacher(teacher)
    assert all(p.requires_grad for p in extractor.parameters())
    assert not any(p.requires_grad for p in teacher.parameters())


def test_k_accepts_numpy_integers():
    import numpy as np

    model = _model()
    with torch.no_grad():
        assert model(torch.rand(1, 3, 32, 32), k=np.int64(3)).indices.shape == (1, 3)


def test_selector_prefix_is_its_normed_cls_then_registers():
    model = _model()
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        out = model.selector(images)
        low = torch.nn.functional.interpolate(
            images, size=(16, 16), mode="bilinear", antialias=True
        )
        tokens = torch.cat([model.selector.vit.prefix(2), model.selector.vit.embed(low)], 1)
        for block in model.selector.vit.blocks:
            tokens, _ = block(tokens)
        normed = model.selector.vit.norm(tokens)
    assert torch.allclose(out.prefix, normed[:, :5], atol=ATOL)  # CLS, then the 4 registers
