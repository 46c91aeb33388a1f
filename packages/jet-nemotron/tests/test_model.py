"""Hybrid causal LM: masks, cache, generation, attention kernels, saving, loss and bad input.

JetBlocks run their PyTorch reference ops here (their kernels have their own tests).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from jet_nemotron.models.attention import attention_mask_for, visible_positions
from jet_nemotron.models.cache import HybridCache
from jet_nemotron.models.configuration import HybridConfig
from jet_nemotron.models.modeling import CACHE_FIELD, HybridForCausalLM

# float32 on O(1) activations: two kernels or cached vs recomputed passes differ only in the
# summation order of a few hundred terms (~1e-7 relative each)
ATOL = RTOL = 1e-5
MIXED = ["attn", "swa", "jet", "swa"]
VOCAB = 96


@pytest.fixture(autouse=True)
def reference_ops(monkeypatch):
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "reference")


def config(layer_types=MIXED, implementation="sdpa", **overrides) -> HybridConfig:
    fields = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": len(layer_types),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "layer_types": list(layer_types),
        "sliding_window": 3,
        "jet_block": {"num_heads": 2, "head_dim": 16, "expand_v": 1.0, "chunk_size": 16},
        "pad_token_id": 0,
        **overrides,
    }
    result = HybridConfig(**fields)
    result._attn_implementation = implementation
    return result


def model(layer_types=MIXED, implementation="sdpa", seed=0, **overrides) -> HybridForCausalLM:
    torch.manual_seed(seed)
    return HybridForCausalLM(config(layer_types, implementation, **overrides)).eval()


def tokens(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def left_pad(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded batch and its attention mask. The padding is a real token (7), not the pad
    id whose embedding is zero: a zero input would leave a JetBlock unchanged even unmasked."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), 7, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :], mask[i, width - len(row) :] = row, 1
    return ids, mask


# ---------------------------------------------------------------- masks


def brute_force_visible(padding, batch, q_len, past, kv_len, window):
    out = torch.zeros(batch, 1, q_len, kv_len, dtype=torch.bool)
    for b, i, j in itertools.product(range(batch), range(q_len), range(kv_len)):
        q_pos, k_pos = past + i, past + q_len - kv_len + j
        ok = k_pos <= q_pos and (window is None or q_pos - k_pos < window)
        out[b, 0, i, j] = ok and (padding is None or bool(padding[b, k_pos]))
    return out


@pytest.mark.parametrize(
    ("q_len", "past", "kv_len", "window"),
    [(6, 0, 6, None), (6, 0, 6, 2), (1, 7, 8, None), (1, 7, 3, 3), (4, 5, 6, 3), (3, 2, 5, 1)],
)
@pytest.mark.parametrize("padded", [False, True])
def test_visible_positions_match_a_brute_force_mask(q_len, past, kv_len, window, padded):
    padding = None
    if padded:
        padding = torch.ones(2, past + q_len, dtype=torch.long)
        padding[1, :2] = 0
    expected = brute_force_visible(padding, 2, q_len, past, kv_len, window)
    actual = visible_positions(padding, 2, q_len, past, kv_len, window)
    assert torch.equal(actual, expected)
    eager = attention_mask_for("eager", padding, 2, q_len, past, kv_len, window, torch.float32)
    assert torch.equal(eager == 0, expected)
    assert torch.all(eager[~expected] == torch.finfo(torch.float32).min)
    sdpa = attention_mask_for("sdpa", padding, 2, q_len, past, kv_len, window, torch.float32)
    # no mask only where SDPA's causal flag (q > 1) or attending to everything (q == 1) is exact
    if sdpa is None:
        assert not padded
        assert q_len in (1, kv_len)
        assert torch.equal(expected, visible_positions(None, 2, q_len, past, kv_len, None))
        assert q_len > 1 or bool(expected.all())
    else:
        assert torch.equal(sdpa, expected)


# ---------------------------------------------------------------- generation and cache


def test_greedy_generation_with_cache_equals_recomputing_everything():
    lm = model()
    prompt = tokens(2, 6)
    with torch.no_grad():
        cached = lm.generate(prompt, max_new_tokens=8, do_sample=False)
        recomputed = lm.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=False)
    assert cached.shape == (2, 14)
    assert torch.equal(cached, recomputed)


def test_left_padded_rows_generate_what_each_row_generates_alone():
    lm = model()
    rows = [tokens(1, 4, seed=2)[0], tokens(1, 7, seed=3)[0], tokens(1, 1, seed=4)[0]]
    ids, mask = left_pad(rows)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = lm(ids, attention_mask=mask, position_ids=positions).logits
        batch = lm.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
        for i, row in enumerate(rows):
            torch.testing.assert_close(
                logits[i, -len(row) :], lm(row[None]).logits[0], atol=ATOL, rtol=RTOL
            )
            alone = lm.generate(row[None], max_new_tokens=8, do_sample=False)
            assert torch.equal(batch[i, -8:], alone[0, -8:]), f"row {i}"


def test_beam_search_reorders_the_cache():
    lm = model(["jet", "attn", "swa"])
    prompt = tokens(2, 5, seed=5)
    options = {"max_new_tokens": 4, "num_beams": 3, "do_sample": False}
    with torch.no_grad():
        cached = lm.generate(prompt, **options)
        recomputed = lm.generate(prompt, use_cache=False, **options)
    assert torch.equal(cached, recomputed)


def test_sliding_window_cache_stays_bounded_and_decodes_like_a_full_pass():
    window = 3
    lm = model(["swa", "attn", "swa"], sliding_window=window)
    sequence = tokens(2, 11, seed=6)
    with torch.no_grad():
        full = lm(sequence, use_cache=False).logits
        out = lm(sequence[:, :5], use_cache=True)
        cache = getattr(out, CACHE_FIELD)
        stepped = [out.logits]
        for t in range(5, 11):
            out = lm(sequence[:, t : t + 1], cache=cache, use_cache=True)
            stepped.append(out.logits)
            assert cache.kept_length(0) == cache.kept_length(2) == window - 1
            assert cache.kept_length(1) == t + 1
            assert cache.get_seq_length() == t + 1
    torch.testing.assert_close(torch.cat(stepped, dim=1), full, atol=ATOL, rtol=RTOL)


def test_cache_bytes_is_the_hand_count():
    lm = model(sliding_window=3)
    B, T, kv_heads, head_dim = 2, 6, 2, 8
    with torch.no_grad():
        cache = getattr(lm(tokens(B, T), use_cache=True), CACHE_FIELD)
    float_bytes = 4
    attn = 2 * B * kv_heads * T * head_dim * float_bytes  # keys + values of every position
    swa = 2 * B * kv_heads * (3 - 1) * head_dim * float_bytes  # the last window - 1 positions
    value_dim, conv_size = 2 * 16, 4
    jet = (B * 2 * 16 * 16 + B * value_dim * conv_size) * float_bytes  # recurrent + conv states
    assert cache.cache_bytes() == attn + 2 * swa + jet
    assert cache.batch_size == B


def test_cache_reorder_and_repeat_follow_the_batch_index():
    lm = model()
    with torch.no_grad():
        cache = getattr(lm(tokens(3, 4), use_cache=True), CACHE_FIELD)
    keys, state = cache.key_cache[0].clone(), cache.jet_states[2].recurrent.clone()
    cache.reorder_cache(torch.tensor([2, 0, 0]))
    assert torch.equal(cache.key_cache[0], keys[[2, 0, 0]])
    assert torch.equal(cache.jet_states[2].recurrent, state[[2, 0, 0]])
    cache.batch_repeat_interleave(2)
    assert torch.equal(cache.jet_states[2].recurrent, state[[2, 2, 0, 0, 0, 0]])
    with pytest.raises(NotImplementedError, match="cannot be cropped"):
        cache.crop(-1)
    with pytest.raises(ValueError, match="'jet' layer"):
        cache.update(keys, keys, layer_idx=2)


# ---------------------------------------------------------------- kernels, saving, loss


@pytest.mark.parametrize("window", [None, 2])
def test_eager_and_sdpa_agree_with_padding_and_decoding(window):
    layer_types = ["attn", "attn"] if window is None else ["swa", "attn"]
    ids, prompt_mask = left_pad([tokens(1, 6, seed=7)[0], tokens(1, 4, seed=8)[0]])
    mask = torch.cat([prompt_mask, torch.ones(2, 2, dtype=torch.long)], dim=1)
    outputs = []
    for implementation in ("eager", "sdpa"):
        lm = model(layer_types, implementation, sliding_window=window)
        with torch.no_grad():
            out = lm(ids, attention_mask=prompt_mask, use_cache=True)
            logits = [out.logits]
            for step in range(2):  # two decoding steps with the cache
                width = ids.shape[1] + step + 1
                nxt = torch.full((2, 1), 5 + step)
                out = lm(nxt, attention_mask=mask[:, :width], cache=getattr(out, CACHE_FIELD))
                logits.append(out.logits)
        outputs.append(torch.cat(logits, dim=1))
    # padded positions attend to nothing: eager averages them, SDPA zeroes them; they never
    # reach a real position, so only real positions are compared
    real = mask.bool()
    torch.testing.assert_close(outputs[0][real], outputs[1][real], atol=ATOL, rtol=RTOL)


def test_save_and_load_give_identical_logits(tmp_path):
    lm = model(tie_word_embeddings=True)
    lm.save_pretrained(tmp_path)
    loaded = HybridForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.layer_types == MIXED
    assert loaded.config.to_dict()["jet_block"] == lm.config.jet_block
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    ids = tokens(2, 9)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, lm(ids).logits)


def test_loss_is_the_shifted_cross_entropy_and_logits_to_keep_slices():
    lm = model()
    ids = tokens(2, 7)
    labels = ids.clone()
    labels[0, :2] = -100
    out = lm(ids, labels=labels)
    expected = F.cross_entropy(
        out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    torch.testing.assert_close(out.loss, expected)
    with torch.no_grad():
        last = lm(ids, logits_to_keep=2).logits
        picked = lm(ids, logits_to_keep=torch.tensor([0, 3])).logits
    assert torch.equal(last, out.logits[:, -2:].detach())
    assert torch.equal(picked, out.logits[:, [0, 3]].detach())
    assert isinstance(lm(ids, return_dict=False), tuple)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"layer_types": ["attn", "mamba", "jet", "swa"]}, "unknown layer types"),
        ({"layer_types": ["attn", "jet"], "num_hidden_layers": 4}, "num_hidden_layers is 4"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"sliding_window": None}, "give sliding_window"),
        ({"sliding_window": 0}, "sliding_window must be a positive integer"),
        ({"hidden_act": "swishy"}, "unknown hidden_act"),
        ({"head_dim": 7}, "head_dim must be even"),
        ({"jet_block": {"num_heads": 2, "head_size": 16}}, "unknown JetBlockConfig fields"),
    ],
)
def test_bad_configs_say_what_is_wrong(overrides, message):
    with pytest.raises(ValueError, match=message):
        config(**overrides)


def test_bad_forward_inputs_say_what_is_wrong():
    lm = model()
    ids = tokens(2, 5)
    with pytest.raises(ValueError, match=r"attention_mask must be 2D \(B, past \+ T\)"):
        lm(ids, attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        lm()
    with pytest.raises(TypeError, match="needs a HybridCache"):
        lm(ids, cache=object())
    with pytest.raises(ValueError, match="not supported by the hybrid model"):
        attention_mask_for("flash_attention_2", None, 1, 2, 0, 2, None, torch.float32)
    with pytest.raises(ValueError, match="does not return attention weights"):
        lm(ids, output_attentions=True)
    assert HybridCache(lm.config).get_seq_length() == 0
