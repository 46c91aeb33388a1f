"""Private parameter-efficient fine-tuning: flashdp on peft-zoo adapters and Hugging Face peft LoRA.

The adapters' trainable tensors live in custom modules as raw ``nn.Parameter`` s (LoPE's
``LoPELinear``, PT-MoE's ``PTMoEPrompt``, CaPT's ``CaPTPrompt``), which flashdp clips through its
opt-in vmap fallback; peft's LoRA matrices are plain ``nn.Linear`` layers, clipped by the fused
layers. Oracle: brute-force per-example gradients of the whole unmodified model (``vmap(grad)``),
clipped explicitly (``private_oracle``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import flashdp
import peft_zoo as pz

sys.path.insert(0, str(Path(__file__).parent))

from private_oracle import clip_and_sum, per_example_gradients, relative_error, total_norms

VOCAB = 96
BATCH = 4
# float32 throughout. The private and the oracle gradients are the same sums of products taken
# in a different order (backward of a vmapped forward vs. vmap of a backward, clipped sums as one
# matrix product): through a 2-layer Llama they agree to <= 7e-7 of the largest entry (observed
# over all methods and both modes); 1e-5 leaves room for other platforms' summation orders while
# an example clipped with a wrong coefficient moves entries by ~1e-1 of the largest.
RTOL = 1e-5
METHODS = ["lope", "lope-stage1", "ptmoe", "capt", "capt-deep", "lora"]


def tiny_llama(seed: int = 0, vocab: int = VOCAB, tie: bool = False) -> LlamaForCausalLM:
    """A 2-layer Llama with random weights (eager attention: the oracle vmaps the whole model)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
        attn_implementation="eager",
    )
    return LlamaForCausalLM(config)


def adapted(method: str, seed: int = 0, vocab: int = VOCAB) -> nn.Module:
    """The tiny Llama with an adapter, in training mode, adapter weights drawn at random (the
    zero-initialised up-projections would give zero gradients to the rest of the adapter)."""
    base = tiny_llama(seed, vocab)
    if method.startswith("lope"):
        model = pz.get_peft_model(base, pz.LoPEConfig(r=2, num_experts=2))
        model.set_stage(1 if method == "lope-stage1" else 2)
    elif method == "ptmoe":
        # router noise off for the exact comparison (the oracle draws different noise)
        config = pz.PTMoEConfig(num_virtual_tokens=4, num_experts=2, rank=2, router_noise_std=0.0)
        model = pz.get_peft_model(base, config)
    elif method.startswith("capt"):
        model = pz.get_peft_model(base, pz.CaPTConfig(deep=method == "capt-deep"))
    elif method == "lora":
        import peft

        config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
        model = peft.get_peft_model(base, config)
    else:
        raise AssertionError(method)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    return model.train()


def batch(seed: int = 0, size: int = BATCH, length: int = 8, vocab: int = VOCAB):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (size, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[-1, :3] = 0  # one left-padded row
    return ids, mask


def example_losses(call, ids, mask, weights=None):
    """Per-example next-token cross-entropy summed over real target tokens, ``(B,)``."""
    logits = call(input_ids=ids, attention_mask=mask).logits
    ce = F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none"
    ).view(ids.shape[0], -1)
    losses = (ce * mask[:, 1:]).sum(1)
    return losses if weights is None else losses * weights


def make_private(model, clipping, max_grad_norm, **options):
    return flashdp.make_private(
        model,
        max_grad_norm=max_grad_norm,
        noise_multiplier=options.pop("noise_multiplier", 0.0),
        clipping=clipping,
        loss_reduction="sum",
        backend="reference",
        fallback=options.pop("fallback", "vmap"),
        **options,
    )


# peft 0.19 calls a transformers method that transformers 5 deprecates
PEFT_WARNING = "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"


@pytest.mark.filterwarnings(PEFT_WARNING)
@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
@pytest.mark.parametrize("method", METHODS)
def test_private_gradients_equal_brute_force(method, clipping):
    ids, mask = batch()
    oracle_model = adapted(method)
    grads = per_example_gradients(
        oracle_model, lambda call, i, m: example_losses(call, i, m).sum(), ids, mask
    )
    # C between the smallest and the largest example norm: some examples clipped, some not
    norms = total_norms(grads)
    max_grad_norm = float(norms.median())
    assert norms.min() < max_grad_norm < norms.max()
    expected = clip_and_sum(grads, clipping, max_grad_norm, divide_by=BATCH)

    model = adapted(method)
    frozen = {k: v.detach().clone() for k, v in model.named_parameters() if not v.requires_grad}
    # HF peft LoRA needs no fallback: its lora_A / lora_B are nn.Linear (fused layers)
    fallback = None if method == "lora" else "vmap"
    private = make_private(model, clipping, max_grad_norm, fallback=fallback)
    controller = flashdp.get_controller(private)
    assert bool(controller.fallback_modules) == (method != "lora")
    example_losses(private, ids, mask).sum().backward()
    got = {k: p.grad for k, p in private.named_parameters() if p.requires_grad}
    assert relative_error(got, expected) <= RTOL

    # frozen base weights: no gradient, unchanged by an optimizer given every parameter
    optimizer = torch.optim.Adam(private.parameters(), lr=1e-2)
    before = {k: v.detach().clone() for k, v in got.items()}
    optimizer.step()
    for name, parameter in private.named_parameters():
        if name in frozen:
            assert parameter.grad is None, name
            assert torch.equal(parameter, frozen[name]), name
        else:
            assert not torch.equal(parameter, before[name]), f"{name} did not move"


