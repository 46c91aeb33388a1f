"""The benchmark protocol: every method fine-tunes all its weights from the same teacher, which
stays untouched; token counts and the claims on hand-made operating points."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import random_vit

from lookwhere.baselines import DenseClassifier, EViTClassifier, ToMeClassifier, tome_tokens
from lookwhere.data import ImageTask
from lookwhere.evaluate import OperatingPoint
from lookwhere.experiment import MethodSettings, evit_tokens, run_task
from lookwhere.reproduce import FULL, QUICK, _cheapest_equal, _claims, _summary, dominance_gap
from lookwhere.train import TrainConfig
from lookwhere.vit import ViTConfig

CONFIG = ViTConfig(dim=16, depth=4, heads=2, patch_size=8, image_size=32)


def _task(count: int, seed: int) -> ImageTask:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, 3, 32, 32), generator=generator, dtype=torch.uint8)
    labels = torch.randint(0, 3, (count,), generator=generator)
    boxes = torch.tensor([[4, 4, 12, 12]]).expand(count, -1).clone()
    return ImageTask(images, labels, boxes, ("a", "b", "c"), "sparse")


def test_every_method_trains_its_whole_backbone_and_the_teacher_stays():
    teacher = DenseClassifier(random_vit(CONFIG), 3).eval()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    short = TrainConfig(steps=2, batch_size=4, lr=1e-2)
    settings = MethodSettings(
        selector_size=16, pretrain=short, finetune=short, k_range=(2, 8), ks=(4, 8),
        low_sizes=(16,), evit_rates=(0.5, 0.8), tome_rs=(2, 4), time_batch=2,
    )  # fmt: skip
    result = run_task(teacher, _task(8, 0), _task(6, 1), settings)
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert all(p.requires_grad for p in teacher.parameters())
    assert set(result.models) == {"lookwhere", "dense", "low-res 16px", "random", "evit", "tome"}
    for name, model in result.models.items():
        vit = model.extractor.vit if name == "lookwhere" else model.vit
        for block, original in zip(vit.blocks, teacher.vit.blocks, strict=True):
            assert not torch.equal(block.fc1.weight, original.fc1.weight), name
    assert {p.method for p in result.points} == {
        "lookwhere", "dense", "low-res", "random", "evit", "tome"
    }  # fmt: skip


def _count_last_block_tokens(model, images, **kwargs) -> int:
    seen = []

    def record(_module, args):  # every path through a block runs its norm1 first
        seen.append(args[0].shape[1])

    hook = model.vit.blocks[-1].norm1.register_forward_pre_hook(record)
    with torch.no_grad():
        model(images, **kwargs)
    hook.remove()
    return seen[0] - model.vit.config.num_prefix


@pytest.mark.parametrize("rate", [0.3, 0.5, 0.85])
def test_evit_token_count_is_what_enters_its_last_block(rate):
    evit = EViTClassifier(random_vit(CONFIG.replace(depth=6)), 3, rate)
    assert evit.locations == [1, 3, 4]
    counted = _count_last_block_tokens(evit, torch.rand(1, 3, 32, 32))
    assert counted == evit_tokens(16, rate, evit.locations, 6)


@pytest.mark.parametrize("r", [1, 3, 6])
def test_tome_token_count_is_what_enters_its_last_block(r):
    tome = ToMeClassifier(random_vit(CONFIG), 3, r)
    counted = _count_last_block_tokens(tome, torch.rand(1, 3, 32, 32))
    assert counted == tome_tokens(16, 4, r)[-1]


def _point(method, accuracy, gflops, ms, setting="x"):
    return OperatingPoint(method, setting, accuracy, gflops, ms, tokens=1)


def test_cheapest_equal_and_dominance_on_hand_made_points():
    points = [
        _point("dense", 0.80, 1.0, 10.0),
        _point("lookwhere", 0.795, 0.3, 4.0, "k=8"),  # within 1 point: counts
        _point("lookwhere", 0.78, 0.1, 2.0, "k=4"),  # 2 points worse: does not
        _point("lookwhere", 0.82, 0.5, 5.0, "k=16"),
        _point("tome", 0.81, 0.25, 3.0),  # cheaper than k=8 and more accurate
    ]
    assert _cheapest_equal(points, "gflops").setting == "k=8"
    assert _cheapest_equal(points, "ms_per_image").setting == "k=8"
    # k=4 has no cheaper baseline; k=8 is beaten by 1.5 points, k=16 by none (-1)
    assert dominance_gap(points) == pytest.approx(0.015)
    assert math.isnan(
        dominance_gap([_point("lookwhere", 0.5, 0.1, 1.0), _point("tome", 0.9, 1, 1)])
    )


def test_claims_fail_when_no_lookwhere_point_matches_dense():
    sparse = [_point("dense", 0.8, 1.0, 10.0), _point("lookwhere", 0.7, 0.2, 3.0),
              _point("low-res", 0.6, 0.1, 1.0)]  # fmt: skip
    global_ = [_point("dense", 0.8, 1.0, 10.0), _point("lookwhere", 0.79, 0.5, 5.0)]

    class Result:
        def __init__(self, points):
            self.points = points

    claims = {c.name: c for c in _claims({"sparse": Result(sparse), "global": Result(global_)})}
    assert claims["sparse: FLOPs saved at equal accuracy"].measured == 0.0
    assert not claims["sparse: FLOPs saved at equal accuracy"].passed
    # the one cheaper baseline point (low-res) is 10 points worse: LookWhere is not dominated
    assert claims["sparse: no cheaper baseline is more accurate"].passed
    assert claims["sparse: no cheaper baseline is more accurate"].measured == pytest.approx(-10)
    assert claims["global: best accuracy vs dense"].passed  # -1 point: matches
    assert claims["global: time saved at equal accuracy"].measured == pytest.approx(2.0)


@pytest.mark.parametrize(("settings", "expect"), [(QUICK, "1.5"), (FULL, "1.1")])
def test_summary_states_the_standard_error_of_its_own_run(settings, expect):
    """100 sqrt(p (1 - p) / n) at the dense ViT's 62.2%: 1.53 points over 1,000 test images,
    1.08 over 2,000 (by hand)."""
    from types import SimpleNamespace

    points = [
        OperatingPoint("dense", "all", 0.622, 0.1, 1.0, 144),
        OperatingPoint("lookwhere", "k=24", 0.62, 0.03, 0.4, 24),
    ]
    timings = {"teachers_s": 1, "sparse_s": 1, "global_s": 1}
    summary = _summary({"sparse": SimpleNamespace(points=points)}, settings, timings)
    assert f"{settings.test_images} test images: a standard error of {expect} points" in summary
