"""The decoding benchmark's synthetic caches and the command line, on tiny models."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from jet_nemotron.__main__ import main
from jet_nemotron.bench.generation import _estimated_bytes, decode_point, filled_cache
from jet_nemotron.models.convert import from_pretrained_llama
from jet_nemotron.models.modeling import HybridForCausalLM


@pytest.fixture(autouse=True)
def reference_ops(monkeypatch):
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "reference")


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def test_filled_caches_hold_the_hand_counted_bytes():
    source = llama()
    hybrid = from_pretrained_llama(source, ["attn", "jet", "swa"], sliding_window=8)
    context = 50
    # attention: K and V of (1, 1 kv head, positions, head dim 16), float32
    kv = 2 * 1 * context * 16 * 4
    jet = hybrid.model.layers[1].self_attn.config
    state = jet.num_heads * jet.head_dim * jet.head_v_dim * 4 + jet.value_dim * jet.conv_size * 4
    window = 2 * 1 * 7 * 16 * 4  # a sliding window keeps its last window - 1 positions
    assert filled_cache(hybrid, context).cache_bytes() == kv + state + window
    assert _estimated_bytes(source, context, 1) == 3 * kv
    assert decode_point(source, context, new_tokens=2).cache_bytes == 3 * kv  # before decoding


def test_decoding_from_a_filled_cache_runs_for_both_models():
    source = llama()
    hybrid = from_pretrained_llama(source, ["attn", "jet", "jet"])
    for model in (source, hybrid):
        point = decode_point(model, 20, new_tokens=2)
        assert point.context == 20
        assert point.tokens_per_s > 0
        # a real prefill of 20 tokens leaves a cache of the same size as the filled one
        assert decode_point(model, 20, 2, real_prefill=True).cache_bytes == point.cache_bytes


def test_convert_command_writes_a_loadable_hybrid(tmp_path):
    source = llama()
    source.save_pretrained(tmp_path / "source")
    code = main(["convert", "--source", str(tmp_path / "source"), "--attention-layers", "0",
                 "--out", str(tmp_path / "hybrid")])  # fmt: skip
    assert code == 0
    loaded = HybridForCausalLM.from_pretrained(tmp_path / "hybrid")
    assert loaded.config.layer_types == ["attn", "jet", "jet"]
    ids = torch.randint(0, 64, (1, 7))
    expected = from_pretrained_llama(source, ["attn", "jet", "jet"])
    with torch.no_grad():
        # the JetBlocks' own parameters are random: compare the copied attention layer's output
        torch.testing.assert_close(
            loaded.model.embed_tokens(ids), expected.model.embed_tokens(ids), rtol=0, atol=0
        )
        assert torch.equal(
            loaded.model.layers[0].self_attn.q_proj.weight,
            source.model.layers[0].self_attn.q_proj.weight,
        )


def test_bad_command_lines_exit_with_one_line(tmp_path, capsys):
    source = llama()
    source.save_pretrained(tmp_path / "source")
    code = main(["convert", "--source", str(tmp_path / "source"), "--attention-layers", "7",
                 "--out", str(tmp_path / "hybrid")])  # fmt: skip
    assert code == 2
    assert "outside 0..2" in capsys.readouterr().err
    code = main(["convert", "--source", str(tmp_path / "source"), "--layer-types", "attn",
                 "--out", str(tmp_path / "hybrid")])  # fmt: skip
    assert code == 2
    assert "needs 3 entries" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "everything"])
    assert not (tmp_path / "hybrid").exists()


def test_readme_example_runs():
    from pathlib import Path

    from kernels_common.testing import run_markdown_python

    namespace = run_markdown_python(Path(__file__).resolve().parent.parent / "README.md")
    # the example's chunked and recurrent outputs are one function
    torch.testing.assert_close(namespace["o"], namespace["o_rec"], rtol=1e-4, atol=1e-4)
