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


@pytest.mark.parametrize("patch_size", [4, 8, 16])
def test_target_patches_are_the_cells_the_box_overlaps(patch_size):
    """Brute force: a cell is a target patch iff one of its pixels lies inside the box."""
    task = sparse_canvases("train", 12, size=64, seed=0)
    grid = 64 // patch_size
    ours = task.target_patches(patch_size)
    assert ours.shape == (12, grid * grid)
    for mask, (top, left, height, width) in zip(ours, task.boxes.tolist(), strict=True):
        pixels = torch.zeros(64, 64, dtype=torch.bool)
        pixels[top : top + height, left : left + width] = True
        cells = pixels.reshape(grid, patch_size, grid, patch_size).any(dim=3).any(dim=1)
        assert torch.equal(mask, cells.flatten())
        assert 0 < int(mask.sum()) < grid * grid  # a box, not the whole canvas


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
