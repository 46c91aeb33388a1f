"""Counted FLOPs against the closed form."""

from __future__ import annotations

import pytest
import torch

from lookwhere.baselines import DenseClassifier
from lookwhere.flops import (
    block_flops,
    count_flops,
    dense_flops,
    lookwhere_flops,
    measure_time,
    patch_embed_flops,
)
from lookwhere.model import lookwhere_from_teacher
from lookwhere.vit import ViT, ViTConfig

CONFIG = ViTConfig(dim=32, depth=3, heads=4, patch_size=4, image_size=32)


def test_block_closed_form_by_hand():
    # 10 tokens, dim 8, hidden 32: QKV 10*8*24, proj 10*8*8, MLP 2*10*8*32 MACs; QK^T and AV
    # 2*10*10*8 MACs; 2 FLOPs per MAC
    config = ViTConfig(dim=8, heads=2, patch_size=4, image_size=16)
    macs = 10 * 8 * 24 + 10 * 8 * 8 + 2 * 10 * 8 * 32 + 2 * 10 * 10 * 8
    assert block_flops(10, config) == 2 * macs
    assert patch_embed_flops(config) == 2 * 16 * 8 * 3 * 16


def test_dense_vit_counter_equals_closed_form():
    model = DenseClassifier(ViT(CONFIG), 10).eval()
    images = torch.rand(1, 3, 32, 32)
    assert count_flops(lambda: model(images)) == dense_flops(CONFIG, 10)


@pytest.mark.parametrize("k", [1, 9, 64])
def test_lookwhere_counter_equals_closed_form(k):
    model = lookwhere_from_teacher(
        ViT(CONFIG), selector_depth=2, selector_size=16, num_classes=7, k=k
    ).eval()
    images = torch.rand(1, 3, 32, 32)
    counted = count_flops(lambda: model(images))
    selector = CONFIG.replace(depth=2, image_size=16)
    assert counted == lookwhere_flops(selector, CONFIG, k, model.selector.subgrid, 7)


def test_fewer_tokens_cost_fewer_flops():
    assert lookwhere_flops(CONFIG.replace(depth=1, image_size=16), CONFIG, 8, 2, 10) < dense_flops(
        CONFIG, 10
    )


def test_measure_time_is_positive_and_checks_counts():
    assert measure_time(lambda: torch.ones(4).sum(), warmup=0, repeat=2) > 0
    with pytest.raises(ValueError, match="repeat"):
        measure_time(lambda: None, repeat=0)
