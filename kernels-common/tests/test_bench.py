"""Benchmark harness: timings against known sleeps, peak memory against known allocations."""

from __future__ import annotations

import json
import time

import pytest
import torch

from kernels_common import compare, drop_failing, measure, peak_memory

MiB = 2**20


def sleeper(seconds: float):
    return lambda: time.sleep(seconds)


def test_measure_reports_the_median_of_known_durations():
    m = measure(sleeper(0.02), warmup=1, repeat=5, memory=False)
    # sleep never returns early; a loaded machine may add a few ms, never 2x
    assert 0.02 <= m.median_s < 0.04
    assert m.min_s <= m.q1_s <= m.median_s <= m.q3_s
    assert m.iqr_s >= 0
    assert m.repeat == 5
    assert m.peak_memory_bytes is None


def test_measure_counts_warmup_and_repeat_calls():
    calls = []
    measure(lambda: calls.append(1), warmup=2, repeat=7, memory=True)
    assert len(calls) == 2 + 7 + 1  # warm-up, timed, one memory pass


def test_measure_rejects_bad_counts():
    with pytest.raises(ValueError, match="repeat >= 1"):
        measure(lambda: None, repeat=0)


@pytest.mark.parametrize("size_mib", [16, 64])
def test_peak_memory_sees_a_known_allocation_every_time(size_mib: int):
    def allocate():
        x = torch.ones(size_mib * MiB // 4)  # float32, touched by the fill
        del x

    allocate()  # first call pages in library code: warm-up, as measure() does
    for _ in range(2):  # a second call must not hide behind memory freed by the first
        peak = peak_memory(allocate)
        if peak.method != "peak-rss":
            pytest.skip(f"peak RSS cannot be reset here ({peak.method}); torch memory is invisible")
        assert size_mib * MiB * 0.95 <= peak.bytes <= size_mib * MiB * 1.1


def test_compare_ratios_outputs_and_files(tmp_path):
    x = torch.randn(64)
    table = compare(
        {
            "fast": lambda: (time.sleep(0.01), x * 2)[1],
            "slow": lambda: (time.sleep(0.02), x * 2 + 1e-3)[1],
        },
        baseline="fast",
        title="sleep",
        warmup=1,
        repeat=5,
    )
    assert [row.name for row in table.rows] == ["fast", "slow"]
    assert table.row("fast").time_ratio == 1.0
    assert 1.4 < table.row("slow").time_ratio < 2.6
    assert table.row("fast").max_abs_error == 0.0
    assert table.row("slow").max_abs_error == pytest.approx(1e-3, rel=1e-3)
    json_path, md_path = table.save(tmp_path, "sleep")
    data = json.loads(json_path.read_text())
    assert data["baseline"] == "fast"
    assert data["rows"][1]["time_ratio"] == pytest.approx(table.row("slow").time_ratio)
    assert "| slow |" in md_path.read_text()
    assert "ratios vs `fast`" in md_path.read_text()


def test_compare_memory_ratio_follows_allocations():
    def allocate(mib):
        return lambda: torch.ones(mib * MiB // 4).sum()

    table = compare(
        {"small": allocate(8), "large": allocate(32)}, baseline="small", warmup=0, repeat=1
    )
    if {row.measurement.memory_method for row in table.rows} != {"peak-rss"}:
        pytest.skip("peak RSS cannot be reset here; torch allocations are invisible to tracemalloc")
    assert 3.0 < table.row("large").memory_ratio < 5.0


def test_compare_gives_no_memory_ratio_across_measurement_methods(monkeypatch):
    # peak RSS for one candidate and tracemalloc (blind to torch) for the other: no ratio
    from kernels_common import bench, memory

    methods = iter(["peak-rss", "tracemalloc"])
    monkeypatch.setattr(
        bench, "peak_memory", lambda fn, device: memory.PeakMemory(1 << 20, next(methods))
    )
    table = compare({"a": lambda: None, "b": lambda: None}, baseline="a", warmup=0, repeat=1)
    assert table.row("a").memory_ratio == 1.0
    assert table.row("b").memory_ratio is None


def test_compare_rejects_unknown_baseline():
    with pytest.raises(ValueError, match="baseline 'torch' is not one of the candidates"):
        compare({"a": lambda: None}, baseline="torch")


@pytest.mark.gpu
def test_cuda_timing_and_allocator_peak():
    x = torch.randn(4096, 4096, device="cuda")
    m = measure(lambda: x @ x, device="cuda", warmup=2, repeat=5)
    assert m.memory_method == "cuda-allocator"
    assert m.peak_memory_bytes == 4096 * 4096 * 4  # exactly one output buffer
    assert 0 < m.median_s < 1.0


def test_output_check_sees_nan_and_shape_mismatch():
    good = torch.ones(3)
    table = compare(
        {
            "base": lambda: (good, good),
            "nan": lambda: (good, torch.tensor([1.0, float("nan"), 1.0])),
        },
        baseline="base",
        warmup=0,
        repeat=1,
        memory=False,
    )
    assert table.row("nan").max_abs_error == float("inf")
    with pytest.raises(ValueError, match=r"shape \(3, 1\) differs from the baseline's \(3,\)"):
        compare({"base": lambda: good, "bad": lambda: good[:, None]}, baseline="base", repeat=1)


def test_baseline_output_is_snapshotted_before_in_place_reuse():
    buffer = torch.zeros(4)

    def writes_in_place():
        buffer.add_(1.0)  # every call changes the shared buffer
        return buffer

    table = compare(
        {"inplace": writes_in_place}, baseline="inplace", warmup=0, repeat=1, memory=False
    )
    assert table.row("inplace").max_abs_error > 0  # compared against the first call's value


def test_compare_interleaves_the_timed_rounds():
    calls: list[str] = []
    compare(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
        baseline="a",
        warmup=1,
        repeat=3,
        memory=False,
        check_outputs=False,
    )
    assert calls == ["a", "b"] + ["a", "b"] * 3  # warm-up each, then one call of each per round


def test_output_check_follows_compare_tensors_rules():
    inf_nan = torch.tensor([float("-inf"), float("nan"), 1.0])
    table = compare(
        {
            "base": lambda: inf_nan,
            "same": lambda: inf_nan.clone(),
            "finite": lambda: torch.tensor([0.0, float("nan"), 1.0]),
        },
        baseline="base",
        warmup=0,
        repeat=1,
        memory=False,
    )
    assert table.row("same").max_abs_error == 0.0  # matching -inf and NaN are equal
    assert table.row("finite").max_abs_error == float("inf")  # 0 where the baseline has -inf
    with pytest.raises(ValueError, match="returned None"):
        compare({"base": lambda: (inf_nan, None), "x": lambda: (inf_nan, inf_nan)}, baseline="base")


def test_saved_json_is_strict_even_with_infinite_errors(tmp_path):
    table = compare(
        {"base": lambda: torch.ones(2), "nan": lambda: torch.full((2,), float("nan"))},
        baseline="base",
        warmup=0,
        repeat=1,
        memory=False,
    )
    json_path, _ = table.save(tmp_path, "t")
    data = json.loads(json_path.read_text(), parse_constant=lambda name: pytest.fail(name))
    assert data["rows"][1]["max_abs_error"] == "inf"


def test_drop_failing_keeps_working_candidates_in_order_and_says_why_others_failed():
    calls = []

    def broken():
        calls.append("broken")
        raise RuntimeError("no kernel for this dtype\nsecond line of the traceback text")

    candidates = {"b": lambda: calls.append("b"), "broken": broken, "a": lambda: calls.append("a")}
    working, failed = drop_failing(candidates)
    assert list(working) == ["b", "a"]
    assert failed == {"broken": "RuntimeError: no kernel for this dtype"}
    assert calls == ["b", "broken", "a"]  # each called exactly once
