"""Packed codes, integer inference against the fake-quantized model, export round trips."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from multibit_quant import (
    QuantConfig,
    export_integer,
    export_sizes,
    load_integer,
    pack_codes,
    preact_resnet20,
    quantize,
    small_vit,
    to_integer,
    unpack_codes,
)
from multibit_quant.export import weight_codes

CONFIGS = [
    QuantConfig(),
    QuantConfig(correction="mean"),
    QuantConfig(correction=None),
    QuantConfig(weight="lsq", activation="lsq"),
]
BUILDERS = {
    "resnet20": lambda: preact_resnet20(width=4),
    "vit": lambda: small_vit(dim=16, depth=1, heads=2),
}


@settings(max_examples=60, deadline=None)
@given(
    bits=st.integers(1, 8),
    shape=st.tuples(st.integers(1, 9), st.integers(1, 13)),
    seed=st.integers(0, 99),
)
def test_pack_round_trip(bits, shape, seed):
    codes = torch.randint(0, 2**bits, shape, generator=torch.Generator().manual_seed(seed))
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.numel() == -(-codes.numel() * bits // 8)  # ceil: no padding beyond a byte
    assert torch.equal(unpack_codes(packed, bits, shape), codes)


def test_pack_refuses_codes_too_wide():
    with pytest.raises(ValueError, match="exceed 2 bits"):
        pack_codes(torch.tensor([0, 4]), 2)
    with pytest.raises(ValueError, match="cannot hold"):
        unpack_codes(pack_codes(torch.tensor([1, 2, 3]), 2), 4, (3,))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.weight}-{c.correction}")
@pytest.mark.parametrize("bits", [2, 5, 8])
def test_weight_codes_are_affine_in_the_fake_quantized_weight(config, bits):
    model = quantize(preact_resnet20(width=4), bits=[2, 8], config=config)
    layer = model.quant_layers()[3]
    codes, alpha, beta = weight_codes(layer, bits)
    assert int(codes.min()) >= 0
    assert int(codes.max()) < 2**bits
    rebuilt = alpha[:, None] * codes + beta[:, None]
    expected = layer.quantized_weight(bits).detach().reshape(len(codes), -1)
    torch.testing.assert_close(rebuilt, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.weight}-{c.correction}")
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_integer_inference_agrees_with_fake_quant(config, name):
    """Same predictions on every image; logits equal up to float32 rounding, except where an
    activation lands within that rounding of a code boundary and moves one level (measured: at
    most 2.4e-3 of a logit on these random networks)."""
    torch.manual_seed(0)
    model = quantize(BUILDERS[name](), bits=[2, 4, 8], config=config)
    x = torch.randn(48, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    model.train()
    model(x)  # running statistics and input signs
    model.eval()
    for bits in (2, 3, 8):
        with torch.no_grad(), model.bits_as(bits):
            fake = model(x)
            real = to_integer(model, bits)(x)
        assert torch.equal(fake.argmax(1), real.argmax(1))
        assert (fake - real).abs().max() < 1e-2 * fake.abs().max()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.weight}-{c.correction}")
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_integer_inference_is_the_fake_quantized_function_in_float64(config, name):
    """In float64 the only rounding left is ~1e-16 relative, so no activation moves a code:
    the integer network computes exactly the fake-quantized one (logits to 1e-9)."""
    torch.manual_seed(0)
    model = quantize(BUILDERS[name](), bits=[2, 4, 8], config=config)
    x = torch.randn(48, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    model.train()
    model(x)
    model.eval().double()
    for bits in (2, 3, 8):
        with torch.no_grad(), model.bits_as(bits):
            fake = model(x.double())
            real = to_integer(model, bits)(x.double())
        assert real.dtype == torch.float64
        torch.testing.assert_close(real, fake, rtol=1e-9, atol=1e-9)


def test_export_round_trip_is_exact(tmp_path):
    model = quantize(preact_resnet20(width=4), bits=[2, 4, 8])
    x = torch.randn(8, 1, 28, 28)
    model.train()
    model(x)
    model.eval()
    for bits in (3, 8):
        path = export_integer(model, bits, tmp_path / f"m{bits}.safetensors", {"note": "test"})
        loaded = load_integer(path, quantize(preact_resnet20(width=4), bits=[2, 4, 8]))
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), to_integer(model, bits)(x), rtol=0, atol=0)
    # a 3-bit file holds 3 bits per weight plus the float parts
    sizes = export_sizes(model, [2, 8])
    assert sizes[2]["packed_bytes"] < sizes[8]["packed_bytes"] < sizes[8]["float32_bytes"] / 3


def test_export_errors(tmp_path):
    model = quantize(preact_resnet20(width=4), bits=[4])
    with pytest.raises(ValueError, match="run the model once"):
        to_integer(model, 4)
    with pytest.raises(ValueError, match="2 to 8"):
        to_integer(model, 12)
    with pytest.raises(FileNotFoundError, match="no exported model"):
        load_integer(tmp_path / "missing.safetensors", model)


def test_load_integer_leaves_the_given_model_alone_and_checks_the_file(tmp_path):
    """A ViT (signed inputs) with LSQ quantizers round-trips; the architecture model passed in
    keeps its state; a file exported with other quantizers is refused."""
    config = QuantConfig(weight="lsq", activation="lsq")
    model = quantize(small_vit(dim=16, depth=1, heads=2), bits=[2, 8], config=config)
    x = torch.randn(6, 1, 28, 28)
    model.train()
    model(x)
    model.eval()
    path = export_integer(model, 4, tmp_path / "vit.safetensors")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loaded = load_integer(path, model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), to_integer(model, 4)(x), rtol=0, atol=0)
    other = quantize(small_vit(dim=16, depth=1, heads=2), bits=[2, 8])
    with pytest.raises(ValueError, match="exported with quantizers"):
        load_integer(path, other)
    (tmp_path / "plain.safetensors").write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match=r"not a readable safetensors file|no multibit-quant"):
        load_integer(tmp_path / "plain.safetensors", model)


def test_padded_int8_matmul_equals_the_plain_one():
    """The zero padding CUDA's int8 kernel needs (M > 16, K and N multiples of 8) adds nothing."""
    from multibit_quant.export import int8_matmul

    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (5, 13), generator=generator, dtype=torch.int8)
    b = torch.randint(-128, 128, (13, 3), generator=generator, dtype=torch.int8)
    expected = a.long() @ b.long()
    assert torch.equal(int8_matmul(a, b, pad=True).long(), expected)
    assert torch.equal(int8_matmul(a, b, pad=False).long(), expected)
