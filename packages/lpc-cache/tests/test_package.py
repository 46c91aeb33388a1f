"""Package-level checks: README example, lean import, CLI."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest

import lpc_cache
from kernels_common.testing import import_footprint, run_markdown_python
from lpc_cache.__main__ import main

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs():
    run_markdown_python(README)


def test_import_is_lean():
    footprint = import_footprint(
        "import lpc_cache", watch=["triton", "sentence_transformers", "benchdata", "matplotlib"]
    )
    assert not any(footprint[name] for name in ("triton", "sentence_transformers", "benchdata"))
    assert not footprint["matplotlib"]
    assert not footprint["cuda"]


def test_cli_simulate_json(tmp_path, capsys, write_trace):
    path = write_trace(tmp_path / "t.jsonl")
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(path),
                "--policy",
                "lru",
                "--capacity-tokens",
                "2000",
                "--block-size",
                "8",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    expected = lpc_cache.simulate(lpc_cache.load_trace(path), "lru", 2000, block_size=8)
    assert result["hit_ratio"] == pytest.approx(expected.hit_ratio)
    assert {"hit_ratio", "request_hit_ratio", "evictions"} <= set(result)
    assert 0 < result["hit_ratio"] < 1


def test_cli_sweep_and_lpc_needs_a_predictor(tmp_path, capsys, write_trace):
    path = write_trace(tmp_path / "t.jsonl")
    args = [
        "sweep",
        "--trace",
        str(path),
        "--capacities",
        "500,2000,8000",
        "--out",
        str(tmp_path / "sweep"),
        "--policies",
        "lru,belady",
    ]
    assert main(args) == 0
    data = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    for lru, belady in zip(data["lru"], data["belady"], strict=True):
        assert belady["hit_ratio"] >= lru["hit_ratio"] - 1e-12
    assert (tmp_path / "sweep" / "hit_ratio.png").exists()
    capsys.readouterr()
    assert (
        main(["simulate", "--trace", str(path), "--policy", "lpc", "--capacity-tokens", "10"]) == 2
    )
    assert "--predictor" in capsys.readouterr().err


def test_cli_help_and_version():
    with pytest.raises(SystemExit) as exit_info:
        main(["reproduce", "--help"])
    assert exit_info.value.code == 0
    assert lpc_cache.__version__ == importlib.metadata.version("lpc-cache")
    assert np.isfinite(lpc_cache.ServingModel().prefill_s_per_token)


def test_cli_bad_input_is_a_clear_error(tmp_path, capsys, write_trace):
    path = write_trace(tmp_path / "t.jsonl")
    base = ["simulate", "--trace", str(path), "--capacity-tokens"]
    for args, message in (
        ([*base, "100", "--policy", "mru"], "unknown policy 'mru'"),
        ([*base, "-5", "--policy", "lru"], "--capacity-tokens: expected an integer >= 0"),
        (
            [
                "simulate",
                "--trace",
                str(tmp_path / "no.jsonl"),
                "--capacity-tokens",
                "1",
                "--policy",
                "lru",
            ],
            "no such file",
        ),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
