"""The distillation loss against hand computation, the pre-training step, fine-tuning."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from helpers import random_vit

from lookwhere.model import idw_upsample, lookwhere_from_teacher, topk_indices
from lookwhere.pretrain import (
    distillation_loss,
    distillation_step,
    kl_teacher_selector,
    pretrain,
    teacher_outputs,
)
from lookwhere.train import TrainConfig, warmup_cosine
from lookwhere.vit import ViT, ViTConfig

CONFIG = ViTConfig(dim=16, depth=2, heads=2, patch_size=4, image_size=16, layer_scale=0.5)


def _teacher(seed: int = 0) -> ViT:
    return random_vit(CONFIG, seed)


def test_kl_is_teacher_first_by_hand():
    teacher = torch.tensor([[1.0, 0.0, -1.0]])
    selector = torch.tensor([[0.0, 2.0, 0.0]])
    p = [math.exp(v) for v in teacher[0].tolist()]
    p = [v / sum(p) for v in p]
    q = [math.exp(v) for v in selector[0].tolist()]
    q = [v / sum(q) for v in q]
    by_hand = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    reverse = sum(qi * math.log(qi / pi) for pi, qi in zip(p, q, strict=True))
    assert abs(by_hand - reverse) > 0.1  # the direction is observable here
    assert kl_teacher_selector(teacher, selector).item() == pytest.approx(by_hand, rel=1e-6)


def test_loss_terms_by_hand():
    torch.manual_seed(0)
    student_cls, teacher_cls = torch.randn(2, 3), torch.randn(2, 3)
    student_patches, teacher_patches = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    selector_map, teacher_map = torch.randn(2, 4), torch.randn(2, 4)
    teacher = SimpleNamespace(cls=teacher_cls, patches=teacher_patches, attention=teacher_map)
    terms = distillation_loss(student_cls, student_patches, selector_map, teacher)
    cls = (
        sum((student_cls[b, d] - teacher_cls[b, d]).item() ** 2 for b in range(2) for d in range(3))
        / 6
    )
    patch = (
        sum(
            (student_patches[b, n, d] - teacher_patches[b, n, d]).item() ** 2
            for b in range(2)
            for n in range(4)
            for d in range(3)
        )
        / 24
    )
    kl = 0.0
    for b in range(2):
        p = torch.softmax(teacher_map[b].double(), 0)
        q = torch.softmax(selector_map[b].double(), 0)
        kl += float((p * (p / q).log()).sum()) / 2
    assert terms.cls.item() == pytest.approx(cls, rel=1e-5)
    assert terms.patch.item() == pytest.approx(patch, rel=1e-5)
    assert terms.map.item() == pytest.approx(kl, rel=1e-5)
    assert terms.total.item() == pytest.approx(cls + patch + 0.1 * kl, rel=1e-5)


def test_teacher_attention_map_is_last_block_logits_over_patch_queries():
    teacher = _teacher()
    images = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        out = teacher(images, return_attention=True)
        tokens = torch.cat([teacher.prefix(2), teacher.embed(images)], 1)
        for block in teacher.blocks[:-1]:
            tokens, _ = block(tokens)
        last = teacher.blocks[-1]
        q, k, _ = last.attn._split(last.norm1(tokens))
        logits = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, L, L)
        expect = logits.mean(1)[:, 5:, 5:].mean(1)
    assert torch.allclose(out.attention, expect, atol=1e-5)


def test_a_teacher_without_attention_is_refused():
    def no_attention(images):
        return SimpleNamespace(
            cls=torch.zeros(1, 16), patches=torch.zeros(1, 16, 16), attention=None
        )

    with pytest.raises(ValueError, match="no 'attention'"):
        teacher_outputs(no_attention, torch.rand(1, 3, 16, 16))


def test_a_teacher_cls_that_is_not_b_by_d_is_refused():
    # (B, 1, D), e.g. last_hidden_state[:, :1], would broadcast against the student's (B, D)
    def sliced(images):
        return SimpleNamespace(
            cls=torch.zeros(2, 1, 16), patches=torch.zeros(2, 16, 16), attention=torch.zeros(2, 16)
        )

    with pytest.raises(ValueError, match=r"cls is \(2, 1, 16\); expected \(B, D\) = \(2, 16\)"):
        teacher_outputs(sliced, torch.rand(2, 3, 16, 16))
    teacher = SimpleNamespace(
        cls=torch.zeros(2, 1, 3), patches=torch.zeros(2, 4, 3), attention=torch.zeros(2, 4)
    )
    with pytest.raises(ValueError, match="no broadcasting"):
        distillation_loss(torch.zeros(2, 3), torch.zeros(2, 4, 3), torch.zeros(2, 4), teacher)


def test_pretraining_step_uses_the_teacher_and_a_per_step_k():
    teacher = _teacher()
    model = lookwhere_from_teacher(teacher, selector_depth=1, selector_size=8, k=4)
    images = torch.rand(2, 3, 16, 16)
    terms = distillation_step(model, teacher, images, k=3, k_max=6)
    # the same loss assembled by hand from the parts
    with torch.no_grad():
        target = teacher(images, return_attention=True)
        selected = model.selector(images)
        indices = topk_indices(selected.saliency, 6)
        short = model.extractor(images, selected.prefix, indices[:, :3])
        up = idw_upsample(short.patches, indices[:, :3], 4)
    expect = distillation_loss(short.cls, up, selected.saliency, target)
    assert terms.total.item() == pytest.approx(expect.total.item(), rel=1e-5)
    terms.total.backward()
    assert model.selector.head.fc2.weight.grad.abs().sum() > 0  # the map term trains the head
    assert model.selector.vit.cls_token.grad.abs().sum() > 0  # the prefix conditions the extractor
    assert all(p.grad is None for p in teacher.parameters())


def test_pretraining_lowers_the_distillation_loss():
    teacher = _teacher()
    model = lookwhere_from_teacher(teacher, selector_depth=1, selector_size=8, k=4)
    torch.manual_seed(3)

    class Images:
        def __init__(self):
            self.images = torch.rand(32, 3, 16, 16)

        def __len__(self):
            return 32

        def floats(self, index):
            return self.images[index]

    log = pretrain(
        model, teacher, Images(), TrainConfig(steps=40, batch_size=8, lr=3e-3), k_range=(2, 8)
    )
    first = sum(entry["total"] for entry in log[:5]) / 5
    last = sum(entry["total"] for entry in log[-5:]) / 5
    assert last < 0.7 * first


def test_k_range_is_checked():
    teacher = _teacher()
    model = lookwhere_from_teacher(teacher, selector_depth=1, selector_size=8, k=4)
    with pytest.raises(ValueError, match="k_range"):
        pretrain(model, teacher, None, TrainConfig(steps=1), k_range=(4, 17))


def test_warmup_cosine_schedule():
    assert warmup_cosine(0, 100, 10, 1.0) == pytest.approx(0.1)
    assert warmup_cosine(9, 100, 10, 1.0) == pytest.approx(1.0)
    assert warmup_cosine(10, 100, 10, 1.0) == pytest.approx(1.0)
    assert warmup_cosine(55, 100, 10, 1.0) == pytest.approx(0.5)
    assert warmup_cosine(100, 100, 10, 1.0) == pytest.approx(0.0, abs=1e-12)


class _Labelled:
    def __init__(self, count: int = 16, size: int = 16, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.rand(count, 3, size, size, generator=generator)
        self.labels = torch.randint(0, 3, (count,), generator=generator)
        self.name = "toy"

    def __len__(self):
        return len(self.labels)

    def floats(self, index=None):
        return self.images if index is None else self.images[index]


def test_pretraining_leaves_the_teacher_as_it_was():
    teacher = _teacher()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    model = lookwhere_from_teacher(teacher, selector_depth=1, selector_size=8, k=4)
    pretrain(model, teacher, _Labelled(), TrainConfig(steps=2, batch_size=4), k_range=(2, 6))
    assert all(p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    # and the extractor did train
    assert not torch.equal(model.extractor.vit.blocks[0].fc1.weight, teacher.blocks[0].fc1.weight)


def test_finetuning_trains_the_extractor_and_head_not_the_selector():
    from lookwhere.experiment import MethodSettings, finetune_lookwhere

    teacher = _teacher()
    model = lookwhere_from_teacher(teacher, selector_depth=1, selector_size=8, num_classes=3, k=4)
    selector = {k: v.clone() for k, v in model.selector.state_dict().items()}
    extractor = {k: v.clone() for k, v in model.extractor.state_dict().items()}
    head = model.head.weight.clone()
    settings = MethodSettings(finetune=TrainConfig(steps=3, batch_size=4), k_range=(2, 6))
    finetune_lookwhere(model, _Labelled(), settings)
    assert all(torch.equal(selector[k], v) for k, v in model.selector.state_dict().items())
    unused = {"vit.cls_token", "vit.register_tokens"}  # the selector's prefix replaces them
    for key, value in model.extractor.state_dict().items():
        assert torch.equal(extractor[key], value) == (key in unused), key
    assert not torch.equal(head, model.head.weight)


def test_finetuning_leaves_the_selector_trainable_for_a_later_pretraining():
    from lookwhere.experiment import MethodSettings, finetune_lookwhere

    teacher = _teacher()
    model = lookwhere_from_teacher(teacher, selector_depth=1, selector_size=8, num_classes=3, k=4)
    model.selector.head.fc2.bias.requires_grad_(False)  # the caller's own choice stays
    flags = {name: p.requires_grad for name, p in model.selector.named_parameters()}
    settings = MethodSettings(finetune=TrainConfig(steps=2, batch_size=4), k_range=(2, 6))
    finetune_lookwhere(model, _Labelled(), settings)
    assert {name: p.requires_grad for name, p in model.selector.named_parameters()} == flags
    before = {k: v.clone() for k, v in model.selector.state_dict().items()}
    pretrain(model, teacher, _Labelled(), TrainConfig(steps=2, batch_size=4), k_range=(2, 6))
    after = model.selector.state_dict()
    assert not torch.equal(before["head.fc1.weight"], after["head.fc1.weight"])
    assert torch.equal(before["head.fc2.bias"], after["head.fc2.bias"])


def test_finetuning_restores_the_selector_when_training_fails():
    from lookwhere.experiment import MethodSettings, finetune_lookwhere

    model = lookwhere_from_teacher(
        _teacher(), selector_depth=1, selector_size=8, num_classes=3, k=4
    )
    settings = MethodSettings(finetune=TrainConfig(steps=2, batch_size=64), k_range=(2, 6))
    with pytest.raises(ValueError, match="batch_size 64 exceeds"):
        finetune_lookwhere(model, _Labelled(), settings)
    assert all(p.requires_grad for p in model.selector.parameters())


def test_progress_bars_stay_out_of_redirected_logs(capsys):
    from lookwhere.train import optimise

    model = torch.nn.Linear(4, 1)

    def loss_fn(indices, step, generator):
        return model(torch.randn(4, 4, generator=generator)).pow(2).mean()

    optimise(model, loss_fn, 16, TrainConfig(steps=20, batch_size=4), progress="demo")
    assert capsys.readouterr().err == ""  # captured stderr is not a terminal: no bar
