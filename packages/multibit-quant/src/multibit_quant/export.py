"""Deployment: a chosen bit-width as packed integer weights, and real integer inference.

At ``b`` bits a quantized layer's (bias-corrected) weight is exactly affine in integer codes per
output channel, ``W[c, k] = α_c·code[c, k] + β_c`` with ``code`` in ``[0, 2^b − 1]`` (DoReFa's
level index, LSQ's code + 2^{b−1}), and its input is ``x = a·xcode`` with integer ``xcode``. So

    y_c = a·α_c·Σ_k code[c, k]·xcode[k] + a·β_c·Σ_k xcode[k] + bias_c,

where both sums are integer. :class:`IntegerConv2d` / :class:`IntegerLinear` compute them with
``torch._int_mm`` (int8 × int8 → int32; codes are shifted into int8 and the shift is undone
exactly), so the fake-quantized model and the integer model differ only by float32 rounding of
the final affine step. Codes are stored bit-packed (``b`` bits each) in safetensors.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from kernels_common.cli import atomic_file
from multibit_quant.layers import QuantConv2d, QuantLayer, QuantLinear
from multibit_quant.model import MultiBitModel, SwitchBatchNorm2d
from multibit_quant.ops import check_bits
from multibit_quant.reference import compute_dtype, correction_terms, lsq_range

FORMAT_VERSION = 1


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes in ``[0, 2^bits − 1]`` as a little-endian bit stream of ``uint8``."""
    values = codes.detach().cpu().numpy().astype(np.uint16).reshape(-1)
    if values.size and int(values.max()) >= 2**bits:
        raise ValueError(f"codes exceed {bits} bits (max {int(values.max())})")
    planes = (values[:, None] >> np.arange(bits, dtype=np.uint16)) & 1
    return torch.from_numpy(np.packbits(planes.astype(np.uint8).reshape(-1), bitorder="little"))


