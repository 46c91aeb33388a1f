"""The PostNAS super-network: the all-attention path is the original model exactly, paths are
seeded and cover every layer, only the linear blocks train, a resumed run is bit-exact, and a
path's conversion to a hybrid computes what the path computes."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from jet_nemotron.postnas import supernet as supernet_module
from jet_nemotron.postnas.supernet import (
    SupernetTrainConfig,
    SuperNetwork,
    batch_at,
    check_budget,
    from_checkpoint,
    sample_path,
    train_supernet,
    uniform_placement,
)

VOCAB = 64


@pytest.fixture(autouse=True)
def reference_ops(monkeypatch):
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "reference")


def llama(layers: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def rows(n: int = 12, length: int = 20) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(3))


def test_all_attention_path_is_the_original_model_exactly():
    ids = rows(2)
    qwen = Qwen2ForCausalLM(
        Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2)
    ).eval()  # fmt: skip
    for model in (llama(), qwen):
        supernet = SuperNetwork(model)
        assert supernet.current_path == tuple(range(supernet.num_layers))
        with torch.no_grad():
            expected = model(input_ids=ids).logits
            assert torch.equal(supernet(ids).logits, expected)
            with supernet.path([0]):  # a different path changes the output ...
                assert not torch.allclose(supernet(ids).logits, expected)
        assert supernet.current_path == tuple(range(supernet.num_layers))  # ... and is undone


def test_smollm2_all_attention_path_is_smollm2_exactly():
    import benchdata

    model = benchdata.smollm2_135m().model.eval()
    ids = torch.tensor([[1, 504, 3458, 282, 2102, 314, 28, 30]])
    supernet = SuperNetwork(model)
    with torch.no_grad():
        assert torch.equal(supernet(ids).logits, model(input_ids=ids).logits)


def test_path_scores_what_its_hybrid_computes():
    model, ids = llama(), rows(2)
    supernet = SuperNetwork(model)
    train_supernet(supernet, rows(), SupernetTrainConfig(layerwise_steps=2, path_steps=2,
                                                         batch_size=2))  # fmt: skip
    hybrid = supernet.to_hybrid([1, 3])
    assert hybrid.config.layer_types == ["jet", "attn", "jet", "attn"]
    with torch.no_grad(), supernet.path([1, 3]):
        # the path and the hybrid run the same blocks with the same weights; the hybrid's
        # JetBlocks are separate modules (copies), so agreement to float32 rounding
        torch.testing.assert_close(
            hybrid(input_ids=ids, use_cache=False).logits, supernet(ids).logits,
            rtol=1e-5, atol=1e-5,
        )  # fmt: skip


def test_sampled_paths_are_seeded_bounded_and_cover_every_layer():
    config = SupernetTrainConfig(min_attention=1, max_attention=3, seed=5)
    paths = [sample_path(10, config, step) for step in range(200)]
    assert paths == [sample_path(10, config, step) for step in range(200)]
    assert paths != [sample_path(10, SupernetTrainConfig(seed=6), s) for s in range(200)]
    assert {len(p) for p in paths} == {1, 2, 3}
    for layer in range(10):
        assert any(layer in p for p in paths)
        assert any(layer not in p for p in paths)
    fixed = SupernetTrainConfig(fixed_path=(4, 2))
    assert {sample_path(10, fixed, s) for s in range(5)} == {(2, 4)}


def test_batches_walk_a_permutation_per_epoch():
    data = torch.arange(10)[:, None].repeat(1, 3)
    epoch = torch.cat([batch_at(data, 3, seed=1, step=s) for s in range(3)])[:, 0]
    assert len(set(epoch.tolist())) == 9  # 3 full batches, no repeat, the 10th row dropped
    assert torch.equal(batch_at(data, 3, 1, 4), batch_at(data, 3, 1, 4))


def test_only_the_linear_blocks_train():
    model = llama()
    supernet = SuperNetwork(model)
    before = {k: v.clone() for k, v in supernet.linear_state_dict().items()}
    history = train_supernet(
        supernet, rows(), SupernetTrainConfig(layerwise_steps=2, path_steps=3, batch_size=2)
    )
    assert len(history.layerwise) == 2
    assert len(history.paths) == 3 == len(history.sampled)
    assert torch.equal(supernet(rows(2)).logits, model(input_ids=rows(2)).logits)  # original kept
    after = supernet.linear_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not any(p.requires_grad for p in supernet.parameters())


def test_fixed_path_trains_only_its_linear_layers():
    supernet = SuperNetwork(llama())
    before = {k: v.clone() for k, v in supernet.linear_state_dict().items()}
    config = SupernetTrainConfig(layerwise_steps=2, path_steps=2, batch_size=2, fixed_path=(1,))
    history = train_supernet(supernet, rows(), config)
    assert history.sampled == [[1], [1]]
    after = supernet.linear_state_dict()
    for key in before:
        assert torch.equal(before[key], after[key]) == key.startswith("1.")


def test_resumed_training_is_bit_exact(tmp_path, monkeypatch):
    config = SupernetTrainConfig(layerwise_steps=3, path_steps=4, batch_size=2, save_every=2)
    straight = SuperNetwork(llama())
    expected = train_supernet(straight, rows(), config)

    calls = {"n": 0}
    step = supernet_module.optimizer_step

    def interrupted(*args, **kwargs):
        if calls["n"] == 5:
            raise KeyboardInterrupt
        calls["n"] += 1
        step(*args, **kwargs)

    checkpoint = tmp_path / "supernet.pt"
    first = SuperNetwork(llama())
    monkeypatch.setattr(supernet_module, "optimizer_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_supernet(first, rows(), config, checkpoint=checkpoint)
    monkeypatch.setattr(supernet_module, "optimizer_step", step)
    assert supernet_module.load_checkpoint(checkpoint)["step"] == 4
    resumed = SuperNetwork(llama())
    history = train_supernet(resumed, rows(), config, checkpoint=checkpoint)
    assert history == expected
    want = straight.linear_state_dict()
    assert all(torch.equal(v, want[k]) for k, v in resumed.linear_state_dict().items())
    loaded = from_checkpoint(llama(), checkpoint)
    assert all(torch.equal(v, want[k]) for k, v in loaded.linear_state_dict().items())

    other = SupernetTrainConfig(layerwise_steps=3, path_steps=5, batch_size=2, save_every=2)
    with pytest.raises(ValueError, match="written by another run"):
        train_supernet(SuperNetwork(llama()), rows(), other, checkpoint=checkpoint)


def test_bad_input_is_refused():
    supernet = SuperNetwork(llama())
    with pytest.raises(ValueError, match=r"not layer indices in 0\.\.3"):
        supernet.set_path([4])
    with pytest.raises(ValueError, match="unknown"):
        SuperNetwork(llama(), "lstm")
    with pytest.raises(TypeError, match="model_type"):
        SuperNetwork(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="builds JetBlock hybrids"):
        SuperNetwork(llama(), "gla").to_hybrid([0])
    with pytest.raises(ValueError, match="N >= batch_size"):
        train_supernet(supernet, rows(1), SupernetTrainConfig(batch_size=2))
    with pytest.raises(ValueError, match="no linear block to train"):
        train_supernet(supernet, rows(), SupernetTrainConfig(batch_size=2, fixed_path=(0, 1, 2, 3)))
    with pytest.raises(ValueError, match="exceeds the model's 4 layers"):
        train_supernet(supernet, rows(), SupernetTrainConfig(min_attention=5, max_attention=6))
    with pytest.raises(ValueError, match="max_attention"):
        SupernetTrainConfig(min_attention=3, max_attention=2)
    with pytest.raises(ValueError, match=r"in 1\.\.4"):
        check_budget(5, 4)
    with pytest.raises(ValueError, match="without a cache"), torch.no_grad(), supernet.path([]):
        supernet.model(input_ids=rows(1), use_cache=True)


def test_uniform_placement_spreads_layers_evenly():
    assert uniform_placement(30, 2) == (7, 22)
    assert uniform_placement(30, 3) == (5, 15, 25)
    assert uniform_placement(4, 4) == (0, 1, 2, 3)
