"""Whatever could let a gradient escape clipping is refused with an error naming it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flashdp


def make(model, **kwargs):
    options = {"max_grad_norm": 1.0, "noise_multiplier": 1.0, "backend": "reference"}
    return flashdp.make_private(model, **{**options, **kwargs})


def test_unsupported_trainable_layer_is_named():
    model = nn.Sequential(nn.Linear(3, 4), nn.Conv1d(4, 4, 1))
    with pytest.raises(ValueError, match=r"1\.weight.*1\.bias|1\.bias.*1\.weight"):
        make(model)


def test_bare_parameter_is_refused():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(3, 3)
            self.scale = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return self.proj(x) * self.scale

    with pytest.raises(ValueError, match="'scale'"):
        make(Scaled())


def test_frozen_unsupported_parameters_are_fine_and_state_dict_is_unchanged():
    model = nn.Sequential(nn.Linear(3, 4), nn.Conv1d(4, 4, 1), nn.Linear(4, 2))
    model[1].requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model[0].weight
    private = make(model)
    assert private.state_dict().keys() == before.keys()
    assert all(torch.equal(private.state_dict()[k], v) for k, v in before.items())
    assert private[0].weight is weight
    assert isinstance(private[0], flashdp.DPLinear)
    assert isinstance(private[1], nn.Conv1d)
    assert flashdp.get_controller(private).parameter_names == (
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
    )


def test_subclass_of_a_supported_layer_is_refused():
    class MyLinear(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    with pytest.raises(ValueError, match="trainable parameters outside"):
        make(nn.Sequential(MyLinear(3, 3)))


def test_tied_parameters_are_refused():
    embedding, head = nn.Embedding(5, 4), nn.Linear(4, 5, bias=False)
    head.weight = embedding.weight
    with pytest.raises(ValueError, match="shared"):
        make(nn.ModuleDict({"embedding": embedding, "head": head}))


def test_target_modules_leave_others_refused():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"1\.weight"):
        make(model, target_modules=["0"])
    model[1].requires_grad_(False)
    assert isinstance(make(model, target_modules=["0"])[0], flashdp.DPLinear)


def test_parameter_used_outside_its_layer_fails_backward():
    class Leaky(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(3, 3)

        def forward(self, x):
            return self.proj(x) + x @ self.proj.weight  # second, unclipped use

    private = make(Leaky())
    with pytest.raises(RuntimeError, match="escape clipping"):
        private(torch.randn(2, 3)).sum().backward()
    assert private.proj.weight.grad is None


def test_layer_called_twice_is_refused():
    layer = nn.Linear(3, 3)
    private = make(nn.Sequential(layer))
    with pytest.raises(RuntimeError, match="twice"):
        private(private(torch.randn(2, 3))).sum().backward()


def test_batch_broadcast_is_refused():
    """An input shared by the whole batch (GPT-2's default position ids) is not one example's."""

    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(5, 4), nn.Embedding(6, 4)

        def forward(self, ids):
            return self.tokens(ids) + self.positions(torch.arange(ids.shape[1])[None])

    private = make(Positions())
    with pytest.raises(ValueError, match="saw 1 in the same backward pass"):
        private(torch.randint(0, 5, (3, 6))).sum().backward()
    # the next, correct step is not affected by the aborted one
    out = private.tokens(torch.randint(0, 5, (3, 6)))
    out.sum().backward()


@pytest.mark.parametrize(
    ("option", "value"), [("scale_grad_by_freq", True), ("sparse", True), ("max_norm", 1.0)]
)
def test_embedding_options_that_break_clipping(option, value):
    with pytest.raises(ValueError, match=option):
        make(nn.Embedding(5, 3, **{option: value}))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_grad_norm": 0.0}, ValueError, "max_grad_norm"),
        ({"noise_multiplier": -1.0}, ValueError, "noise_multiplier"),
        ({"noise_multiplier": "1"}, TypeError, "noise_multiplier"),
        ({"clipping": "global"}, ValueError, "clipping"),
        ({"loss_reduction": "none"}, ValueError, "loss_reduction"),
        ({"expected_batch_size": 0}, ValueError, "expected_batch_size"),
        ({"sample_rate": 2.0}, ValueError, "sample_rate"),
        ({"sample_rate": 0.1}, ValueError, "expected_batch_size"),
        ({"layer_norms": {"weight": 1.0}}, ValueError, "missing"),
        ({"layer_norms": {"weight": 1.0, "bias": 1.0}}, ValueError, "too small"),
        (
            {"clipping": "flat", "layer_norms": {"weight": 0.5, "bias": 0.5}},
            ValueError,
            "per_layer",
        ),
        ({"target_modules": ["nope"]}, ValueError, "nope"),
    ],
)
def test_bad_settings(kwargs, error, message):
    with pytest.raises(error, match=message):
        make(nn.Linear(3, 2), **kwargs)


def test_bad_inputs():
    with pytest.raises(TypeError, match=r"nn\.Module"):
        flashdp.make_private("model", max_grad_norm=1.0, noise_multiplier=1.0)
    private = make(nn.Sequential(nn.Linear(3, 2)))
    with pytest.raises(ValueError, match="already private"):
        make(private)
    with pytest.raises(ValueError, match="example dimension"):
        private(torch.randn(3))
    with pytest.raises(ValueError, match="not made private"):
        flashdp.get_controller(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no trainable"):
        make(nn.Sequential(nn.Linear(3, 2).requires_grad_(False)))
    with pytest.raises(ValueError, match="sample_rate"):
        flashdp.get_controller(private).epsilon(1e-5)


def test_non_finite_gradient_discards_the_step():
    private = make(nn.Sequential(nn.Linear(3, 2)), noise_multiplier=0.0)
    x = torch.tensor([[1.0, 2.0, float("inf")]])
    with pytest.raises(FloatingPointError, match="non-finite"):
        private(x).sum().backward()
    assert private[0].weight.grad is None


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, scale):
        ctx.scale = scale
        return h.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class Scale(nn.Module):
    """Identity forward; the backward multiplies example 1's gradient by ``factor`` (inf or
    NaN: a non-finite gradient in the layers before it only)."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, h):
        scale = torch.ones(h.shape[0], *[1] * (h.dim() - 1))
        scale[1] = self.factor
        return _ScaleGradient.apply(h, scale)


