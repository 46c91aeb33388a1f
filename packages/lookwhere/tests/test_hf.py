"""DINOv2-with-registers weights from a Hugging Face folder give the HF model's outputs."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from lookwhere.hf import load_dinov2, lookwhere_from_dinov2

ATOL = 1e-5  # float32, the same operations


def _saved(model_class, config, tmp_path_factory, seed):
    """A `model_class` with random, non-trivial weights everywhere, saved to a fresh folder."""
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    folder = tmp_path_factory.mktemp(config.model_type)
    model.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    config = transformers.Dinov2WithRegistersConfig(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        mlp_ratio=4,
        patch_size=4,
        image_size=32,
        num_register_tokens=4,
        layerscale_value=0.5,
    )
    return _saved(transformers.Dinov2WithRegistersModel, config, tmp_path_factory, seed=0)


@pytest.mark.parametrize("size", [32, 24, 48])
def test_loaded_vit_equals_the_hf_model(hf_folder, size):
    folder, hf = hf_folder
    images = torch.randn(2, 3, size, size)
    ours = load_dinov2(folder, image_size=size)
    with torch.no_grad():
        expect = hf(pixel_values=images).last_hidden_state
        out = ours(images)
    assert torch.allclose(out.cls, expect[:, 0], atol=ATOL)
    assert torch.allclose(out.registers, expect[:, 1:5], atol=ATOL)
    assert torch.allclose(out.patches, expect[:, 5:], atol=ATOL)


@pytest.fixture(scope="module")
def plain_dinov2_folder(tmp_path_factory):
    config = transformers.Dinov2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        patch_size=4,
        image_size=32,
        layerscale_value=0.5,
    )
    return _saved(transformers.Dinov2Model, config, tmp_path_factory, seed=1)


@pytest.mark.parametrize("size", [32, 16, 24, 48])
def test_plain_dinov2_equals_the_hf_model_at_any_resolution(plain_dinov2_folder, size):
    # Dinov2Model resizes its position embeddings without antialiasing (Dinov2WithRegistersModel
    # with it): shrinking to 16 or 24 px differs between the two by far more than ATOL
    folder, hf = plain_dinov2_folder
    images = torch.randn(2, 3, size, size)
    ours = load_dinov2(folder, image_size=size)
    assert not ours.config.pos_antialias
    assert ours.config.num_registers == 0
    with torch.no_grad():
        expect = hf(pixel_values=images).last_hidden_state
        out = ours(images)
    assert torch.allclose(out.cls, expect[:, 0], atol=ATOL)
    assert torch.allclose(out.patches, expect[:, 1:], atol=ATOL)


def test_transformers_5_key_names_load_the_same(hf_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    folder, _ = hf_folder
    weights = load_file(str(folder / "model.safetensors"))
    renamed = {
        key.replace("attention.attention.query", "attention.q_proj")
        .replace("attention.attention.key", "attention.k_proj")
        .replace("attention.attention.value", "attention.v_proj")
        .replace("attention.output.dense", "attention.o_proj"): value
        for key, value in weights.items()
    }
    assert renamed.keys() != weights.keys()
    save_file(renamed, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(load_dinov2(tmp_path)(images).cls, load_dinov2(folder)(images).cls)


def test_lookwhere_from_dinov2_extractor_is_the_teacher(hf_folder):
    folder, hf = hf_folder
    teacher, model = lookwhere_from_dinov2(
        folder, image_size=32, selector_depth=2, k=64, normalize=False
    )
    assert model.selector.vit.config.depth == 2
    assert model.selector.image_size == 8
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expect = hf(pixel_values=images).last_hidden_state
        out = model.extractor(images, teacher.prefix(2), torch.arange(64).expand(2, -1))
    assert torch.allclose(out.patches, expect[:, 5:], atol=ATOL)
    assert not any(p.requires_grad for p in teacher.parameters())


def test_bad_folders_are_refused(hf_folder, tmp_path):
    folder, _ = hf_folder
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_dinov2(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "vit"}))
    with pytest.raises(ValueError, match="'vit'"):
        load_dinov2(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        load_dinov2(tmp_path)


def test_normalization_folded_into_the_patch_embedding(hf_folder):
    folder, hf = hf_folder
    images = torch.rand(2, 3, 32, 32)  # [0, 1] pixels
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    with torch.no_grad():
        expect = hf(pixel_values=(images - mean) / std).last_hidden_state
        out = load_dinov2(folder, normalize=True)(images)
    assert torch.allclose(out.cls, expect[:, 0], atol=ATOL)
    assert torch.allclose(out.patches, expect[:, 5:], atol=ATOL)


def test_lookwhere_from_dinov2_resizes_the_checkpoints_own_position_embeddings(hf_folder):
    from lookwhere.vit import resize_pos_embed

    folder, hf = hf_folder
    _, model = lookwhere_from_dinov2(folder, image_size=48, selector_size=12, normalize=False)
    native = hf.embeddings.position_embeddings[:, 1:].detach()  # the 8x8 grid it was saved with
    expect = resize_pos_embed(native, (3, 3), antialias=True)
    assert torch.allclose(model.selector.vit.pos_embed, expect, atol=1e-6)
    assert torch.allclose(
        model.extractor.vit.pos_embed, resize_pos_embed(native, (12, 12), antialias=True), atol=1e-6
    )
