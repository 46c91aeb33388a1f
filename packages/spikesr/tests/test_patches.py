"""The patch grid against explicit loops, its reassembly against brute-force means."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spikesr.patches import divide, patch_starts, reverse


def starts_loop(size: int, patch: int, step: int) -> list[int]:
    """The anchor's loop: a start every ``step``, the last patch moved back inside the map."""
    starts, i = [], 0
    while True:
        if i + patch >= size:
            starts.append(size - patch)
            return starts
        starts.append(i)
        i += step


@given(size=st.integers(16, 80), patch=st.integers(2, 16), data=st.data())
@settings(max_examples=200, deadline=None)
def test_patch_starts_match_the_loop(size, patch, data):
    step = data.draw(st.integers(1, patch))
    assert patch_starts(size, patch, step) == starts_loop(size, patch, step)


def test_anchor_grid_at_its_settings():
    assert patch_starts(16, 16, 14) == [0]
    assert patch_starts(32, 16, 14) == [0, 14, 16]
    assert patch_starts(64, 16, 14) == [0, 14, 28, 42, 48]


@pytest.mark.parametrize("shape", [(2, 3, 16, 16), (1, 2, 31, 19), (3, 1, 40, 33)])
def test_divide_and_reverse_against_loops(shape):
    torch.manual_seed(0)
    _b, _c, h, w = shape
    patch, step = 16, 14
    x = torch.randn(shape, dtype=torch.float64)
    crops = divide(x, patch, step)
    rows, cols = patch_starts(h, patch, step), patch_starts(w, patch, step)
    expected = [x[:, :, r : r + patch, q : q + patch] for r in rows for q in cols]
    assert torch.equal(crops, torch.stack(expected, dim=1))
    # overlaps average equal copies: x, up to the rounding of (a + a + a) / 3
    torch.testing.assert_close(reverse(crops, h, w, step), x, rtol=1e-15, atol=0)
    # distinct values per patch: each pixel is the mean over the patches that cover it
    marked = crops + torch.arange(crops.shape[1], dtype=torch.float64).view(1, -1, 1, 1, 1)
    total, count = torch.zeros_like(x), torch.zeros(h, w, dtype=torch.float64)
    for n, (r, q) in enumerate((r, q) for r in rows for q in cols):
        total[:, :, r : r + patch, q : q + patch] += marked[:, n]
        count[r : r + patch, q : q + patch] += 1
    torch.testing.assert_close(reverse(marked, h, w, step), total / count, rtol=1e-12, atol=1e-12)


def test_bad_grids_are_refused():
    with pytest.raises(ValueError, match="smaller than the attention patch size 16"):
        patch_starts(15, 16, 14)
    with pytest.raises(ValueError, match="patch step must be in"):
        patch_starts(32, 16, 17)
    with pytest.raises(ValueError, match="do not tile"):
        reverse(torch.zeros(1, 5, 1, 16, 16), 32, 32, 14)
