"""The opt-in vmap fallback: modules with raw parameters or unsupported layers, clipped per example.

Oracle: brute-force per-example gradients of the original model (``oracle.brute_force``), clipped
explicitly; tolerance as there (float32, 1e-5 of the largest entry).
"""

from __future__ import annotations

import copy

import pytest
import torch
from oracle import assert_matches, brute_force
from torch import nn
from torch.utils.checkpoint import checkpoint

import flashdp

SLACK = 1 + 1e-5  # float32 rounding of the norms in the sensitivity bound


class Adapter(nn.Module):
    """A frozen linear layer plus a gated low-rank update held in raw parameters, a trainable
    nn.Linear inside (covered by the fallback with the rest of the module) and dropout."""

    def __init__(self, width: int, rank: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.base = nn.Linear(width, width).requires_grad_(False)
        self.down = nn.Parameter(torch.randn(rank, width) / width**0.5)
        self.up = nn.Parameter(torch.randn(width, rank))
        self.gate = nn.Linear(width, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = self.dropout(x) @ self.down.T @ self.up.T
        return self.base(x) + torch.sigmoid(self.gate(x)) * update


class ConvAdapter(nn.Module):
    """A trainable nn.Conv1d over the sequence (no fused DP layer for it)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(width, width, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, width)
        return x + self.conv(x.transpose(1, 2)).transpose(1, 2)


def model_with(adapter: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), adapter, nn.Tanh(), nn.Linear(8, 3))


def sum_mse(out, y):
    return (out - y).square().sum()


def make(model, **kwargs):
    options = {
        "max_grad_norm": 1.0,
        "noise_multiplier": 0.0,
        "loss_reduction": "sum",
        "backend": "reference",
        "fallback": "vmap",
    }
    return flashdp.make_private(model, **{**options, **kwargs})


def data(batch: int = 5, seq: int = 4):
    generator = torch.Generator().manual_seed(0)
    x = 2 * torch.randn(batch, seq, 6, generator=generator)
    return x, torch.randn(batch, seq, 3, generator=generator)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
@pytest.mark.parametrize("kind", ["adapter", "conv"])
def test_fallback_matches_brute_force(kind, clipping, reduction):
    torch.manual_seed(0)
    model = model_with(Adapter(8) if kind == "adapter" else ConvAdapter(8))
    x, y = data()
    expected = brute_force(model, sum_mse, x, y, clipping, max_grad_norm=1.0)
    private = make(copy.deepcopy(model), clipping=clipping, loss_reduction=reduction)
    # the outermost module holding uncovered parameters runs under vmap
    wrapped = ("2",) if kind == "adapter" else ("2.conv",)
    assert flashdp.get_controller(private).fallback_modules == wrapped
    assert isinstance(private[0], flashdp.DPLinear)  # the rest stays fused
    loss = sum_mse(private(x), y)
    (loss if reduction == "sum" else loss / len(x)).backward()
    assert_matches(private, expected)


def test_fallback_keeps_type_parameters_and_state_dict():
    torch.manual_seed(0)
    model = model_with(Adapter(8))
    adapter, down = model[2], model[2].down
    before = {k: v.clone() for k, v in model.state_dict().items()}
    private = make(model)
    assert private[2] is adapter
    assert type(private[2]) is Adapter
    assert private[2].down is down
    assert private.state_dict().keys() == before.keys()
    assert all(torch.equal(private.state_dict()[k], v) for k, v in before.items())
    names = flashdp.get_controller(private).parameter_names
    assert {"2.down", "2.up", "2.gate.weight", "2.gate.bias"} <= set(names)
    assert not any(name.startswith("2.base") for name in names)  # frozen: not clipped, no grad
    x, y = data()
    sum_mse(private(x), y).backward()
    assert private[2].base.weight.grad is None
    with torch.no_grad():  # no gradients: the original forward runs, same values
        torch.testing.assert_close(private(x), model_with_same_weights(private)(x))


def model_with_same_weights(private):
    torch.manual_seed(0)
    fresh = model_with(Adapter(8))
    fresh.load_state_dict(private.state_dict())
    return fresh


class CalledTwice(nn.Module):
    """One scale vector applied at two depths (as deep CaPT's adapter runs once per layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class TwoUses(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.shared, self.out = nn.Linear(6, 8), CalledTwice(), nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.shared(torch.tanh(self.shared(self.inp(x))))))


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
def test_module_called_twice_is_clipped_once_per_example(clipping):
    """The calls of one backward pass are summed per example before clipping."""
    torch.manual_seed(1)
    model = TwoUses()
    x, y = data()
    expected = brute_force(model, sum_mse, x, y, clipping, max_grad_norm=1.0)
    private = make(copy.deepcopy(model), clipping=clipping)
    sum_mse(private(x), y).backward()
    assert_matches(private, expected)


def test_accumulated_micro_batches_equal_one_batch():
    torch.manual_seed(2)
    model = model_with(Adapter(8))
    x, y = data(batch=6)
    expected = brute_force(model, sum_mse, x, y, "flat", max_grad_norm=1.0)
    private = make(copy.deepcopy(model), clipping="flat")
    with flashdp.get_controller(private).accumulate():
        for part in (slice(0, 2), slice(2, 6)):
            sum_mse(private(x[part]), y[part]).backward()
    assert_matches(private, expected)


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
def test_sensitivity_of_fallback_parameters(clipping):
    """Removing one example moves each parameter's pre-noise sum by at most C_l (per-layer) and
    the whole by at most C, with an example whose gradient is ~1e6 times the bound."""
    torch.manual_seed(3)
    model = model_with(Adapter(8))
    x, y = data(batch=4)
    scale = torch.tensor([1.0, 1e6, 1.0, 1.0])

    def sums(keep):
        private = make(copy.deepcopy(model), clipping=clipping, expected_batch_size=4)
        per_example = (private(x[keep]) - y[keep]).square().sum((1, 2))
        (per_example * scale[keep]).sum().backward()
        bounds = dict(flashdp.get_controller(private).config.layer_norms)
        return {k: p.grad * 4 for k, p in private.named_parameters() if p.requires_grad}, bounds

    full, bounds = sums([0, 1, 2, 3])
    for removed in range(4):
        partial, _ = sums([i for i in range(4) if i != removed])
        diffs = {name: (full[name] - partial[name]).norm() for name in full}
        assert torch.stack(list(diffs.values())).norm() <= SLACK
        for name, diff in diffs.items():
            assert clipping == "flat" or diff <= bounds[name] * SLACK, name


class Checkpointed(nn.Module):
    """Activation checkpointing around the fallback module or around the last fused layer."""

    def __init__(self, segment: str, reentrant: bool | None) -> None:
        super().__init__()
        self.inp, self.adapter, self.out = nn.Linear(6, 8), Adapter(8), nn.Linear(8, 3)
        self.segment, self.reentrant = segment, reentrant

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        run = self.reentrant is not None and self.segment == "fallback"
        h = checkpoint(self.adapter, h, use_reentrant=self.reentrant) if run else self.adapter(h)
        if self.reentrant is None or self.segment == "fallback":
            return self.out(torch.tanh(h))
        return checkpoint(lambda t: self.out(torch.tanh(t)), h, use_reentrant=self.reentrant)


@pytest.mark.parametrize("segment", ["fused", "fallback"])
def test_activation_checkpointing(segment):
    """Non-reentrant recomputation is never back-propagated itself: the gradients match brute
    force in one release. Reentrant recomputation back-propagates in a nested backward pass,
    which would release its examples apart from the rest of the batch: refused, nothing
    released."""
    torch.manual_seed(9)
    x, y = data()
    model = Checkpointed(segment, reentrant=None)
    expected = brute_force(model, sum_mse, x, y, "flat", max_grad_norm=1.0)
    for reentrant in (False, True):
        checkpointed = Checkpointed(segment, reentrant)
        checkpointed.load_state_dict(model.state_dict())
        private = make(checkpointed, clipping="flat")
        controller = flashdp.get_controller(private)
        if not reentrant:
            sum_mse(private(x), y).backward()
            assert controller.steps == 1
            assert_matches(private, expected)
            continue
        with pytest.raises(RuntimeError, match=r"recomputed inside a backward pass.*use_reentrant"):
            sum_mse(private(x), y).backward()
        assert controller.steps == 0
        assert all(p.grad is None for p in private.parameters())


def test_dropout_draws_differ_per_example():
    """randomness='different': identical examples get different dropout masks."""
    torch.manual_seed(4)
    private = make(model_with(Adapter(8, dropout=0.5)))
    out = private(torch.ones(4, 3, 6))
    assert not torch.allclose(out[0], out[1])


class Parent(nn.Module):
    """Uses its child's parameter directly (as CaPT once used its task vectors)."""

    def __init__(self) -> None:
        super().__init__()
        self.child = CalledTwice()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.tanh(x @ torch.ones(6, 8) * self.child.scale))


def test_parameter_used_outside_its_fallback_module_is_refused_then_named():
    torch.manual_seed(5)
    x, y = data()
    private = make(Parent())
    with pytest.raises(RuntimeError, match=r"escape clipping.*fallback_modules"):
        sum_mse(private(x), y).backward()
    assert private.child.scale.grad is None
    model = Parent()
    expected = brute_force(model, sum_mse, x, y, "per_layer", max_grad_norm=1.0)
    private = make(copy.deepcopy(model), fallback_modules=[""])
    assert flashdp.get_controller(private).fallback_modules == ("",)
    sum_mse(private(x), y).backward()
    assert_matches(private, expected)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(11, 8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.embedding(ids)))


def test_tied_parameters_inside_one_fallback_module():
    torch.manual_seed(6)
    ids = torch.randint(0, 11, (5, 4), generator=torch.Generator().manual_seed(0))
    target = torch.randn(5, 4, 11, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"shared.*fallback_modules=\[its name\]"):
        make(Tied())
    model = Tied()
    expected = brute_force(model, sum_mse, ids, target, "flat", max_grad_norm=1.0)
    private = make(copy.deepcopy(model), clipping="flat", fallback_modules=[""])
    sum_mse(private(ids), target).backward()
    assert_matches(private, expected)


class SameChildTwice(nn.Module):
    """One child module registered under two names (as T5 registers its shared embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = CalledTwice()
        self.second = self.first

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


def test_child_registered_twice_inside_one_fallback_module():
    """The module keeps its parameter object across steps (functional_call's own tying would
    leave the per-example tensor in its place), and both steps match brute force."""
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(6, 8), SameChildTwice(), nn.Linear(8, 3))
    x, y = data()
    expected = brute_force(copy.deepcopy(model), sum_mse, x, y, "per_layer", max_grad_norm=1.0)
    private = make(copy.deepcopy(model), fallback_modules=["1"])
    scale = private[1].first.scale
    for _ in range(2):
        private.zero_grad()
        sum_mse(private(x), y).backward()
        assert private[1].first.scale is scale
        assert private[1].second.scale is scale
        assert_matches(private, expected)


def test_unsupported_module_without_fallback_names_module_type_and_option():
    with pytest.raises(ValueError, match=r"'2\.conv' \(Conv1d\).*2\.conv\.weight.*fallback='vmap'"):
        make(model_with(ConvAdapter(8)), fallback=None)
    with pytest.raises(ValueError, match=r"'2' \(Adapter\).*2\.down.*fallback='vmap'"):
        make(model_with(Adapter(8)), fallback=None)


class WithItem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return x * self.scale / x.abs().max().item()


class WithBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x):  # (B, T, 8)
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


def test_what_cannot_run_per_example_fails_loudly():
    x, y = data()
    private = make(model_with(WithItem()))
    with pytest.raises(RuntimeError, match=r"'2' \(WithItem\) cannot run one example.*item"):
        private(x)
    private = make(model_with(WithBatchNorm()))
    with pytest.raises(ValueError, match=r"private model contains BatchNorm.*2\.norm"):
        private(x)
    with pytest.raises(ValueError, match=r"'2\.norm' \(BatchNorm1d\) contains BatchNorm"):
        private[2](torch.randn(5, 4, 8))  # the fallback module called on its own
    private.eval()  # running statistics: no mixing, per-example gradients exist
    sum_mse(private(x), y).backward()
    assert private[2].norm.weight.grad is not None


class Returns(nn.Module):
    def __init__(self, reduce: bool) -> None:
        super().__init__()
        self.reduce = reduce
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x, extra=None):
        out = x * self.scale
        return out.sum() if self.reduce else out


def test_bad_fallback_inputs_and_outputs():
    x, _ = data()
    private = make(model_with(Returns(reduce=True)))
    with pytest.raises(ValueError, match="keep the examples in its first dimension"):
        private(x)
    private = make(nn.Sequential(Returns(reduce=False)))
    with pytest.raises(ValueError, match=r"tensor input #1 has shape \(3, 8\)"):
        private[0](torch.randn(5, 8), torch.randn(3, 8))
    shared = private[0](torch.randn(5, 8), torch.randn(1, 8))  # one tensor for all examples
    assert shared.shape == (5, 8)
    with pytest.raises(ValueError, match="no tensor input"):
        private[0](3.0)


class TupleOut(nn.Module):
    """Returns a tuple holding None and a dict with a non-tensor (as Hugging Face layers return
    ``(hidden, None)`` or ModelOutputs), and takes a keyword tensor argument."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(8))

    def forward(self, x, *, shift=None):
        return x * self.scale + shift, None, {"gate": torch.sigmoid(x @ self.scale), "n": 3}


class UsesTuple(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.block, self.out = nn.Linear(6, 8), TupleOut(), nn.Linear(8, 3)

    def forward(self, x):
        hidden, nothing, extra = self.block(self.inp(x), shift=torch.ones(1, 1, 8))
        assert nothing is None
        assert extra["n"] == 3
        return self.out(torch.tanh(hidden) * extra["gate"].unsqueeze(-1))


def test_outputs_with_none_and_non_tensors():
    torch.manual_seed(8)
    model = UsesTuple()
    x, y = data()
    expected = brute_force(model, sum_mse, x, y, "flat", max_grad_norm=1.0)
    private = make(copy.deepcopy(model), clipping="flat")
    sum_mse(private(x), y).backward()
    assert_matches(private, expected)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"fallback": "hooks"}, ValueError, "fallback must be None or one of"),
        ({"fallback": None, "fallback_modules": ["2"]}, ValueError, "needs fallback='vmap'"),
        ({"fallback_modules": "2"}, TypeError, "not a string"),
        ({"fallback_modules": ["nope"]}, ValueError, "fallback_modules not found.*nope"),
    ],
)
def test_bad_fallback_settings(kwargs, error, message):
    with pytest.raises(error, match=message):
        make(model_with(Adapter(8)), **kwargs)


def test_second_backward_through_fallback_is_refused():
    private = make(model_with(Adapter(8)), expected_batch_size=5)
    x, y = data()
    loss = sum_mse(private(x), y)

    def logical_batch():
        with flashdp.get_controller(private).accumulate():
            loss.backward(retain_graph=True)
            loss.backward()

    with pytest.raises(RuntimeError, match="twice through the same forward"):
        logical_batch()
    assert all(p.grad is None for p in private.parameters())
