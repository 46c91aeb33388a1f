"""PostNAS hardware search: the state-size grid and the Pareto front against brute force, and a
search over a tiny random Llama whose hybrids are checked block by block (shape, state size,
parameters, cache bytes), resumed from its JSON file, and refused on bad input."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from jet_nemotron.distill import DistillConfig, heldout_loss, jet_blocks
from jet_nemotron.models import convert
from jet_nemotron.modules.jet_block import JetBlock
from jet_nemotron.postnas.hardware import (
    HardwareRecord,
    HardwareSearch,
    JetShape,
    plot_pareto,
    search_hardware,
    state_size_grid,
)

VOCAB, HIDDEN, CONTEXT = 64, 32, 12
LAYER_TYPES = ["attn", "jet", "jet"]
# three shapes of one 240-element state, with head dims (6, 30) and value dims that are not
# powers of 2
SHAPES = [JetShape(4, 6, 10), JetShape(3, 8, 10), JetShape(1, 30, 8)]
DISTILL = DistillConfig(layerwise_steps=2, end_to_end_steps=1, batch_size=2, seed=5)


@pytest.fixture(autouse=True)
def reference_ops(monkeypatch):
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "reference")


def teacher() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def rows(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, 10), generator=torch.Generator().manual_seed(seed))


def minus_heldout_loss(model) -> float:
    return -heldout_loss(model, rows(2, seed=9))


def run(shapes, caller_seed: int = 1, **options) -> HardwareSearch:
    """The search on the tiny teacher, the caller's global random state at ``caller_seed``
    (which the search must not depend on)."""
    model = teacher()
    torch.manual_seed(caller_seed)
    return search_hardware(
        model, LAYER_TYPES, shapes, rows(4, seed=3), quality=minus_heldout_loss,
        distill_config=DISTILL, context=CONTEXT, new_tokens=2, progress=False, **options,
    )  # fmt: skip


@pytest.fixture
def builds(monkeypatch):
    """Every hybrid the search builds, in order."""
    built = []
    build = convert.from_pretrained_llama

    def recording(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(convert, "from_pretrained_llama", recording)
    return built


def test_grid_is_the_brute_force_enumeration():
    heads, keys, values = [1, 2, 3, 4, 6, 2], [8, 16, 60, 100], [4, 10, 16, 20, 32, 40, 100]
    for state in (240, 256, 512, 6000, 2400):
        expected = sorted(
            {(h, k, v) for h, k, v in itertools.product(heads, keys, values) if h * k * v == state}
        )
        if not expected:
            with pytest.raises(ValueError, match="exactly"):
                state_size_grid(state, heads, keys, values)
            continue
        grid = state_size_grid(state, heads, keys, values)
        assert [(s.num_heads, s.head_dim, s.head_v_dim) for s in grid] == expected
        assert all(s.state_numel == state for s in grid)


def test_shape_config_has_the_asked_dims_and_rejects_shape_overrides():
    config = JetShape(3, 60, 100).jet_block_config(chunk_size=16)
    assert (config.num_heads, config.head_dim, config.head_v_dim) == (3, 60, 100)
    assert config.chunk_size == 16
    with pytest.raises(ValueError, match="set by the JetShape"):
        JetShape(1, 8, 8).jet_block_config(num_heads=2)
    with pytest.raises(ValueError, match="positive integer"):
        JetShape(0, 8, 8)


@pytest.mark.parametrize(
    "args",
    [(0, [1], [8], [8]), (64, [], [8], [8]), (64, [1, -2], [8], [8]), (64, [1], [8.0], [8])],
)
def test_grid_rejects_bad_input(args):
    with pytest.raises(ValueError, match="positive"):
        state_size_grid(*args)


def _record(tokens_per_s: float, quality: float) -> HardwareRecord:
    return HardwareRecord(1, 1, 1, 1, 0, quality, tokens_per_s, 0)


def test_pareto_front_is_the_brute_force_non_dominated_set():
    rng = random.Random(0)
    for trial in range(200):
        # few distinct values, so ties in one or both coordinates are frequent
        points = [(rng.randint(0, 5), rng.randint(0, 5)) for _ in range(rng.randint(1, 12))]
        search = HardwareSearch(LAYER_TYPES, 1, 1, "cpu", None, DISTILL)
        search.records = [_record(float(t), float(q)) for t, q in points]
        expected = [
            r
            for r in search.records
            if not any(
                o.tokens_per_s >= r.tokens_per_s
                and o.quality >= r.quality
                and (o.tokens_per_s > r.tokens_per_s or o.quality > r.quality)
                for o in search.records
            )
        ]
        front = search.pareto_front()
        assert sorted(map(id, front)) == sorted(map(id, expected)), (trial, points)
        speeds = [r.tokens_per_s for r in front]
        assert speeds == sorted(speeds)


def test_search_records_and_built_hybrids(builds, tmp_path):
    search = run(SHAPES)
    assert [r.shape for r in search.records] == SHAPES
    assert len(builds) == len(SHAPES)
    fresh = teacher()
    for shape, record, hybrid in zip(SHAPES, search.records, builds, strict=True):
        blocks = jet_blocks(hybrid)
        assert sorted(blocks) == [1, 2]
        x = torch.randn(1, 3, HIDDEN)
        params = 0
        for block in blocks.values():
            assert (block.config.num_heads, block.config.head_dim, block.config.head_v_dim) == (
                shape.num_heads, shape.head_dim, shape.head_v_dim,
            )  # fmt: skip
            _, state = block(x, use_cache=True)
            assert state.recurrent.shape == (1, shape.num_heads, shape.head_dim, shape.head_v_dim)
            assert state.recurrent[0].numel() == 240 == record.state_numel
            params += sum(p.numel() for p in JetBlock(HIDDEN, block.config).parameters())
        assert record.jet_params == params
        # the teacher's weights outside the JetBlocks are copied unchanged by distillation
        torch.testing.assert_close(
            hybrid.model.layers[0].self_attn.q_proj.weight,
            fresh.model.layers[0].self_attn.q_proj.weight, rtol=0, atol=0,
        )  # fmt: skip
        assert record.quality == minus_heldout_loss(hybrid)
        assert record.tokens_per_s > 0
        # float32: the attention layer's K and V of CONTEXT positions (4 kv heads of dim 8),
        # then per JetBlock the recurrent state and the (value_dim, conv_size=4) conv state
        kv = 2 * 4 * CONTEXT * 8
        jet = 2 * (240 + shape.num_heads * shape.head_v_dim * 4)
        assert record.cache_bytes == 4 * (kv + jet)
    assert json.loads(json.dumps(search.to_json())) == search.to_json()
    assert HardwareSearch.from_json(search.to_json()) == search
    figure = plot_pareto(search, tmp_path / "front.png")
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_skips_finished_shapes_with_the_same_results(builds, tmp_path):
    path = tmp_path / "search.json"
    first = run(SHAPES[:1], resume=path)
    assert len(builds) == 1
    saved = json.loads(path.read_text())
    assert [r["head_dim"] for r in saved["records"]] == [SHAPES[0].head_dim]
    second = run(SHAPES[:2], resume=path)
    assert len(builds) == 2  # only the second shape was built
    assert second.records[0] == first.records[0]
    # the same records (throughput aside: it is measured anew) as a search never interrupted,
    # in which the second shape was built after the first one's build and distillation
    whole = run(SHAPES[:2], caller_seed=2)
    for resumed, uninterrupted in zip(second.records, whole.records, strict=True):
        assert resumed.quality == uninterrupted.quality
        assert resumed.jet_params == uninterrupted.jet_params
        assert resumed.cache_bytes == uninterrupted.cache_bytes
    assert len(json.loads(path.read_text())["records"]) == 2
    with pytest.raises(ValueError, match="another setup"):
        search_hardware(
            teacher(), LAYER_TYPES, SHAPES[:1], rows(4, seed=3), quality=minus_heldout_loss,
            distill_config=DISTILL, context=CONTEXT + 1, new_tokens=2, resume=path,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"layer_types": ["attn", "attn", "attn"]}, ValueError, "no 'jet' layer"),
        ({"layer_types": ["attn", "jet"]}, ValueError, "one type per layer"),
        ({"shapes": []}, TypeError, "non-empty sequence of JetShape"),
        ({"shapes": [(4, 6, 10)]}, TypeError, "JetShape"),
        ({"shapes": [SHAPES[0], SHAPES[0]]}, ValueError, "repeat"),
        ({"shapes": [SHAPES[0], JetShape(1, 8, 8)]}, ValueError, "one state size"),
        ({"shapes": [JetShape(1, 8, 4)]}, ValueError, "dconv_generator_reduction"),
        ({"context": 0}, ValueError, "context must be a positive integer"),
        ({"new_tokens": 1.5}, ValueError, "new_tokens must be a positive integer"),
        ({"quality": 1.0}, TypeError, "quality must be a callable"),
        ({"quality": lambda model: float("nan")}, ValueError, "must be finite"),
        ({"teacher": object()}, TypeError, "teacher must be"),
    ],
)
def test_search_rejects_bad_input(changes, error, match):
    arguments = {
        "teacher": teacher(), "layer_types": LAYER_TYPES, "shapes": SHAPES[:1],
        "train_rows": rows(4, seed=3), "quality": minus_heldout_loss, "distill_config": DISTILL,
        "context": CONTEXT, "new_tokens": 2, "progress": False,
    } | changes  # fmt: skip
    with pytest.raises(error, match=match):
        search_hardware(**arguments)


def test_plot_and_from_json_reject_bad_input(tmp_path):
    empty = HardwareSearch(LAYER_TYPES, 1, 1, "cpu", None, DISTILL)
    with pytest.raises(ValueError, match="no records"):
        plot_pareto(empty, tmp_path / "front.png")
    with pytest.raises(ValueError, match="exactly the fields"):
        HardwareSearch.from_json({"records": []})
