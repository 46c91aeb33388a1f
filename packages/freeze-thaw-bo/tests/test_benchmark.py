"""Replaying methods on tables: oracle bounds, regret, rescoring, the comparison and tables."""

from __future__ import annotations

import numpy as np
import pytest
from curves_fixtures import curve_table

from freeze_thaw_bo import Utility, make_optimizer, oracle_bounds, rescore, run_on_table
from freeze_thaw_bo.compare import compare_methods, write_comparison
from freeze_thaw_bo.tables import load_table


def test_oracle_bounds_by_brute_force():
    table = curve_table(n=5, epochs=4, seed=2)
    utility = Utility(alpha=0.3, c=2.0, budget=12)
    u_max = max(utility(e + 1, table.values[n, e]) for n in range(5) for e in range(4))
    u_min = min(utility(12, table.values[n, 0]) for n in range(5))
    assert oracle_bounds(table.values, utility) == pytest.approx((u_max, u_min))


@pytest.mark.parametrize("method", ["random", "sh", "asha", "hyperband"])
@pytest.mark.parametrize("alpha", [2**-4, 2**-2])
def test_rescoring_equals_a_direct_run_with_that_utility(method, alpha):
    """A baseline's trajectory does not depend on α; its stop point and regrets do."""
    table = curve_table(n=10, epochs=6, seed=4)
    base = run_on_table(make_optimizer(method, table, Utility(0.0, budget=40), budget=40), table)
    direct = run_on_table(
        make_optimizer(method, table, Utility(alpha, budget=40), budget=40), table
    )
    again = rescore(base, table, Utility(alpha, budget=40))
    assert again.trials == direct.trials
    np.testing.assert_allclose(again.regrets, direct.regrets, rtol=0, atol=1e-12)
    assert again.stop_budget == direct.stop_budget


def test_regret_is_zero_only_at_the_oracle_and_at_most_one():
    table = curve_table(n=6, epochs=5, seed=5)
    utility = Utility(0.0, budget=30)
    result = run_on_table(make_optimizer("random", table, utility, budget=30), table)
    u_max, u_min = oracle_bounds(table.values, utility)
    expected = [
        (u_max - utility(b, y)) / (u_max - u_min)
        for b, y in zip(result.spent, result.incumbents, strict=True)
    ]
    np.testing.assert_allclose(result.regrets, expected)
    assert min(result.regrets) >= 0.0
    # α = 0 and the whole pool trained: the best configuration is found, regret ends at 0
    assert result.regrets[-1] == pytest.approx(0.0)


def test_compare_writes_tables_and_plots(tmp_path):
    table = curve_table(n=8, epochs=5, seed=6)
    comparison = compare_methods(
        table, methods=("random", "sh"), alphas=(0.0, 0.25), budget=20, seeds=(0, 1)
    )
    rows = comparison.summary_rows()
    assert {(r["method"], r["alpha"]) for r in rows} == {
        (m, a) for m in ("random", "sh") for a in (0.0, 0.25)
    }
    assert all(r["seeds"] == 2 for r in rows)
    figures = write_comparison(comparison, tmp_path)
    assert len(figures) == 2
    assert all((tmp_path / f).stat().st_size > 0 for f in figures)
    with pytest.raises(ValueError, match="unknown methods"):
        compare_methods(table, methods=("cfbo", "bohb"), budget=20)


def test_tables_load_real_curves_and_refuse_unknown_benchmarks(tmp_path):
    table = load_table("fashion-mnist", max_configs=20, seed=1)
    assert table.values.shape == (20, 30)
    assert table.space.dim <= 16
    for spec, match in [
        ("mnist", "unknown benchmark"),
        ("lcdb:letter", "OpenML dataset id"),
        ("lcbench:segment", "--data PATH"),
    ]:
        with pytest.raises(ValueError, match=match):
            load_table(spec)
    with pytest.raises(FileNotFoundError):
        load_table("lcdb:6", data=tmp_path / "missing.csv")