def unpack_codes(packed: torch.Tensor, bits: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: ``int64`` codes of ``shape``."""
    count = int(np.prod(shape))
    flat = np.unpackbits(packed.numpy(), bitorder="little")[: count * bits]
    if flat.size != count * bits:
        raise ValueError(f"{packed.numel()} bytes cannot hold {count} codes of {bits} bits")
    weights = (1 << np.arange(bits, dtype=np.int64))[None, :]
    return torch.from_numpy((flat.reshape(count, bits).astype(np.int64) * weights).sum(1)).view(
        shape
    )


@torch.no_grad()
def weight_codes(layer: QuantLayer, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(codes (C, K) int64, α (C,), β (C,))`` with ``α·codes + β`` the layer's weight at
    ``bits`` (its quantizer's values, then its bias correction, in float32 as the reference)."""
    check_bits(bits)
    w = layer.weight.detach().reshape(layer.weight.shape[0], -1)
    w = w.to(compute_dtype(w))
    config = layer.config
    if config.weight == "dorefa":
        levels = 2**bits - 1
        t = torch.tanh(w)
        peak = t.abs().amax(1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        codes = torch.round((t / peak + 1.0) * 0.5 * levels)
        scale = w.abs().mean(1, keepdim=True)
        values = scale * (codes * (2.0 / levels) - 1.0)
        slope, offset = scale * (2.0 / levels), -scale
    else:
        q_n, q_p = lsq_range(bits)
        step = layer._step(layer.weight_steps, bits, True).detach().to(w.dtype).view(-1, 1)
        raw = torch.round((w / step).clamp(-q_n, q_p))
        values, codes = raw * step, raw + q_n
        slope, offset = step, -step * q_n
    if config.correction is None:
        alpha, beta = slope, offset
    else:  # (slope·code + offset − mean_q)·ratio + mean_w
        mean_q, ratio, mean_w = correction_terms(values, w, config.correction)
        alpha, beta = slope * ratio, (offset - mean_q) * ratio + mean_w
    return codes.long(), alpha.view(-1), beta.view(-1)


def activation_codes(x: torch.Tensor, layer_like, bits: int) -> tuple[torch.Tensor, float]:
    """Integer input codes (as float) and their step ``a`` (``x ≈ a·codes``)."""
    method, signed = layer_like.act_method, layer_like.act_signed
    x = x.to(compute_dtype(x))
    if method == "clamp":
        low, levels = (-1.0, 2 ** (bits - 1) - 1) if signed else (0.0, 2**bits - 1)
        return torch.round(x.clamp(low, 1.0) * levels), 1.0 / levels
    q_n, q_p = lsq_range(bits, signed)
    step = layer_like.act_step.to(x.dtype)
    return torch.round((x / step).clamp(-q_n, q_p)), step


def int8_matmul(a: torch.Tensor, b: torch.Tensor, pad: bool | None = None) -> torch.Tensor:
    """``a (M, K) @ b (K, N)`` for int8 operands, exact in int32 (``torch._int_mm``). CUDA's
    kernel needs M > 16 and K, N multiples of 8: the operands are zero-padded there (zeros add
    nothing to the products); ``pad`` forces or skips the padding."""
    rows, inner = a.shape
    cols = b.shape[1]
    if pad is None:
        pad = a.device.type == "cuda"
    if not pad:
        return torch._int_mm(a.contiguous(), b.contiguous())
    m, k, n = max(rows, 17), -(-inner // 8) * 8, -(-cols // 8) * 8
    padded_a = a.new_zeros(m, k)
    padded_a[:rows, :inner] = a
    padded_b = b.new_zeros(k, n)
    padded_b[:inner, :cols] = b
    return torch._int_mm(padded_a, padded_b)[:rows, :cols]


class IntegerLayer(nn.Module):
    """Shared state of :class:`IntegerConv2d` and :class:`IntegerLinear`."""

    def __init__(self, codes, alpha, beta, bias, bits, act_bits, act_method, act_signed, act_step):
        super().__init__()
        self.bits, self.act_bits = bits, act_bits
        self.act_method, self.act_signed = act_method, act_signed
        self.weight_zero = 2 ** (bits - 1)
        self.register_buffer("codes", (codes - self.weight_zero).to(torch.int8))
        self.register_buffer("alpha", alpha.detach())
        self.register_buffer("beta", beta.detach())
        self.register_buffer("bias", None if bias is None else bias.detach())
        self.register_buffer("act_step", torch.as_tensor(act_step, dtype=alpha.dtype))
        self.register_buffer("code_sums", self.codes.long().sum(1))

    def integer_product(self, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Σ code·xcode, Σ xcode)`` per row of ``cols (M, K)`` (integer-valued floats)."""
        x_zero = 0 if self.act_signed else 2 ** (self.act_bits - 1)
        shifted = (cols - x_zero).to(torch.int8)
        product = int8_matmul(shifted, self.codes.t()).long()
        x_sums = shifted.long().sum(1, keepdim=True)
        k = self.codes.shape[1]
        product += x_zero * self.code_sums[None, :] + self.weight_zero * x_sums
        product += k * self.weight_zero * x_zero
        return product, x_sums + k * x_zero

    def combine(self, product, x_sums, step, dtype: torch.dtype) -> torch.Tensor:
        """``a·(α·product + β·x_sums) + bias`` in float64, returned in ``dtype``."""
        alpha, beta = self.alpha.double(), self.beta.double()
        scale = torch.as_tensor(step, dtype=torch.float64)
        out = scale * (alpha * product.double() + beta * x_sums.double())
        out = out.to(dtype)
        return out if self.bias is None else out + self.bias.to(dtype)


class IntegerConv2d(IntegerLayer):
    """A :class:`QuantConv2d` at one bit-width, run with integer matrix products."""

    def __init__(self, layer: QuantConv2d, **state) -> None:
        super().__init__(**state)
        if layer.groups != 1 or layer.padding_mode != "zeros":
            raise NotImplementedError("integer export supports groups=1 and zero padding")
        self.kernel_size, self.stride = layer.kernel_size, layer.stride
        self.padding, self.dilation = layer.padding, layer.dilation
        self.out_channels = layer.out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes, step = activation_codes(x, self, self.act_bits)
        batch, _, height, width = x.shape
        cols = F.unfold(codes, self.kernel_size, self.dilation, self.padding, self.stride)
        rows = cols.transpose(1, 2).reshape(-1, cols.shape[1])
        product, x_sums = self.integer_product(rows)
        out = self.combine(product, x_sums, step, x.dtype)
        out_h = height + 2 * self.padding[0] - self.dilation[0] * (self.kernel_size[0] - 1) - 1
        out_w = width + 2 * self.padding[1] - self.dilation[1] * (self.kernel_size[1] - 1) - 1
        shape = (batch, out_h // self.stride[0] + 1, out_w // self.stride[1] + 1, -1)
        return out.view(shape).permute(0, 3, 1, 2).contiguous()


class IntegerLinear(IntegerLayer):
    """A :class:`QuantLinear` at one bit-width, run with integer matrix products."""

    def __init__(self, layer: QuantLinear, **state) -> None:
        super().__init__(**state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes, step = activation_codes(x, self, self.act_bits)
        product, x_sums = self.integer_product(codes.reshape(-1, codes.shape[-1]))
        out = self.combine(product, x_sums, step, x.dtype)
        return out.view(*x.shape[:-1], -1)


def _layer_state(layer: QuantLayer, bits: int) -> dict:
    if not layer.config.quantize_activations:
        raise NotImplementedError("integer export needs quantized layer inputs")
    if int(layer.act_sign) < 0:
        raise ValueError("run the model once before exporting (input signs are set then)")
    codes, alpha, beta = weight_codes(layer, bits)
    signed = bool(int(layer.act_sign))
    act_step = torch.zeros(())
    if layer.config.activation == "lsq":
        act_step = layer._step(layer.act_steps, bits, signed).detach().reshape(())
    return {
        "codes": codes, "alpha": alpha, "beta": beta, "bias": layer.bias, "bits": bits,
        "act_bits": bits, "act_method": layer.config.activation, "act_signed": signed,
        "act_step": act_step,
    }  # fmt: skip


def to_integer(model: MultiBitModel, bits: int) -> nn.Module:
    """A copy of ``model``'s network at ``bits`` whose quantized layers compute in integers."""
    check_bits(bits)
    network = copy.deepcopy(model.model).eval()
    for name, module in list(network.named_modules()):
        if isinstance(module, QuantLayer):
            cls = IntegerConv2d if isinstance(module, QuantConv2d) else IntegerLinear
            parent_name, _, leaf = name.rpartition(".")
            parent = network.get_submodule(parent_name) if parent_name else network
            setattr(parent, leaf, cls(module, **_layer_state(module, bits)))
    for module in network.modules():
        if isinstance(module, SwitchBatchNorm2d):
            module.bits = bits
    return network


def export_integer(model: MultiBitModel, bits: int, path: str | Path, meta: dict | None = None):
    """Write ``model`` at ``bits``: packed codes and per-channel affines of every quantized layer,
    everything else in float32 (safetensors), and a JSON header to rebuild it."""
    integer = to_integer(model, bits)
    tensors, layers = {}, {}
    for name, module in integer.named_modules():
        if isinstance(module, IntegerLayer):
            codes = module.codes.long() + module.weight_zero
            tensors[f"{name}.packed"] = pack_codes(codes, bits)
            layers[name] = {"shape": list(codes.shape), "act_signed": module.act_signed}
    quant = {k: v for k, v in asdict(model.config).items() if k != "backend"}
    for key, value in integer.state_dict().items():
        if not key.endswith((".codes", ".code_sums")):
            tensors[f"state.{key}"] = value.detach().cpu().contiguous()
    header = {
        **(meta or {}),
        "format_version": FORMAT_VERSION,
        "bits": bits,
        "layers": layers,
        "quant_config": quant,
    }
    with atomic_file(path) as temporary:  # no half-written export under the final name
        save_file(tensors, str(temporary), metadata={"multibit_quant": json.dumps(header)})
    return Path(path)


def export_sizes(model: MultiBitModel, bits_list) -> dict[int, dict[str, int]]:
    """Bytes of the quantized layers' weights at each bit-width: packed codes plus α, β per
    channel, against float32."""
    sizes = {}
    for bits in bits_list:
        packed = float32 = 0
        for layer in model.quant_layers():
            rows, cols = layer.weight.shape[0], layer.weight[0].numel()
            packed += -(-rows * cols * bits // 8) + 8 * rows
            float32 += 4 * rows * cols
        sizes[bits] = {"packed_bytes": packed, "float32_bytes": float32}
    return sizes


def load_integer(path: str | Path, model: MultiBitModel) -> nn.Module:
    """Rebuild an exported integer network: ``model`` provides the architecture (same layers
    and quantizers, e.g. ``quantize(build_model(...), bits, config)``); it is copied, not
    changed, and its weights are not used."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no exported model at {path}")
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as handle:
            header = json.loads((handle.metadata() or {})["multibit_quant"])
        tensors = load_file(str(path))
    except (KeyError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} holds no multibit-quant export header ({error})") from None
    except Exception as error:  # safetensors raises its own error type for damaged files
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from None
    if header.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {header.get('format_version')!r} is unknown")
    ours = {k: v for k, v in asdict(model.config).items() if k != "backend"}
    if header.get("quant_config") != ours:
        raise ValueError(
            f"{path} was exported with quantizers {header.get('quant_config')}, the model "
            f"given has {ours}"
        )
    bits = header["bits"]
    template = copy.deepcopy(model)
    names = set(template.quantized_names)
    if set(header["layers"]) != names:
        raise ValueError(
            f"{path} has integer layers {sorted(header['layers'])}, the model quantizes "
            f"{sorted(names)}"
        )
    for layer in template.quant_layers():  # any signs: the exported ones are loaded below
        layer.act_sign.fill_(0)
        layer._signed = None
    integer = to_integer(template, bits)
    for name, info in header["layers"].items():
        module = integer.get_submodule(name)
        key = f"{name}.packed"
        if key not in tensors or tuple(info["shape"]) != tuple(module.codes.shape):
            raise ValueError(f"{path}: layer {name!r} is missing or has another shape")
        codes = unpack_codes(tensors[key], bits, tuple(info["shape"]))
        module.codes = (codes - module.weight_zero).to(torch.int8)
        module.code_sums = module.codes.long().sum(1)
        module.act_signed = info["act_signed"]
    state = {k.removeprefix("state."): v for k, v in tensors.items() if k.startswith("state.")}
    missing, unexpected = integer.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith((".codes", ".code_sums"))]
    if missing or unexpected:
        raise ValueError(
            f"{path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    return integer
