"""Conversion of Llama / Qwen2 causal LMs into hybrids: exact reproduction, JetBlock
initialisation from attention, freezing and bad input."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from jet_nemotron.models.convert import from_pretrained_llama

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 96, 64, 4, 2, 16
SIZES = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
}


@pytest.fixture(autouse=True)
def reference_ops(monkeypatch):
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "reference")


def llama(implementation: str = "sdpa", dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(**SIZES, tie_word_embeddings=True, rope_theta=500.0)
    config._attn_implementation = implementation
    return LlamaForCausalLM(config).to(dtype).eval()


def qwen2(implementation: str) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(**SIZES)
    config._attn_implementation = implementation
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # random q/k/v biases (they start at zero), so that they matter
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_()
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 9 tokens, the second left-padded by 3."""
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    return ids, mask


@pytest.mark.parametrize(
    ("source", "dtype"),
    [("llama", torch.float32), ("llama", torch.bfloat16), ("qwen2", torch.float32)],
)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_all_attention_hybrid_reproduces_the_source_logits_exactly(source, dtype, implementation):
    original = llama(implementation, dtype) if source == "llama" else qwen2(implementation)
    hybrid = from_pretrained_llama(original, ["attn"] * 3)
    assert hybrid.config._attn_implementation == implementation
    assert hybrid.dtype == dtype
    assert not hybrid.training
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(hybrid(ids).logits, original(ids).logits)
        assert torch.equal(
            hybrid(ids, attention_mask=mask).logits, original(ids, attention_mask=mask).logits
        )
        options = {"attention_mask": mask, "max_new_tokens": 5, "do_sample": False}
        assert torch.equal(hybrid.generate(ids, **options), original.generate(ids, **options))


def test_smollm2_all_attention_hybrid_reproduces_its_logits_exactly():
    benchdata = pytest.importorskip("benchdata")
    model, tokenizer = benchdata.smollm2_135m()
    hybrid = from_pretrained_llama(model, ["attn"] * model.config.num_hidden_layers)
    prompt = tokenizer(
        ["The capital of France is Paris, and the capital of Italy is", "Water boils at"],
        return_tensors="pt",
        padding=True,
        padding_side="left",
    )
    with torch.no_grad():
        assert torch.equal(hybrid(**prompt).logits, model(**prompt).logits)


def heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    return x.unflatten(-1, (-1, head_dim))


@pytest.mark.parametrize("expand_v", [1.0, 2.0])
def test_jet_blocks_start_from_the_attention_they_replace(expand_v):
    original = llama()
    jet_block = {"num_heads": HEADS, "head_dim": HEAD_DIM, "expand_v": expand_v, "chunk_size": 16}
    hybrid = from_pretrained_llama(
        original, ["attn", "jet", "swa"], jet_block=jet_block, sliding_window=4
    )
    attention, block = original.model.layers[1].self_attn, hybrid.model.layers[1].self_attn
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(2))
    group = HEADS // KV_HEADS
    with torch.no_grad():
        torch.testing.assert_close(block.q_proj(x), attention.q_proj(x), atol=0, rtol=0)
        k_att, k_jet = heads(attention.k_proj(x), HEAD_DIM), heads(block.k_proj(x), HEAD_DIM)
        v_att = heads(attention.v_proj(x), HEAD_DIM)
        v_jet = heads(block.v_proj(x), int(HEAD_DIM * expand_v))
        for h in range(HEADS):  # query head h reads key/value head h // group in attention
            assert torch.equal(k_jet[:, h], k_att[:, h // group])
            tiled = torch.cat([v_att[:, h // group]] * int(expand_v), dim=-1)
            assert torch.equal(v_jet[:, h], tiled)
    assert torch.equal(block.o_proj.weight, attention.o_proj.weight) == (expand_v == 1.0)
    # every other layer is copied: the attention of the "swa" layer, all MLPs and norms
    assert torch.equal(
        hybrid.model.layers[2].self_attn.k_proj.weight,
        original.model.layers[2].self_attn.k_proj.weight,
    )
    assert torch.equal(
        hybrid.model.layers[1].mlp.up_proj.weight, original.model.layers[1].mlp.up_proj.weight
    )


def test_without_init_from_attention_the_block_keeps_its_own_weights():
    original = llama()
    hybrid = from_pretrained_llama(original, ["attn", "jet", "attn"], init_from_attention=False)
    block = hybrid.model.layers[1].self_attn
    assert not torch.equal(block.q_proj.weight, original.model.layers[1].self_attn.q_proj.weight)


@pytest.mark.parametrize("freeze_mlp", [True, False])
def test_freeze_mlp_freezes_exactly_the_mlps(freeze_mlp):
    hybrid = from_pretrained_llama(llama(), ["attn", "jet", "attn"], freeze_mlp=freeze_mlp)
    frozen = {name for name, p in hybrid.named_parameters() if not p.requires_grad}
    mlps = {name for name, _ in hybrid.named_parameters() if ".mlp." in name}
    assert frozen == (mlps if freeze_mlp else set())
    assert len(mlps) == 9


def test_bad_conversions_say_what_is_wrong():
    original = llama()
    with pytest.raises(TypeError, match="model_type in"):
        from_pretrained_llama(torch.nn.Linear(2, 2), ["attn"])
    with pytest.raises(TypeError, match="no lm_head"):
        from_pretrained_llama(original.model, ["attn"] * 3)
    with pytest.raises(ValueError, match="num_hidden_layers is 3"):
        from_pretrained_llama(original, ["attn", "jet"])
    with pytest.raises(ValueError, match="unknown layer types"):
        from_pretrained_llama(original, ["attn", "gdn", "attn"])
    with pytest.raises(ValueError, match="give sliding_window"):
        from_pretrained_llama(original, ["attn", "swa", "attn"])
    with pytest.raises(ValueError, match="needs its q/k projections to be the attention's"):
        from_pretrained_llama(
            original, ["attn", "jet", "attn"], jet_block={"num_heads": 2, "head_dim": 16}
        )
    windowed = Qwen2Config(**SIZES, use_sliding_window=True, sliding_window=4)
    with pytest.raises(ValueError, match="sliding-window attention layers"):
        from_pretrained_llama(Qwen2ForCausalLM(windowed), ["attn"] * 3)
