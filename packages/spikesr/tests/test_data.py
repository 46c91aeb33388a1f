"""Images in and out, LR/HR pairs, and the patch sampler's alignment and augmentations."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from spikesr.data import (
    TEST_IMAGES,
    PatchSampler,
    augment,
    benchmark_images,
    folder_images,
    make_pairs,
    read_image,
    split_images,
    to_image,
    to_tensor,
    write_image,
)
from spikesr.resize import degrade, modcrop


def test_rgb_file_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "a.png")
    image = read_image(tmp_path / "a.png")
    assert image.dtype == np.float32
    assert image.shape == (9, 7, 3)
    np.testing.assert_array_equal(np.round(image * 255).astype(np.uint8), pixels)
    write_image(tmp_path / "b.png", image)
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "b.png")), pixels)


def test_grayscale_is_refused_unless_asked(tmp_path):
    Image.fromarray(np.full((5, 5), 100, dtype=np.uint8)).save(tmp_path / "g.png")
    with pytest.raises(ValueError, match=r"grayscale image .* SpikeSR needs RGB"):
        read_image(tmp_path / "g.png")
    image = read_image(tmp_path / "g.png", repeat_gray=True)
    assert image.shape == (5, 5, 3)
    assert np.allclose(image, 100 / 255)
    with pytest.raises(FileNotFoundError, match="no image file"):
        read_image(tmp_path / "missing.png")


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_16_bit_grayscale_is_scaled_by_65535(tmp_path, suffix):
    pixels = np.random.default_rng(1).integers(0, 65536, (6, 9), dtype=np.uint16)
    pixels[0, :2] = 0, 65535
    Image.fromarray(pixels).save(tmp_path / f"g16{suffix}")
    with Image.open(tmp_path / f"g16{suffix}") as written:
        assert written.mode.startswith("I;16")
    with pytest.raises(ValueError, match=r"grayscale image \(mode I;16"):
        read_image(tmp_path / f"g16{suffix}")
    image = read_image(tmp_path / f"g16{suffix}", repeat_gray=True)  # 8 bits: nearly all ones
    expected = np.repeat(pixels[..., None] / 65535.0, 3, axis=2)
    np.testing.assert_allclose(image, expected, rtol=0, atol=6e-8)  # float32's spacing below 1


def test_float_images_pass_through_in_unit_range(tmp_path):
    pixels = np.random.default_rng(2).random((6, 9)).astype(np.float32)
    Image.fromarray(pixels).save(tmp_path / "f.tif")
    with Image.open(tmp_path / "f.tif") as written:
        assert written.mode == "F"
    image = read_image(tmp_path / "f.tif", repeat_gray=True)  # 8 bits: truncated to 0 or 1 / 255
    np.testing.assert_array_equal(image, np.repeat(pixels[..., None], 3, axis=2))
    Image.fromarray(pixels * 255).save(tmp_path / "f255.tif")
    with pytest.raises(ValueError, match=r"f255\.tif \(a float image, PIL mode F\) has values"):
        read_image(tmp_path / "f255.tif", repeat_gray=True)
    Image.fromarray(np.arange(12, dtype=np.int32).reshape(3, 4) * 1000).save(tmp_path / "i.tif")
    with pytest.raises(ValueError, match=r"32-bit integer image \(PIL mode I\)"):
        read_image(tmp_path / "i.tif", repeat_gray=True)


def test_folder_images_reads_class_folders(tmp_path):
    for name in ("Airport/a1.png", "Beach/b1.jpg", "notes.txt"):
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        if name.endswith(".txt"):
            path.write_text("x")
        else:
            Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(path)
    assert sorted(folder_images(tmp_path)) == ["Airport/a1", "Beach/b1"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no images"):
        folder_images(tmp_path / "empty")


def test_folder_images_refuses_two_files_with_one_name(tmp_path):
    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(tmp_path / "scene.png")
    Image.fromarray(np.full((4, 4, 3), 255, dtype=np.uint8)).save(tmp_path / "scene.jpg")
    with pytest.raises(ValueError, match=r"scene\.jpg and .*scene\.png would both be the image"):
        folder_images(tmp_path)  # one of them was silently dropped
    (tmp_path / "scene.jpg").rename(tmp_path / "scene2.jpg")
    images = folder_images(tmp_path)
    assert sorted(images) == ["scene", "scene2"]
    assert images["scene"].max() == 0
    assert images["scene2"].min() == 1


def test_benchmark_images_are_real_rgb_photographs():
    images = benchmark_images("all")
    assert set(TEST_IMAGES) <= set(images)
    assert {"aero1", "aero3"} <= set(images)
    train, test = split_images(images)
    assert not set(train) & set(test)
    assert len(train) >= 10
    for image in test.values():
        assert image.ndim == 3
        assert image.shape[2] == 3
        assert image.min() >= 0
        assert image.max() <= 1
    with pytest.raises(ValueError, match="not among"):
        split_images(images, test=("lena",))


def test_pairs_are_modcropped_and_degraded():
    rng = np.random.default_rng(1)
    pair = make_pairs({"x": rng.random((37, 42, 3))}, 4)[0]
    assert pair.hr.shape == (36, 40, 3)
    np.testing.assert_array_equal(pair.lr, degrade(modcrop(pair.hr, 4), 4))


def _inverse_views(patch: np.ndarray):
    for flip_h in (False, True):
        for flip_v in (False, True):
            for transpose in (False, True):
                # augment applies flip_h, flip_v, then transpose: undo in reverse order
                view = patch.transpose(1, 0, 2) if transpose else patch
                view = view[::-1] if flip_v else view
                yield (flip_h, flip_v, transpose), (view[:, ::-1] if flip_h else view)


def test_sampler_crops_are_aligned_windows_under_one_of_eight_transforms():
    rng = np.random.default_rng(2)
    h, w, s, p = 13, 17, 2, 5
    lr = np.arange(h * w * 3, dtype=np.float32).reshape(h, w, 3)  # every value names its place
    hr = lr.repeat(s, axis=0).repeat(s, axis=1)  # nearest upsampling: alignment is checkable
    from spikesr.data import Pair

    sampler = PatchSampler([Pair("ids", hr, lr)], s, p, seed=int(rng.integers(100)))
    seen = set()
    for _ in range(6):
        lrs, hrs = sampler.sample(8)
        for lr_patch, hr_patch in zip(to_image_batch(lrs), to_image_batch(hrs), strict=True):
            np.testing.assert_array_equal(hr_patch, lr_patch.repeat(s, 0).repeat(s, 1))
            found = []
            for flags, view in _inverse_views(lr_patch):
                top, rem = divmod(int(view[0, 0, 0]) // 3, w)
                if (
                    top + p <= h
                    and rem + p <= w
                    and np.array_equal(view, lr[top : top + p, rem : rem + p])
                ):
                    found.append(flags)
            assert found, "a patch that is no window of the image"
            seen.update(found)
    assert len(seen) == 8  # all flips and rotations occur


def to_image_batch(tensor):
    return [to_image(t) for t in tensor]


def test_augment_and_tensor_layout():
    image = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    np.testing.assert_array_equal(augment(image, True, False, False), image[:, ::-1])
    np.testing.assert_array_equal(augment(image, False, False, True), image.transpose(1, 0, 2))
    tensor = to_tensor(image)
    assert tensor.shape == (1, 3, 2, 4)
    np.testing.assert_array_equal(to_image(tensor), image)


def test_sampler_refuses_small_images_and_no_images():
    from spikesr.data import Pair

    small = Pair("s", np.zeros((20, 20, 3)), np.zeros((10, 10, 3)))
    with pytest.raises(ValueError, match=r"smaller than an LR patch of 16 pixels"):
        PatchSampler([small], 2, 16)
    with pytest.raises(ValueError, match="no training images"):
        PatchSampler([], 2, 16)
