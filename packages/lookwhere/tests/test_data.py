"""The benchmark images: deterministic, disjoint splits, the target where its box says."""

from __future__ import annotations

import pytest
import torch

from lookwhere.data import BACKGROUND_DIM, TEST_BACKGROUNDS, global_images, sparse_canvases


@pytest.fixture(scope="module")
def photos():
    from benchdata import sr_images

    return sr_images("all")


def test_canvases_are_deterministic_and_seeded(photos):
    a = sparse_canvases("train", 6, size=64, seed=1, photos=photos)
    b = sparse_canvases("train", 6, size=64, seed=1, photos=photos)
    c = sparse_canvases("train", 6, size=64, seed=2, photos=photos)
    assert torch.equal(a.images, b.images)
    assert torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, c.images)


def test_the_target_is_inside_its_box(photos):
    """With no distractors, the only pixels brighter than the dimmed background are the object's:
    all of them lie inside the box."""
    task = sparse_canvases("test", 20, size=64, distractors=0, seed=3, photos=photos)
    floats = task.floats()
    for image, (top, left, height, width) in zip(floats, task.boxes.tolist(), strict=True):
        bright = image.max(dim=0).values > BACKGROUND_DIM + 0.02
        rows, cols = torch.nonzero(bright, as_tuple=True)
        assert len(rows) > 0
        assert rows.min() >= top
        assert rows.max() < top + height
        assert cols.min() >= left
        assert cols.max() < left + width


def test_target_patches_cover_the_box():
    task = sparse_canvases("train", 5, size=64, seed=0)
    patches = task.target_patches(8).reshape(5, 8, 8)
    for mask, (top, left, height, width) in zip(patches, task.boxes.tolist(), strict=True):
        rows = torch.nonzero(mask.any(1)).flatten()
        cols = torch.nonzero(mask.any(0)).flatten()
        assert rows.min() * 8 <= top < (rows.min() + 1) * 8
        assert (rows.max() + 1) * 8 >= top + height > rows.max() * 8
        assert cols.min() * 8 <= left
        assert (cols.max() + 1) * 8 >= left + width


def test_labels_are_the_objects_classes_and_splits_use_disjoint_photos(photos):
    train = sparse_canvases("train", 50, size=48, seed=0, photos=photos)
    assert set(train.labels.tolist()) <= set(range(10))
    assert len(set(train.labels.tolist())) > 5
    only_test = {name: photos[name] for name in TEST_BACKGROUNDS}
    with pytest.raises(ValueError, match="no train background"):
        sparse_canvases("train", 2, size=48, photos=only_test)
    assert len(sparse_canvases("test", 2, size=48, photos=only_test)) == 2


def test_global_images_fill_the_canvas(photos):
    task = global_images("train", 4, size=48, photos=photos)
    assert task.images.shape == (4, 3, 48, 48)
    assert task.images.dtype == torch.uint8
    assert task.boxes.tolist() == [[0, 0, 48, 48]] * 4
    for image in task.floats():  # the object's ink spans most of the image
        rows, cols = torch.nonzero(image.max(dim=0).values > BACKGROUND_DIM + 0.1, as_tuple=True)
        assert rows.max() - rows.min() > 24
        assert cols.max() - cols.min() > 16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"count": 0}, "count"),
        ({"size": 16}, "canvas size"),
        ({"object_size": (40, 30)}, "object_size"),
        ({"distractors": -1}, "distractors"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sparse_canvases("train", **{"count": 2, **kwargs})