def pre_noise_sums(method, clipping, keep, weights):
    """Σ_b clip(g_b) before noise for the examples ``keep`` (noise 0, fixed denominator)."""
    ids, mask = batch()
    private = make_private(adapted(method), clipping, 1.0, expected_batch_size=BATCH)
    example_losses(private, ids[keep], mask[keep], weights[keep]).sum().backward()
    return {k: p.grad * BATCH for k, p in private.named_parameters() if p.requires_grad}


# float32 rounding of the norms (the fused and fallback norms are exact sums of squares)
SLACK = 1 + 1e-5


@pytest.mark.filterwarnings(PEFT_WARNING)
@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
@pytest.mark.parametrize("method", ["lope", "ptmoe", "capt-deep", "lora"])
def test_sensitivity_audit_on_adapters(method, clipping):
    """Removing one example moves each adapter tensor's pre-noise sum by at most C_l (per-layer)
    and the whole by at most C, even for an example whose raw gradient is ~1e6 times C."""
    weights = torch.ones(BATCH)
    weights[1] = 1e6  # the adversarial example
    everyone = list(range(BATCH))
    full = pre_noise_sums(method, clipping, everyone, weights)
    bound = 1.0 / math.sqrt(len(full))
    for removed in everyone:
        keep = [i for i in everyone if i != removed]
        partial = pre_noise_sums(method, clipping, keep, weights)
        diffs = {name: (full[name] - partial[name]).norm() for name in full}
        total = torch.stack(list(diffs.values())).norm()
        assert total <= 1.0 * SLACK, f"removing {removed}: total change {total}"
        if clipping == "per_layer":
            worst = max(diffs.values())
            assert worst <= bound * SLACK, f"removing {removed}: a tensor moved {worst} > C_l"
        if removed == 1:  # the adversarial example is clipped to the bound, not below
            assert total >= 0.99


def test_dp_fine_tune_of_lope_lowers_held_out_loss():
    """LoPE (stage II) on a byte-level tiny Llama, trained with flashdp at ε = 8 (δ = 1e-5 <
    1/N) on fortunes: Poisson sampling, σ from the accountant, noise on every step."""
    from benchdata import fortunes_corpus

    corpus = fortunes_corpus()
    length, n, expected_batch, steps = 32, 4096, 32, 60
    # the privacy unit: one fixed, non-overlapping window of 33 bytes of the training stream
    windows = corpus.byte_tokens("train")[: n * (length + 1)].view(n, length + 1)
    held_out = corpus.byte_tokens("validation")[: 64 * (length + 1)].view(64, length + 1)
    q = expected_batch / n
    sigma = flashdp.get_noise_multiplier(8.0, 1e-5, sample_rate=q, steps=steps)
    base = tiny_llama(0, vocab=256)
    targets = ("q_proj", "v_proj", "o_proj", "down_proj")
    model = pz.get_peft_model(base, pz.LoPEConfig(r=4, num_experts=2, target_modules=targets))
    model.set_stage(2)

    def held_out_loss() -> float:
        with torch.no_grad():  # eval mode: the poisoning expert is masked, as at inference
            logits = model.eval()(input_ids=held_out).logits
            model.train()
            return float(F.cross_entropy(logits[:, :-1].flatten(0, 1), held_out[:, 1:].flatten()))

    start = held_out_loss()
    private = make_private(
        model,
        "per_layer",
        1.0,
        noise_multiplier=sigma,
        expected_batch_size=expected_batch,
        sample_rate=q,
        generator=torch.Generator().manual_seed(0),
    )
    controller = flashdp.get_controller(private)
    optimizer = torch.optim.Adam([p for p in private.parameters() if p.requires_grad], lr=3e-2)
    loader = flashdp.PoissonLoader(
        (windows,), sample_rate=q, steps=steps, generator=torch.Generator().manual_seed(1)
    )
    for (rows,) in loader:
        with controller.accumulate():  # noise even for an empty batch
            if len(rows):
                per_example = example_losses(private, rows, torch.ones_like(rows)) / length
                per_example.sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    end = held_out_loss()
    epsilon = controller.epsilon(1e-5)
    assert 7.5 < epsilon <= 8.0
    # measured: 5.560 -> 5.399 nats/byte; a random frozen base leaves the adapter ~0.16 to gain,
    # the noise of one run moves the end by a few 1e-3
    assert end < start - 0.05, (start, end)


