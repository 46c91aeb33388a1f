import numpy as np
import pytest

from benchdata import DataNotFoundError, sr_images
from benchdata.sr import SKIMAGE_NATURAL, to_float


def test_natural_and_aerial_photographs():
    images = sr_images()
    assert set(SKIMAGE_NATURAL) < set(images)
    assert {"aero1", "aero3", "baboon"} < set(images)
    assert images["aero1"].shape == (480, 640, 3)
    assert images["astronaut"].shape == (512, 512, 3)
    for name, image in images.items():
        assert image.dtype == np.float32, name
        assert image.ndim == 3
        assert image.shape[2] == 3
        assert 0.0 <= image.min() <= image.max() <= 1.0
        assert image.std() > 0.05, name  # a real photograph, not a blank file
    aerial = sr_images("aerial")
    assert set(aerial) == {"aero1", "aero3"}
    np.testing.assert_array_equal(aerial["aero1"], images["aero1"])


def test_color_conversion_against_hand_computed_pixels():
    pixel = np.array([[[255, 0, 0], [10, 20, 30]]], dtype=np.uint8)
    np.testing.assert_allclose(
        to_float(pixel, "gray"), [[0.299, (0.299 * 10 + 0.587 * 20 + 0.114 * 30) / 255]], rtol=1e-6
    )
    gray = np.array([[0, 51]], dtype=np.uint8)
    expected = np.array([[[0, 0, 0], [0.2, 0.2, 0.2]]], dtype=np.float32)  # 51/255 in float32
    np.testing.assert_array_equal(to_float(gray, "rgb"), expected)
    rgba = np.zeros((1, 1, 4), dtype=np.uint8)
    assert to_float(rgba, "rgb").shape == (1, 1, 3)
    with pytest.raises(ValueError, match="uint8"):
        to_float(gray.astype(np.float32), "rgb")


def test_user_folder_of_images(tmp_path):
    from skimage.io import imsave

    picture = (np.arange(48, dtype=np.uint8) * 5).reshape(4, 4, 3)
    imsave(tmp_path / "mine.png", picture, check_contrast=False)
    (tmp_path / "notes.txt").write_text("not an image")
    images = sr_images(path=tmp_path, color="gray")
    assert list(images) == ["mine"]
    assert images["mine"].shape == (4, 4)


def test_missing_and_bad_arguments(empty_dir):
    with pytest.raises(DataNotFoundError, match="images"):
        sr_images(path=empty_dir)
    with pytest.raises(ValueError, match="source must be"):
        sr_images("satellite")
    with pytest.raises(ValueError, match="color must be"):
        sr_images(color="ycbcr")
