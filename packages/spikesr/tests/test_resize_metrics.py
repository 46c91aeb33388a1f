"""MATLAB bicubic against values computed by GNU Octave's imresize; PSNR / SSIM against
scikit-image on the same arrays under the same convention."""

from __future__ import annotations

import numpy as np
import pytest
from skimage.color import rgb2ycbcr
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from spikesr.metrics import AUTHOR, BASICSR, prepare, psnr, rgb_to_y, score, ssim
from spikesr.resize import degrade, imresize, modcrop, resize_matrix

# imresize(reshape(0:15, 4, 4)', 0.5) and imresize(..., 0.5, "Antialiasing", false) in GNU Octave
OCTAVE_ANTIALIAS = [[2.3046875, 4.3828125], [10.6171875, 12.6953125]]
OCTAVE_PLAIN = [[2.1875, 4.3125], [10.6875, 12.8125]]


def test_shrink_matches_octave():
    ramp = np.arange(16.0).reshape(4, 4)
    np.testing.assert_allclose(imresize(ramp, 0.5), OCTAVE_ANTIALIAS, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        imresize(ramp, 0.5, antialias=False), OCTAVE_PLAIN, rtol=0, atol=1e-12
    )


def test_weights_are_normalised_and_constants_survive():
    for n, m, s in ((37, 10, 0.25), (10, 40, 4.0), (9, 18, 2.0)):
        np.testing.assert_allclose(resize_matrix(n, m, s).sum(axis=1), 1.0, rtol=0, atol=1e-12)
    flat = np.full((13, 11, 3), 0.3)
    np.testing.assert_allclose(imresize(flat, 0.25), 0.3, rtol=0, atol=1e-12)


def test_upscaling_reproduces_a_linear_ramp_away_from_the_border():
    # Keys' cubic reproduces linear functions exactly; the mirrored border bends them
    ramp = np.add.outer(np.arange(12.0), 2 * np.arange(10.0))
    up = imresize(ramp, 2)
    y = (np.arange(24) + 0.5) / 2 - 0.5  # input coordinate of each output pixel
    x = (np.arange(20) + 0.5) / 2 - 0.5
    expected = np.add.outer(y, 2 * x)
    np.testing.assert_allclose(up[4:-4, 4:-4], expected[4:-4, 4:-4], rtol=0, atol=1e-12)


@pytest.mark.parametrize(("scale", "border"), [(0.25, 4), (4, 16)])
def test_torch_antialiased_bicubic_is_ours_away_from_the_borders(scale, border):
    # torch's antialiased bicubic uses a = -0.5 as MATLAB does (its plain bicubic a = -0.75) and
    # renormalises the kernel cut at a border instead of mirroring: equal inside, not at the edges
    import torch
    import torch.nn.functional as F

    image = np.random.default_rng(0).random((64, 64))

    def torch_bicubic(antialias: bool) -> np.ndarray:
        batch = torch.from_numpy(image)[None, None]
        out = F.interpolate(
            batch, scale_factor=scale, mode="bicubic", antialias=antialias, align_corners=False
        )
        return out[0, 0].numpy()

    ours, inside = imresize(image, scale), (slice(border, -border),) * 2
    np.testing.assert_allclose(torch_bicubic(True)[inside], ours[inside], rtol=0, atol=1e-12)
    assert np.abs(torch_bicubic(True) - ours).max() > 1e-3
    assert np.abs(torch_bicubic(False) - ours)[inside].max() > 1e-2


def test_degrade_shapes_and_rounds():
    rng = np.random.default_rng(0)
    hr = modcrop(rng.random((50, 47, 3)), 4)
    assert hr.shape == (48, 44, 3)
    lr = degrade(hr, 4)
    assert lr.shape == (12, 11, 3)
    assert lr.dtype == np.float32
    np.testing.assert_allclose(lr * 255, np.round(lr * 255), rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="not a multiple of the scale 4: modcrop it first"):
        degrade(rng.random((50, 48, 3)), 4)