@pytest.mark.parametrize("method", ["store", "ghost"])
def test_non_finite_example_in_an_inner_layer_discards_the_whole_pass(method):
    """The finiteness flag is read once, at the end of the pass: a non-finite norm in an inner
    layer (after the outer layers were already summed) still releases nothing, names the first
    layer that reported it, and the next batch is released normally."""
    private = make(
        nn.Sequential(nn.Linear(3, 4), Scale(float("inf")), nn.Linear(4, 4), nn.Linear(4, 2)),
        noise_multiplier=0.0,
        linear_method=method,
    )
    x = torch.randn(3, 5, 3)
    with pytest.raises(FloatingPointError, match=r"non-finite per-example gradient norm in '0\."):
        private(x).sum().backward()
    assert all(p.grad is None for p in private.parameters())
    assert flashdp.get_controller(private).steps == 0
    private[1].factor = 1.0
    private(x).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in private.parameters())
    assert flashdp.get_controller(private).steps == 1


def test_a_failed_micro_batch_discards_its_whole_accumulate_block():
    """After a failure inside accumulate() (caught by the user), the block's later micro-batches
    are refused and its exit releases nothing: releasing them would release a subset of the
    batch chosen by the failing example. The next block is released normally."""
    private = make(nn.Sequential(nn.Linear(3, 2), Scale(1.0)), noise_multiplier=0.0)
    controller = flashdp.get_controller(private)
    x = torch.randn(4, 3)
    with controller.accumulate():
        private(x).sum().backward()
        private[1].factor = float("nan")
        with pytest.raises(FloatingPointError):
            private(x).sum().backward()
        private[1].factor = 1.0
        with pytest.raises(RuntimeError, match=r"accumulate\(\) block was discarded"):
            private(x).sum().backward()
    assert private[0].weight.grad is None
    assert controller.steps == 0
    with controller.accumulate():
        private(x).sum().backward()
    assert controller.steps == 1
    assert private[0].weight.grad is not None


def test_abort_inside_accumulate_releases_nothing():
    private = make(nn.Linear(3, 2), noise_multiplier=1.0)
    controller = flashdp.get_controller(private)
    with controller.accumulate():
        private(torch.randn(4, 3)).sum().backward()
        controller.abort()
    assert private.weight.grad is None
    assert controller.steps == 0


