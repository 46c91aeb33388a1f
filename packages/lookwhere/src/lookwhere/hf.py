"""DINOv2-with-registers weights from a Hugging Face folder (``Dinov2WithRegistersModel`` format).

The folder holds ``config.json`` and ``model.safetensors`` (or a sharded
``model.safetensors.index.json``), as ``save_pretrained`` writes them; both the original key names
(``attention.attention.query``) and transformers 5's (``attention.q_proj``) are read. Only
safetensors are read: nothing is unpickled. transformers itself is not needed.

The CLS position embedding is folded into the CLS token (as timm and the anchor do); position
embeddings are resized as transformers resizes them for that model type
(``Dinov2WithRegistersModel`` antialiases when shrinking, plain ``Dinov2Model`` does not), so a
loaded ViT reproduces the HF model at any resolution.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from lookwhere.vit import ViT, ViTConfig, resize_pos_embed, vit_at_resolution

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_RENAMES = (
    (r"\.attention\.attention\.query\.", ".attention.q_proj."),
    (r"\.attention\.attention\.key\.", ".attention.k_proj."),
    (r"\.attention\.attention\.value\.", ".attention.v_proj."),
    (r"\.attention\.output\.dense\.", ".attention.o_proj."),
)


def _read_config(folder: Path) -> dict:
    file = folder / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a Hugging Face model folder")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{file} is not valid JSON: {error}") from error
    if config.get("model_type") not in ("dinov2_with_registers", "dinov2"):
        raise ValueError(
            f"{file} describes a {config.get('model_type')!r} model; expected "
            "'dinov2_with_registers' (or 'dinov2')"
        )
    if config.get("use_swiglu_ffn"):
        raise ValueError(f"{file}: SwiGLU MLPs (the giant models) are not supported")
    if config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"{file}: hidden_act {config['hidden_act']!r}; only 'gelu' is supported")
    return config


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / shard for shard in shards]
    else:
        raise FileNotFoundError(
            f"{folder} has no model.safetensors (or model.safetensors.index.json); save the model "
            "with save_pretrained(safe_serialization=True)"
        )
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    renamed = {}
    for key, value in weights.items():
        key = re.sub(r"^dinov2_with_registers\.|^dinov2\.", "", key)
        for pattern, target in _RENAMES:
            key = re.sub(pattern, target, key)
        renamed[key] = value
    return renamed


def hf_geometry(folder: str | Path) -> tuple[int, int]:
    """`(patch_size, num_hidden_layers)` of a DINOv2 folder's `config.json` (read without loading
    any weights)."""
    config = _read_config(Path(folder))
    missing = [key for key in ("patch_size", "num_hidden_layers") if key not in config]
    if missing:
        raise ValueError(f"{Path(folder) / 'config.json'} has no {' or '.join(missing)}")
    return int(config["patch_size"]), int(config["num_hidden_layers"])


def config_from_hf(config: dict, image_size: int | None = None) -> ViTConfig:
    """The `ViTConfig` of a Hugging Face DINOv2(-with-registers) `config.json` dict."""
    if config.get("hidden_size", 0) % config.get("num_attention_heads", 1):
        raise ValueError("hidden_size is not a multiple of num_attention_heads")
    return ViTConfig(
        dim=config["hidden_size"],
        depth=config["num_hidden_layers"],
        heads=config["num_attention_heads"],
        patch_size=config["patch_size"],
        image_size=image_size or config["image_size"],
        num_registers=config.get("num_register_tokens", 0),
        mlp_ratio=config.get("mlp_ratio", 4),
        channels=config.get("num_channels", 3),
        layer_scale=config.get("layerscale_value", 1.0),
        eps=config.get("layer_norm_eps", 1e-6),
        # transformers' Dinov2WithRegistersModel resizes with antialias=True, Dinov2Model without
        pos_antialias=config.get("model_type") == "dinov2_with_registers",
    )


def _take(weights: dict[str, torch.Tensor], key: str, folder: Path) -> torch.Tensor:
    if key not in weights:
        raise ValueError(f"{folder}: weight {key!r} is missing from the checkpoint")
    return weights.pop(key)


def fold_normalization(
    weight: torch.Tensor, bias: torch.Tensor, mean, std
) -> tuple[torch.Tensor, torch.Tensor]:
    """Patch-embedding weights that take `[0, 1]` pixels and act as the originals on
    `(x - mean) / std`: `W' = W / std` per input channel, `b' = b - sum(W * mean / std)`."""
    mean = torch.as_tensor(mean, dtype=weight.dtype)[None, :, None, None]
    std = torch.as_tensor(std, dtype=weight.dtype)[None, :, None, None]
    return weight / std, bias - (weight * mean / std).sum(dim=(1, 2, 3))


def load_dinov2(
    folder: str | Path, image_size: int | None = None, *, normalize: bool = False
) -> ViT:
    """A `ViT` holding the DINOv2-with-registers weights saved in `folder`.

    Args:
        folder: A folder written by `Dinov2WithRegistersModel.save_pretrained` (or
            `Dinov2Model.save_pretrained`: no registers, position embeddings resized without
            antialiasing, as that model does).
        image_size: Resolution the position embeddings are resized to (default the checkpoint's).
        normalize: Fold DINOv2's ImageNet normalisation (mean 0.485 / 0.456 / 0.406, std
            0.229 / 0.224 / 0.225) into the patch embedding, so the ViT takes `[0, 1]` images
            (as every model of this package does) and equals the HF model on normalised ones.
            False: it takes what the HF model takes.

    Returns:
        The ViT, in eval mode; a checkpoint with unused or missing weights is an error.
    """
    folder = Path(folder)
    hf = _read_config(folder)
    native = config_from_hf(hf)
    weights = _read_weights(folder)
    weights.pop("embeddings.mask_token", None)  # masked-image pre-training only
    pos = _take(weights, "embeddings.position_embeddings", folder)
    state = {
        "cls_token": _take(weights, "embeddings.cls_token", folder) + pos[:, :1],
        "pos_embed": pos[:, 1:],
        "register_tokens": weights.pop("embeddings.register_tokens", torch.zeros(1, 0, native.dim)),
        "patch_embed.proj.weight": _take(
            weights, "embeddings.patch_embeddings.projection.weight", folder
        ),
        "patch_embed.proj.bias": _take(
            weights, "embeddings.patch_embeddings.projection.bias", folder
        ),
        "norm.weight": _take(weights, "layernorm.weight", folder),
        "norm.bias": _take(weights, "layernorm.bias", folder),
    }
    for i in range(native.depth):
        hf_layer = f"encoder.layer.{i}."
        ours = f"blocks.{i}."
        for part in ("weight", "bias"):
            state[ours + "attn.qkv." + part] = torch.cat(
                [
                    _take(weights, f"{hf_layer}attention.{name}.{part}", folder)
                    for name in ("q_proj", "k_proj", "v_proj")
                ]
            )
            state[ours + "attn.proj." + part] = _take(
                weights, f"{hf_layer}attention.o_proj.{part}", folder
            )
            for norm in ("norm1", "norm2"):
                state[f"{ours}{norm}.{part}"] = _take(weights, f"{hf_layer}{norm}.{part}", folder)
            for fc in ("fc1", "fc2"):
                state[f"{ours}{fc}.{part}"] = _take(weights, f"{hf_layer}mlp.{fc}.{part}", folder)
        state[ours + "ls1.gamma"] = _take(weights, f"{hf_layer}layer_scale1.lambda1", folder)
        state[ours + "ls2.gamma"] = _take(weights, f"{hf_layer}layer_scale2.lambda1", folder)
    if weights:
        raise ValueError(
            f"{folder}: unexpected weights {sorted(weights)[:5]} (a head? another model?)"
        )
    if normalize:
        state["patch_embed.proj.weight"], state["patch_embed.proj.bias"] = fold_normalization(
            state["patch_embed.proj.weight"], state["patch_embed.proj.bias"], IMAGENET_MEAN,
            IMAGENET_STD,
        )  # fmt: skip
    config = native if image_size is None else native.replace(image_size=image_size)
    vit = ViT(config)
    if config.grid != native.grid:
        state["pos_embed"] = resize_pos_embed(
            state["pos_embed"], (config.grid, config.grid), antialias=config.pos_antialias
        )
    vit.load_state_dict(state)
    return vit.eval()


def lookwhere_from_dinov2(
    folder: str | Path,
    *,
    image_size: int,
    selector_depth: int = 3,
    selector_size: int | None = None,
    num_classes: int = 0,
    k: int = 128,
    normalize: bool = True,
):
    """Teacher, and a LookWhere model initialised from it, from a DINOv2-with-registers folder.

    The paper's setting: a ViT-B/14-reg4 teacher at 518 px, a 3-block selector at 154 px.

    Args:
        folder: The Hugging Face model folder.
        image_size: The extractor's (high) resolution.
        selector_depth: Blocks the selector keeps.
        selector_size: The selector's (low) resolution; default `image_size` * 154 / 518 rounded
            to the patch.
        num_classes: Head outputs (0: features only).
        k: Default tokens kept.
        normalize: Fold the ImageNet normalisation into the patch embedding (the models then
            take `[0, 1]` images, as `pretrain` and the benchmark tasks give them).

    Returns:
        `(teacher, model)`: the frozen teacher ViT and the LookWhere model to pre-train.
    """
    from lookwhere.model import LookWhere, extractor_from_teacher, selector_from_teacher

    native = load_dinov2(folder, normalize=normalize)
    teacher = vit_at_resolution(native, image_size).eval()
    patch = teacher.config.patch_size
    if selector_size is None:
        selector_size = max(patch, round(image_size * 154 / 518 / patch) * patch)
    # both resize the checkpoint's own position embeddings, once
    selector = selector_from_teacher(native, selector_depth, selector_size, teacher.config.grid)
    model = LookWhere(selector, extractor_from_teacher(teacher), num_classes, k)
    return teacher.requires_grad_(False), model