def test_degrade_refuses_images_outside_unit_range():
    hr = np.random.default_rng(0).random((16, 16, 3))
    with pytest.raises(ValueError, match=r"HR image has values in \[0\.\d+, 254\.\d+\].*255"):
        degrade(hr * 255, 4)  # would come out all ones, clipped
    with pytest.raises(ValueError, match="HR image has non-finite values"):
        degrade(np.where(hr > 0.5, np.nan, hr), 4)


def test_y_channel_is_matlab_rgb2ycbcr():
    rng = np.random.default_rng(1)
    image = rng.random((9, 8, 3))
    np.testing.assert_allclose(rgb_to_y(image), rgb2ycbcr(image)[..., 0], rtol=0, atol=1e-10)


def _pair(seed: int, shape=(40, 36, 3)):
    rng = np.random.default_rng(seed)
    hr = rng.random(shape)
    sr = np.clip(hr + rng.normal(0, 0.05, shape), 0, 1)
    return sr, hr


@pytest.mark.parametrize("y_channel", [True, False])
@pytest.mark.parametrize("crop", [0, 4])
def test_psnr_ssim_match_scikit_image(y_channel, crop):
    sr, hr = _pair(2)
    a = prepare(sr, y_channel=y_channel, crop=crop)
    b = prepare(hr, y_channel=y_channel, crop=crop)
    ref_psnr = peak_signal_noise_ratio(b, a, data_range=255)
    ref_ssim = structural_similarity(
        b, a, data_range=255, gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
        channel_axis=None if y_channel else 2,
    )  # fmt: skip
    flags = {"y_channel": y_channel, "crop": crop}
    assert psnr(sr, hr, **flags) == pytest.approx(ref_psnr, rel=1e-12)
    assert ssim(sr, hr, **flags) == pytest.approx(ref_ssim, rel=1e-9)


def test_prepare_rounds_crops_and_scales():
    image = np.full((20, 20, 3), 0.5013)  # 127.83 -> 128 when rounded
    np.testing.assert_allclose(prepare(image, y_channel=False, crop=2), 128.0)
    assert prepare(image, y_channel=True, crop=2).shape == (16, 16)
    assert prepare(image, y_channel=False, round=False)[0, 0, 0] == pytest.approx(127.8315)


def test_conventions_differ_only_by_the_crop():
    sr, hr = _pair(3)
    assert score(sr, hr, AUTHOR, 4) == (psnr(sr, hr, y_channel=True), ssim(sr, hr, y_channel=True))
    assert score(sr, hr, BASICSR, 4)[0] == psnr(sr, hr, y_channel=True, crop=4)


def test_bad_metric_inputs_are_refused():
    sr, hr = _pair(4)
    with pytest.raises(ValueError, match="shape"):
        psnr(sr[:, :-1], hr, y_channel=True)
    with pytest.raises(ValueError, match="border crop 20"):
        psnr(sr, hr, y_channel=True, crop=20)
    with pytest.raises(ValueError, match="needs an RGB image"):
        psnr(sr[..., 0], hr[..., 0], y_channel=True)


@pytest.mark.parametrize("metric", [psnr, ssim])
@pytest.mark.parametrize("round", [True, False])
def test_images_outside_unit_range_are_refused_not_clipped(metric, round):
    sr, hr = _pair(5)
    flags = {"y_channel": True, "round": round}
    assert (sr.min(), sr.max()) == (0, 1)  # sr is clipped: 0 and 1 themselves are in range
    metric(sr, hr, **flags)
    with pytest.raises(ValueError, match=r"SR image has values in \[0, 255\].*divide by 255"):
        metric(sr * 255, hr, **flags)
    with pytest.raises(ValueError, match=r"HR image has values in \[0, 255\]"):
        metric(sr, np.round(hr * 255), **flags)
    with pytest.raises(ValueError, match=r"SR image has values in \[-0\.1, 1\]"):
        metric(np.where(sr < 0.05, -0.1, sr), hr, **flags)
    bad = sr.copy()
    bad[3, 4, 1] = np.nan
    with pytest.raises(ValueError, match="SR image has non-finite values"):
        metric(bad, hr, **flags)
    bad[3, 4, 1] = np.inf
    with pytest.raises(ValueError, match="SR image has non-finite values"):
        metric(bad, hr, **flags)
