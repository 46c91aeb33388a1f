"""The PostNAS part of ``reproduce``'s report: each claim's number from hand-made measurements,
and the files it writes."""

from __future__ import annotations

import json

import pytest

from jet_nemotron.reproduce.report import write_results


def record(heads: int, key: int, value: int, quality: float, speed: float) -> dict:
    return {"num_heads": heads, "head_dim": key, "head_v_dim": value,
            "state_numel": heads * key * value, "jet_params": 1000 * heads, "quality": quality,
            "tokens_per_s": speed, "cache_bytes": 4 * heads * key * value}  # fmt: skip


def measured() -> dict:
    score = {"loss": 1.0, "accuracy": 0.5}
    probes = {"lm": score, "retrieval": score, "arithmetic": score}
    records = [record(9, 64, 64, -3.0, 10.0), record(6, 64, 96, -2.5, 8.0),
               record(3, 96, 128, -3.5, 12.0)]  # fmt: skip
    decode = [{"context": 4096, "tokens_per_s": 10.0, "cache_bytes": 1},
              {"context": 16384, "tokens_per_s": 4.0, "cache_bytes": 2}]  # fmt: skip
    return {
        "num_layers": 4,
        "budget": 2,
        "supernet_history": {"layerwise": [1.0, 0.5], "paths": [2.0, 1.5], "sampled": [[1], [2]]},
        "search": {
            "unseparated": [],
            "single_layer": {"lm": [0.9, 0.8, 0.7, 0.95], "retrieval": [0.9, 0.3, 0.6, 0.8]},
            "important_layers": {"lm": [2, 1, 0, 3], "retrieval": [1, 2, 3, 0]},
        },
        "placements": {"learned": [1, 2], "uniform": [1, 3]},
        "supernet_gaps": {"learned": {"combined": 0.4}, "uniform": {"combined": 0.7}},
        "block_selection": {"original": probes, "ranked": [
            {"block": "gla", "scores": probes, "excess_loss": 0.5, "parameters": 10,
             "state_numel": 20, "final_train_loss": 1.0}]},
        "hardware": {
            "search": {"layer_types": ["attn", "jet", "jet", "attn"], "context": 4096,
                       "new_tokens": 8, "device": "cpu", "sliding_window": None,
                       "distill_config": {"layerwise_steps": 1, "end_to_end_steps": 0,
                                          "batch_size": 2, "lr": 1e-3, "temperature": 1.0,
                                          "hidden_weight": 1.0, "max_grad_norm": 1.0, "seed": 0},
                       "records": records},
            "front": records[1:],
        },
        "final": {name: {"heldout_loss": 3.0, "probes": probes}
                  for name in ("original", "learned", "uniform")},
        "decoding": {"original": decode, "learned": [{**d, "tokens_per_s": 12.0} for d in decode],
                     "uniform": decode},
    }  # fmt: skip


def test_postnas_claims_are_computed_from_the_measurements(tmp_path):
    results = write_results(tmp_path, {"postnas": measured()}, {"postnas": {}}, True, 1.0)
    claims = {claim.name: claim.measured for claim in results.claims}
    assert claims == {
        "learned placement beats uniform": pytest.approx(0.7 - 0.4),
        "retrieval depends on few layers": pytest.approx(1 - 0.3),
        "hardware-aware shape beats the default": pytest.approx(-2.5 - -3.0),
        "throughput is set by the state size": pytest.approx(8.0 / 12.0),
        "hybrid decodes faster": pytest.approx(12.0 / 4.0),
    }
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [c["name"] for c in saved["claims"]] == list(claims)
    for figure in ("postnas_importance.png", "postnas_supernet.png", "postnas_pareto.png"):
        assert (tmp_path / figure).stat().st_size > 0
    summary = (tmp_path / "summary.md").read_text()
    assert "learned [1, 2], uniform [1, 3]" in summary


def test_both_parts_write_one_results_file(tmp_path):
    decode = [{"context": c, "tokens_per_s": v, "cache_bytes": b}
              for c, v, b in ((1024, 10.0, 8), (65536, 1.0, 512))]  # fmt: skip
    jetblock = {
        "layer_types": ["attn", "jet"],
        "kept_attention_layers": [0],
        "heldout_loss": {"original": 2.0, "hybrid, initialised": 8.0, "hybrid, distilled": 3.0},
        "distill_history": {"layerwise": [1.0, 0.5], "end_to_end": [2.0]},
        "passkey": {"SmolLM2-135M (all attention)": [0.5], "hybrid": [0.0]},
        "decoding": {"SmolLM2-135M (all attention)": decode,
                     "hybrid": [{**d, "tokens_per_s": 4.0, "cache_bytes": 4} for d in decode]},
    }  # fmt: skip
    settings = {"jetblock": {"passkey_contexts": [256]}, "postnas": {}}
    results = write_results(tmp_path, {"jetblock": jetblock, "postnas": measured()}, settings,
                            True, 1.0)  # fmt: skip
    claims = {claim.name: claim.measured for claim in results.claims}
    assert claims["distillation closes the loss gap"] == pytest.approx((3.0 - 2.0) - (8.0 - 2.0))
    assert claims["decoding speed-up grows with context"] == pytest.approx((4.0 / 1.0) / 0.4)
    assert claims["hybrid decodes faster"] == pytest.approx(3.0)
    assert len(claims) == 4 + 5
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["settings"]) == {"jetblock", "postnas"}


def test_the_hardware_claims_need_the_default_shape(tmp_path):
    data = measured()
    data["hardware"]["search"]["records"] = data["hardware"]["search"]["records"][1:]
    with pytest.raises(ValueError, match=r"default shape \(9, 64, 64\)"):
        write_results(tmp_path, {"postnas": data}, {"postnas": {}}, True, 1.0)
