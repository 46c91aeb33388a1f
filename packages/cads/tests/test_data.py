"""The mixed-quality sources are what their names say, measured on the data itself."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import cads
from cads.data import BYTE_CORRUPTION, DUPLICATE_COPIES


@pytest.fixture(scope="module")
def images():
    return cads.mixed_fashion_mnist(per_source=200, val_size=300, test_size=300, seed=0)


def _rows(x: torch.Tensor) -> set[bytes]:
    return {row.numpy().tobytes() for row in x.flatten(1)}


def test_image_sources(images):
    assert images.source_names == cads.IMAGE_SOURCES
    assert images.source_sizes().tolist() == [40] + [200] * 5  # clean data is scarce
    assert images.inputs.shape[1:] == (1, 14, 14)
    name = dict(enumerate(images.source_names))
    by = {name[j]: torch.nonzero(images.sources == j).flatten() for j in range(6)}
    assert len(_rows(images.inputs[by["duplicates"]])) == 200 // DUPLICATE_COPIES
    assert len(_rows(images.inputs[by["clean"]])) == 40
    # corrupted images: far noisier than clean ones (pixel noise of std 2 on unit-std pixels)
    assert images.inputs[by["corrupted"]].std() > 1.8 * images.inputs[by["clean"]].std()
    # no validation image is in the pool
    assert not _rows(images.val_inputs) & _rows(images.inputs)


def test_label_noise_rates_are_as_named(images):
    """A classifier trained on the clean source disagrees with a noisy source's labels at about
    the noise rate plus its own error; the ordering of the rates must show."""
    model = images.model_fn(0)
    clean = torch.nonzero(images.sources == 0).flatten()
    cads.train_under_budget(
        model,
        images.inputs,
        images.targets,
        clean,
        300,
        images.loss_fn,
        cads.InnerConfig(batch_size=32),
    )
    disagreement = []
    for j in (0, 1, 2, 3):
        members = torch.nonzero(images.sources == j).flatten()
        predictions = model(images.inputs[members]).argmax(-1)
        disagreement.append(float((predictions != images.targets[members]).float().mean()))
    assert disagreement == sorted(disagreement)
    assert disagreement[3] > 0.7  # 80% of its labels are wrong


def test_text_sources():
    text = cads.mixed_text(per_source=60, val_size=50, test_size=50, context=16)
    assert text.source_names == cads.TEXT_SOURCES
    assert text.inputs.shape == (12 + 4 * 60, 16)  # 60 // 5 clean fortunes: scarce
    assert text.targets.shape == text.inputs.shape
    # targets are the next bytes
    assert torch.equal(text.inputs[:, 1:], text.targets[:, :-1])
    # replaced bytes are uniform over printable ASCII: characters that fortunes almost never use
    # ({ } | ~ ^ ` < > [ ] \ @ # *) turn up at the rate BYTE_CORRUPTION × 14/95 in the corrupted
    # source and hardly at all in clean windows
    rare = torch.tensor([ord(c) for c in "{}|~^`<>[]\\@#*"])

    def share(x):
        return float(torch.isin(x, rare).float().mean())

    corrupted = text.inputs[text.sources == 3]
    clean = text.inputs[(text.sources == 0) | (text.sources == 4)]  # fortunes, uncorrupted
    expected = BYTE_CORRUPTION * len(rare) / 95
    assert share(corrupted) == pytest.approx(expected, rel=0.35)
    assert share(clean) < expected / 4
    duplicates = text.inputs[text.sources == 4]
    assert len(_rows(duplicates)) == 60 // DUPLICATE_COPIES
    assert text.val_inputs.shape == (50, 16)
    assert text.metric == "loss"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: cads.mixed_fashion_mnist(per_source=0), "per_source"),
        (lambda: cads.mixed_fashion_mnist(sources=("clean", "blurry")), "unknown image source"),
        (lambda: cads.mixed_fashion_mnist(downsample=4), "downsample"),
        (lambda: cads.mixed_fashion_mnist(per_source=20000), "Fashion-MNIST has"),
        (lambda: cads.mixed_text(sources=()), "unknown text source"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        (torch.tensor([-1, 0, 0, 0, 1, 1, 1, 1]), r"in 0\.\.1 .*from -1 to 1"),
        (torch.tensor([0, 0, 0, 0, 1, 1, 1, 2]), r"in 0\.\.1 .*from 0 to 2"),
        (torch.tensor([0.9] * 4 + [1.6] * 4), "integer source ids, got dtype torch.float32"),
        (torch.tensor([0.0] * 4 + [1.0] * 4), "integer source ids, got dtype torch.float32"),
        (torch.tensor([False] * 4 + [True] * 4), "integer source ids, got dtype torch.bool"),
    ],
)
def test_task_refuses_bad_source_ids(sources, message):
    base = cads.toy_task(per_source=4)
    with pytest.raises(ValueError, match=message):
        replace(base, sources=sources)


def test_task_refuses_empty_sources_and_mismatches():
    base = cads.toy_task(per_source=4)
    with pytest.raises(ValueError, match=r"source\(s\) \['random-labels'\] hold no example"):
        replace(base, sources=torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match="training split: 8 inputs but 7 targets"):
        replace(base, targets=base.targets[:7])
    with pytest.raises(ValueError, match="validation split is empty"):
        replace(base, val_inputs=base.val_inputs[:0], val_targets=base.val_targets[:0])
