"""Triton helpers against brute force, and the autotuner's single config under the interpreter."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels_common import cdiv, is_power_of_2, next_power_of_2, triton_dtype


@given(st.integers(0, 2**62), st.integers(1, 10**6))
def test_cdiv_is_ceiling_division(numerator, denominator):
    result = cdiv(numerator, denominator)
    assert result == (numerator + denominator - 1) // denominator
    assert (
        result - 1
    ) * denominator < numerator <= result * denominator or numerator == result == 0


@given(st.integers(-5, 2**40))
def test_next_power_of_2_is_the_smallest_bound(n):
    p = next_power_of_2(n)
    assert is_power_of_2(p)
    assert p >= n
    assert p == 1 or p // 2 < n


def test_is_power_of_2_brute_force():
    powers = {2**k for k in range(12)}
    assert [n for n in range(-2, 2049) if is_power_of_2(n)] == sorted(powers)


def test_cdiv_rejects_bad_arguments():
    with pytest.raises(ValueError, match="denominator must be positive"):
        cdiv(3, 0)
    with pytest.raises(ValueError, match="numerator must be non-negative"):
        cdiv(-1, 2)


def test_triton_dtype_mapping():
    tl = pytest.importorskip("triton.language")
    assert triton_dtype(torch.bfloat16) is tl.bfloat16
    assert triton_dtype(torch.float32) is tl.float32
    with pytest.raises(TypeError, match=r"no Triton dtype for torch.complex64"):
        triton_dtype(torch.complex64)


def test_autotune_keeps_one_config_under_the_interpreter(monkeypatch):
    triton = pytest.importorskip("triton")
    from kernels_common import autotune

    configs = [triton.Config({"BLOCK": b}) for b in (16, 32, 64)]

    @triton.jit
    def kernel(x_ptr, n, BLOCK: triton.language.constexpr):  # only the bookkeeping is under test
        pass

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    tuned = autotune(configs, key=["n"], interpreter_config=1)(kernel)
    assert [c.kwargs for c in tuned.configs] == [{"BLOCK": 32}]
    with pytest.raises(ValueError, match="out of range for 3 configs"):
        autotune(configs, key=["n"], interpreter_config=3)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert len(autotune(configs, key=["n"])(kernel).configs) == 3
