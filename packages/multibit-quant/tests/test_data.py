"""Data loaders: real Fashion-MNIST, ImageFolder directories, bigbench's CIFAR-10 JSON."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from multibit_quant import cifar10_bigbench, fashion_mnist, image_folder
from multibit_quant.data import stratified_subset


def test_fashion_mnist_subsets_are_stratified_and_standardised():
    train, test = fashion_mnist(limit_train=600, limit_test=200)
    assert train.images.shape == (600, 1, 28, 28)
    assert test.images.shape == (200, 1, 28, 28)
    assert torch.bincount(train.labels).tolist() == [60] * 10
    assert abs(float(train.images.mean())) < 1e-4
    assert abs(float(train.images.std()) - 1) < 1e-3
    assert train.classes[0] == "T-shirt/top"


def test_stratified_subset_counts():
    labels = np.array([0] * 50 + [1] * 5 + [2] * 45)
    picked = stratified_subset(labels, 30, seed=0)
    assert len(picked) == 30
    assert len(set(picked)) == 30
    counts = np.bincount(labels[picked], minlength=3)
    assert counts[1] == 5
    assert abs(counts[0] - counts[2]) <= 1
    with pytest.raises(ValueError, match="subset size"):
        stratified_subset(labels, 0, seed=0)


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def test_image_folder(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        for i in range(3):
            (tmp_path / name / f"{i}.png").write_bytes(
                _png(rng.integers(0, 255, (6, 6, 3), np.uint8))
            )
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    data = image_folder(tmp_path)
    mean, std = (torch.tensor(v) for v in data.normalization)
    raw = (data.images * std[None, :, None, None] + mean[None, :, None, None]) * 255
    assert torch.allclose(raw, raw.round(), atol=1e-3)  # undoes to the stored uint8 pixels
    again = image_folder(tmp_path, normalization=([0.5] * 3, [0.25] * 3))
    torch.testing.assert_close(again.images, (raw / 255 - 0.5) / 0.25, rtol=1e-5, atol=1e-5)
    assert data.images.shape == (6, 3, 6, 6)
    assert data.classes == ("cat", "dog")
    assert data.labels.tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(FileNotFoundError, match="no image folder"):
        image_folder(tmp_path / "missing")
    with pytest.raises(ValueError, match="no class sub-folders"):
        image_folder(tmp_path / "cat")


def test_cifar10_bigbench_format(tmp_path):
    """The task.json of bigbench 1.0.0: raw base64 PNG inputs and one-hot target_scores."""
    classes = ["airplane", "automobile", "bird"]
    examples = []
    for label in (2, 0, 1, 2):
        pixels = np.full((32, 32, 3), 40 * label, np.uint8)
        scores = {name: int(i == label) for i, name in enumerate(classes)}
        examples.append({"input": base64.b64encode(_png(pixels)).decode(), "target_scores": scores})
    path = tmp_path / "task.json"
    path.write_text(json.dumps({"name": "cifar10_classification", "examples": examples}))
    train, test = cifar10_bigbench(path, test_images=2)
    assert train.images.shape == (2, 3, 32, 32)
    assert test.images.shape == (2, 3, 32, 32)
    assert sorted(train.labels.tolist() + test.labels.tolist()) == [0, 1, 2, 2]
    assert train.classes == tuple(classes)
    assert test.normalization == train.normalization  # the test images use the training stats
    with pytest.raises(FileNotFoundError, match="bigbench"):
        cifar10_bigbench(tmp_path / "missing.json")
    (tmp_path / "other.json").write_text(json.dumps({"examples": [{"input": "x"}]}))
    with pytest.raises(ValueError, match="not bigbench's CIFAR-10 task"):
        cifar10_bigbench(tmp_path / "other.json")


def test_test_split_is_standardised_with_the_training_statistics():
    train, test = fashion_mnist(limit_train=300, limit_test=100)
    assert test.normalization == train.normalization
    again, _ = fashion_mnist(limit_train=50, limit_test=10, normalization=train.normalization)
    assert again.normalization == train.normalization
    with pytest.raises(ValueError, match="channel"):
        fashion_mnist(limit_train=10, limit_test=10, normalization=([0.1, 0.2], [1.0, 1.0]))
