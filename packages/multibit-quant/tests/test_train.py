"""Training schedules, distillation reuse, coreset costs, gradient alignment, evaluation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from multibit_quant import (
    ImageData,
    TrainConfig,
    evaluate,
    gradient_alignment,
    quantize,
    train_multibit,
)
from multibit_quant.train import _flip_where, _step_plan


def blobs(n: int = 96, seed: int = 0) -> ImageData:
    """A learnable 3-class image task: each class lights one third of an 8x8 image."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    images = torch.randn(n, 1, 8, 8, generator=generator) * 0.5
    for c in range(3):
        images[labels == c, :, :, c * 2 : c * 2 + 3] += 1.5
    return ImageData(images, labels, ("a", "b", "c"))


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
        nn.Conv2d(6, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 64, 3),
    )  # fmt: skip


def test_step_plans():
    generator = torch.Generator().manual_seed(0)
    assert _step_plan((2, 4, 8), "all", 2, generator) == [[8, 4, 2], [8, 4, 2]]
    assert _step_plan((2, 4, 8), "round_robin", 4, generator) == [[8], [4], [2], [8]]
    sampled = _step_plan((2, 4, 8), "sampled", 300, generator)
    counts = {b: sum(step == [b] for step in sampled) for b in (2, 4, 8)}
    assert all(70 < c < 130 for c in counts.values()), counts  # 100 ± 3 standard deviations


def test_flips_mirror_the_chosen_images_on_their_device():
    images = torch.arange(2 * 3 * 2 * 4, dtype=torch.float32).reshape(2, 3, 2, 4)
    flips = torch.tensor([True, False])
    flipped = _flip_where(images, flips)
    torch.testing.assert_close(flipped[0], images[0, :, :, [3, 2, 1, 0]], rtol=0, atol=0)
    torch.testing.assert_close(flipped[1], images[1], rtol=0, atol=0)
    # images on an accelerator, flips from the CPU generator (meta stands in for the device)
    on_device = _flip_where(images.to("meta"), flips)
    assert on_device.device.type == "meta"
    assert on_device.shape == images.shape


def test_training_learns_and_evaluates_every_bit_width():
    data = blobs()
    model = quantize(net(), bits=[2, 4, 8])
    before = evaluate(model, data, [2, 4, 8])
    result = train_multibit(
        model, data, TrainConfig(epochs=6, batch_size=16, lr=1e-2), progress=False
    )
    after = evaluate(model, data, [2, 3, 4, 8])
    assert all(after[b] >= 0.9 for b in (2, 3, 4, 8)), after  # 3 bits: never trained
    assert max(before.values()) < 0.7
    assert all(result.losses[b][-1] < result.losses[b][0] for b in (2, 4, 8))
    assert result.trained_examples == {2: 6 * 96, 4: 6 * 96, 8: 6 * 96}
    assert result.steps == 6 * math.ceil(96 / 16)


def test_coreset_costs_a_fraction_plus_the_scoring_passes():
    data = blobs()
    model = quantize(net(), bits=[2, 8])
    config = TrainConfig(epochs=4, batch_size=16, coreset=0.25, resample_every=2)
    result = train_multibit(model, data, config, progress=False)
    assert result.trained_examples == {2: 4 * 24, 8: 4 * 24}  # ceil(0.25 · 96) per epoch
    assert result.scored_examples == 1 * 2 * 96  # re-selected before epoch 2 only, both bits
    assert result.steps == 4 * 2


def test_recursive_distillation_reuses_the_teacher_on_shared_batches():
    data = blobs(48)
    model = quantize(net(), bits=[2, 4, 8])
    shared = train_multibit(
        model, data, TrainConfig(epochs=1, batch_size=16, distill="recursive"), progress=False
    )
    assert shared.teacher_examples == 0
    model = quantize(net(), bits=[2, 4, 8])
    separate = train_multibit(
        model, data, TrainConfig(epochs=1, batch_size=16, distill="highest", coreset=0.5),
        progress=False,
    )  # fmt: skip
    assert separate.teacher_examples == 2 * 24  # bits 4 and 2 each on their own 24 examples


def test_training_is_seeded():
    data = blobs(48)
    states = []
    for _ in range(2):
        model = quantize(net(), bits=[2, 8])
        config = TrainConfig(epochs=2, batch_size=16, schedule="sampled", coreset=0.5)
        train_multibit(model, data, config, progress=False)
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_gradient_alignment_equals_the_angle_computed_here():
    data = blobs(32)
    model = quantize(net(), bits=[2, 8])
    running = model.model[1].running_mean.clone()
    angles = gradient_alignment(model, data, (2, 8), batches=1, batch_size=32, seed=5)
    assert torch.equal(model.model[1].running_mean, running)  # restored
    index = torch.randint(32, (32,), generator=torch.Generator().manual_seed(5))
    x, y = data.images[index], data.labels[index]
    weights = [layer.weight for layer in model.quant_layers()]
    grads = []
    model.train()
    for bits in (2, 8):
        with model.bits_as(bits):
            loss = F.cross_entropy(model(x), y)
        grads.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, weights)]))
    cosine = (grads[0] @ grads[1]) / (grads[0].norm() * grads[1].norm())
    assert angles[(2, 8)] == pytest.approx(math.degrees(math.acos(float(cosine))), abs=1e-3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epochs": 0}, "epochs must be a positive integer"),
        ({"batch_size": -5}, "batch_size"),
        ({"lr": math.nan}, "lr must be a finite number"),
        ({"lr": 0}, "lr must be a finite number"),
        ({"schedule": "cyclic"}, "schedule must be one of"),
        ({"distill": "soft"}, "distill must be one of"),
        ({"coreset": 1.5}, "coreset fraction"),
        ({"coreset_score": "loss"}, "coreset_score must be one of"),
        ({"resample_every": 0}, "resample_every"),
    ],
)
def test_bad_train_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_bad_data():
    with pytest.raises(ValueError, match="must match"):
        ImageData(torch.zeros(3, 1, 4, 4), torch.zeros(2, dtype=torch.long), ("a",))
    with pytest.raises(ValueError, match="empty"):
        ImageData(torch.zeros(0, 1, 4, 4), torch.zeros(0, dtype=torch.long), ("a",))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        ImageData(torch.zeros(3, 4, 4), torch.zeros(3, dtype=torch.long), ("a",))


def test_teacher_passes_leave_the_batchnorm_statistics_alone():
    from multibit_quant.train import _running_stats_kept

    model = quantize(net(), bits=[2, 8])
    model.train()
    norm = model.model[1]
    before = (norm.running_mean.clone(), norm.running_var.clone(), int(norm.num_batches_tracked))
    with torch.no_grad(), _running_stats_kept(model):
        model(blobs(16).images)
    after = (norm.running_mean, norm.running_var, int(norm.num_batches_tracked))
    assert torch.equal(before[0], after[0])
    assert torch.equal(before[1], after[1])
    assert before[2] == after[2]


def test_forgetting_scores_come_from_training_presentations():
    data = blobs(48)
    model = quantize(net(), bits=[2, 8])
    config = TrainConfig(epochs=3, batch_size=16, coreset=0.5, coreset_score="forgetting")
    result = train_multibit(model, data, config, progress=False)
    assert result.scored_examples == 0  # no scoring pass: the training steps' predictions