def test_tied_trainable_embeddings_are_refused_frozen_ones_are_fine():
    base = tiny_llama(0, tie=True)
    model = pz.get_peft_model(base, pz.LoPEConfig(r=2, num_experts=2))
    make_private(model, "flat", 1.0)  # tied but frozen: nothing to clip there
    base = tiny_llama(0, tie=True)
    model = pz.get_peft_model(base, pz.LoPEConfig(r=2, num_experts=2))
    base.get_input_embeddings().weight.requires_grad_(True)  # also train the tied embeddings
    with pytest.raises(ValueError, match=r"shared.*embed_tokens\.weight.*lm_head\.weight"):
        make_private(model, "flat", 1.0)


class ConvAdapter(nn.Module):
    """A user's adapter around a frozen projection: a trainable depthwise causal convolution
    over the sequence (no fused DP layer exists for nn.Conv1d)."""

    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        width = base.out_features
        self.conv = nn.Conv1d(width, width, kernel_size=3, padding=2, groups=width)

    def forward(self, x):  # (B, T, in)
        y = self.base(x)
        return y + self.conv(y.transpose(1, 2))[..., : y.shape[1]].transpose(1, 2)


class BatchNormAdapter(ConvAdapter):
    def __init__(self, base: nn.Linear) -> None:
        super().__init__(base)
        self.norm = nn.BatchNorm1d(base.out_features)

    def forward(self, x):
        return super().forward(x) + self.norm(x.transpose(1, 2)).transpose(1, 2)


class ItemAdapter(ConvAdapter):
    def __init__(self, base: nn.Linear) -> None:
        super().__init__(base)
        self.gain = nn.Parameter(torch.ones(()))  # held here: this module runs under vmap

    def forward(self, x):
        return self.gain * super().forward(x) / (1 + x.abs().max().item())


def with_custom_adapter(adapter_class) -> nn.Module:
    model = tiny_llama(0)
    model.requires_grad_(False)
    for layer in model.model.layers:
        layer.mlp.down_proj = adapter_class(layer.mlp.down_proj)
    return model.train()


def test_custom_conv_adapter_refused_without_fallback_exact_with_it():
    name = r"'model\.layers\.0\.mlp\.down_proj\.conv' \(Conv1d\)"
    with pytest.raises(ValueError, match=name + r".*fallback='vmap'"):
        make_private(with_custom_adapter(ConvAdapter), "flat", 1.0, fallback=None)
    ids, mask = batch()
    grads = per_example_gradients(
        with_custom_adapter(ConvAdapter), lambda c, i, m: example_losses(c, i, m).sum(), ids, mask
    )
    max_grad_norm = float(total_norms(grads).median())
    expected = clip_and_sum(grads, "flat", max_grad_norm, divide_by=BATCH)
    private = make_private(with_custom_adapter(ConvAdapter), "flat", max_grad_norm)
    example_losses(private, ids, mask).sum().backward()
    got = {k: p.grad for k, p in private.named_parameters() if p.requires_grad}
    assert relative_error(got, expected) <= RTOL


@pytest.mark.parametrize(
    ("adapter", "error", "message"),
    [
        (BatchNormAdapter, ValueError, r"BatchNorm layers in training mode"),
        (ItemAdapter, RuntimeError, r"\(ItemAdapter\) cannot run one example.*item"),
    ],
)
def test_adapters_that_cannot_run_per_example_fail_loudly(adapter, error, message):
    private = make_private(with_custom_adapter(adapter), "flat", 1.0)
    ids, mask = batch()
    with pytest.raises(error, match=message):
        private(input_ids=ids, attention_mask=mask)


def test_ptmoe_router_noise_is_drawn_per_example():
    """With router noise (training), identical examples get different expert weights: the
    fallback draws randomness per example, as the unmodified model does per row."""
    base = tiny_llama(0)
    config = pz.PTMoEConfig(num_virtual_tokens=4, num_experts=2, rank=2, router_noise_std=0.5)
    private = make_private(pz.get_peft_model(base, config).train(), "flat", 1.0)
    ids = batch()[0][:1].expand(3, -1)
    logits = private(input_ids=ids).logits
    assert not torch.allclose(logits[0], logits[1])
    private.eval()  # no router noise: identical rows agree
    logits = private(input_ids=ids).logits
    torch.testing.assert_close(logits[0], logits[1])