@pytest.mark.parametrize("change", ["unfreeze", "unfreeze-call-layers", "add", "replace"])
def test_parameters_made_trainable_after_make_private_are_refused(change):
    """A layer unfrozen, added or swapped in after make_private would train unclipped: refused
    in the model's forward, or at the release when its layers are called directly."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model[1].requires_grad_(False)
    private = make(model, noise_multiplier=0.0)
    if change.startswith("unfreeze"):
        private[1].requires_grad_(True)
    elif change == "add":
        private.append(nn.Linear(2, 2))
    else:
        private[0] = nn.Linear(3, 4)
    x = torch.randn(2, 3) * 1e6

    def step():
        out = private[1](private[0](x)) if change == "unfreeze-call-layers" else private(x)
        out.sum().backward()

    with pytest.raises(RuntimeError, match="escape clipping") as error:
        step()
    assert ("0.weight" in str(error.value)) == (change == "replace")
    assert all(p.grad is None for p in private.parameters())
    assert flashdp.get_controller(private).steps == 0


@pytest.mark.parametrize("layer", ["linear", "embedding", "layer_norm", "rms_norm"])
def test_second_backward_through_the_same_forward_is_refused(layer):
    """retain_graph=True would count every example twice under one noise draw."""
    model, x = {
        "linear": (nn.Linear(3, 2), torch.randn(4, 3)),
        "embedding": (nn.Embedding(5, 2), torch.randint(0, 5, (4, 3))),
        "layer_norm": (nn.LayerNorm(3), torch.randn(4, 3)),
        "rms_norm": (nn.RMSNorm(3), torch.randn(4, 3)),
    }[layer]
    private = make(nn.Sequential(model), noise_multiplier=0.0, expected_batch_size=4)
    controller = flashdp.get_controller(private)
    loss = private(x).square().sum()

    def logical_batch():
        with controller.accumulate():
            loss.backward(retain_graph=True)
            loss.backward()

    with pytest.raises(RuntimeError, match="twice through the same forward"):
        logical_batch()
    assert all(p.grad is None for p in private.parameters())
    assert controller.steps == 0


def test_reparametrized_layer_is_refused():
    """spectral_norm trains weight_orig through a forward pre-hook the DP layer would not run."""
    model = nn.Sequential(nn.utils.spectral_norm(nn.Linear(3, 2)))
    with pytest.raises(ValueError, match="weight_orig"):
        make(model)


def test_layer_with_hooks_is_refused():
    model = nn.Sequential(nn.Linear(3, 2))
    model[0].register_forward_hook(lambda module, args, out: out * 2)
    with pytest.raises(ValueError, match="'0' has hooks"):
        make(model)


def test_frozen_batch_norm_in_training_mode_is_refused():
    """Batch statistics mix the examples: one example moves every other example's gradient of
    the clipped layers, so per-example clipping would not bound its influence."""
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model[1].requires_grad_(False)
    private = make(model, noise_multiplier=0.0)
    with pytest.raises(ValueError, match=r"BatchNorm layers in training mode.*\(\['1'\]\)"):
        private(torch.randn(5, 3))
    private.eval()  # running statistics: each example is normalised on its own
    private(torch.randn(5, 3)).sum().backward()
    assert private[0].weight.grad is not None


def test_batch_norm_without_running_statistics_is_refused_in_eval_mode():
    """Without running statistics BatchNorm normalises with the batch's even in eval mode."""
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, track_running_stats=False))
    model[1].requires_grad_(False)
    private = make(model, noise_multiplier=0.0).eval()
    with pytest.raises(ValueError, match=r"without running statistics \(\['1'\]\)"):
        private(torch.randn(5, 3))


def test_empty_micro_batch_gets_a_clear_error_in_the_fallback():
    """The vmap fallback cannot map over 0 examples: an empty Poisson batch there must be
    skipped inside `accumulate` (which still releases the noise)."""

    class Prompt(nn.Module):  # raw parameter: runs through the vmap fallback
        def __init__(self):
            super().__init__()
            self.shift = nn.Parameter(torch.zeros(3))

        def forward(self, x):
            return x + self.shift

    private = make(nn.Sequential(Prompt(), nn.Linear(3, 2)), fallback="vmap")
    with pytest.raises(ValueError, match=r"0 examples.*accumulate"):
        private(torch.randn(0, 3))


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
def test_empty_batch_through_fused_layers_releases_the_noise_of_an_empty_batch(clipping):
    """One process: an empty (Poisson) batch runs forward and backward like any other and
    releases exactly what an empty `accumulate()` block releases (noise / B, one accountant
    step), so a plain training loop needs no special case."""

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4), nn.Linear(4, 10))
        return make(
            model,
            clipping=clipping,
            expected_batch_size=4,
            sample_rate=0.1,
            generator=torch.Generator().manual_seed(3),
        )

    looped, reference = build(), build()
    tokens = torch.zeros(0, 5, dtype=torch.long)
    logits = looped(tokens)
    assert logits.shape == (0, 5, 10)
    nn.functional.cross_entropy(logits.transpose(1, 2), tokens).backward()
    with flashdp.get_controller(reference).accumulate():
        pass
    for (name, got), expected in zip(
        looped.named_parameters(), reference.parameters(), strict=True
    ):
        assert got.grad is not None, name
        assert torch.isfinite(got.grad).all(), name
        assert torch.equal(got.grad, expected.grad), name
    assert flashdp.get_controller(looped).steps == flashdp.get_controller(reference).steps == 1
    assert flashdp.get_controller(looped).accountant.history == [(1.0, 0.1, 1)]
