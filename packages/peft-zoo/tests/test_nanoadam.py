"""NanoAdam against torch.optim.Adam(W) (density 1), brute-force masks, state size, refreshes."""

from __future__ import annotations

import math

import pytest
import torch

import peft_zoo as pz


def params(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(17, 9), (33,), (4, 5, 6)]
    return [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in shapes]


def set_grads(tensors, step: int) -> None:
    generator = torch.Generator().manual_seed(100 + step)
    for p in tensors:
        p.grad = torch.randn(p.shape, generator=generator)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_density_one_equals_torch_adamw(weight_decay):
    ours, theirs = params(), params()
    nano = pz.NanoAdam(ours, lr=1e-2, density=1.0, mask_interval=3, weight_decay=weight_decay)
    reference = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=weight_decay, foreach=False)
    for step in range(10):
        set_grads(ours, step)
        set_grads(theirs, step)
        nano.step()
        reference.step()
    for a, b in zip(ours, theirs, strict=True):
        # same float32 operations: agreement to a few ulps after 10 steps
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_updates_only_the_bottom_k_by_magnitude():
    tensors = params()
    before = [p.detach().clone() for p in tensors]
    nano = pz.NanoAdam(tensors, lr=1e-2, density=0.2)
    set_grads(tensors, 0)
    nano.step()
    for p, old in zip(tensors, before, strict=True):
        k = math.ceil(0.2 * p.numel())
        smallest = set(old.reshape(-1).abs().argsort()[:k].tolist())  # brute force
        changed = set((p.detach() != old).reshape(-1).nonzero().flatten().tolist())
        assert changed == smallest


def test_state_size_is_proportional_to_density():
    tensors = params()
    total = sum(p.numel() for p in tensors)
    adam = torch.optim.Adam(params(), lr=1e-3)
    set_grads(adam.param_groups[0]["params"], 0)
    adam.step()
    adam_bytes = sum(
        t.numel() * t.element_size()
        for s in adam.state.values()
        for k, t in s.items()
        if k != "step"
    )
    for density in (0.05, 0.25, 1.0):
        nano = pz.NanoAdam(params(), lr=1e-3, density=density)
        set_grads(nano.param_groups[0]["params"], 0)
        nano.step()
        k = sum(math.ceil(density * p.numel()) for p in tensors)
        assert nano.moment_elements() == k
        # two float32 moments + one int64 index per selected entry
        assert nano.state_bytes() == k * (4 + 4 + 8)
        assert adam_bytes == total * 8
    assert nano.moment_elements() == total


def test_mask_refreshes_every_m_steps_and_follows_magnitude():
    p = torch.nn.Parameter(torch.tensor([0.1, 0.2, 5.0, 6.0]))
    nano = pz.NanoAdam([p], lr=1e-2, density=0.5, mask_interval=3)
    state = nano.state[p]
    for step in range(6):
        if step == 2:  # between refreshes: the mask stays although |θ| order changes
            with torch.no_grad():
                p.copy_(torch.tensor([7.0, 8.0, 0.3, 0.4]))
        p.grad = torch.ones(4)
        nano.step()
        expected = [0, 1] if step < 3 else [2, 3]
        assert state["indices"].tolist() == expected, step


def test_each_parameter_group_refreshes_on_its_own_interval():
    fast = torch.nn.Parameter(torch.tensor([0.1, 5.0]))
    slow = torch.nn.Parameter(torch.tensor([0.1, 5.0]))
    nano = pz.NanoAdam(
        [{"params": [fast], "mask_interval": 1}, {"params": [slow], "mask_interval": 4}],
        lr=1e-2,
        density=0.5,
    )
    for p in (fast, slow):
        p.grad = torch.ones(2)
    nano.step()
    with torch.no_grad():  # swap the magnitudes: only the interval-1 group sees it next step
        fast.copy_(torch.tensor([5.0, 0.1]))
        slow.copy_(torch.tensor([5.0, 0.1]))
    nano.step()
    assert nano.state[fast]["indices"].tolist() == [1]
    assert nano.state[slow]["indices"].tolist() == [0]


def test_entry_joining_late_takes_adams_first_steps():
    p = torch.nn.Parameter(torch.tensor([0.1, 5.0]))
    nano = pz.NanoAdam([p], lr=1e-2, density=0.5, mask_interval=20)
    for _ in range(20):  # entry 0 trains for 20 steps
        p.grad = torch.ones(2)
        nano.step()
    with torch.no_grad():
        p[0] = 9.0  # the refresh before step 21 swaps in entry 1
    joined = torch.nn.Parameter(torch.tensor([5.0]))
    adam = torch.optim.Adam([joined], lr=1e-2, foreach=False)  # a fresh Adam on that entry
    for step in range(3):
        grad = torch.tensor([1.0 + step])
        p.grad = torch.cat([torch.zeros(1), grad])
        joined.grad = grad
        nano.step()
        adam.step()
        # identical float32 operations up to rounding of the bias corrections
        torch.testing.assert_close(p[1:].detach(), joined.detach(), atol=1e-6, rtol=1e-6)
    assert nano.state[p]["indices"].tolist() == [1]


def test_moments_kept_for_entries_that_stay_selected():
    p = torch.nn.Parameter(torch.tensor([0.1, 0.2, 5.0, 6.0]))
    nano = pz.NanoAdam([p], lr=1e-3, density=0.5, mask_interval=2)
    p.grad = torch.tensor([1.0, 2.0, 0.0, 0.0])
    nano.step()
    with torch.no_grad():
        p[1] = 9.0  # entry 1 leaves the mask, entry 2 joins
    p.grad = torch.zeros(4)
    nano.step()
    nano.step()  # refresh before this step
    state = nano.state[p]
    assert state["indices"].tolist() == [0, 2]
    # entry 0 kept its moment (0.1·0.9² after two zero-gradient steps), entry 2 starts at zero
    torch.testing.assert_close(state["exp_avg"], torch.tensor([0.1 * 0.9**2, 0.0]))


def test_density_schedule():
    tensors = params()
    nano = pz.NanoAdam(
        tensors, lr=1e-3, mask_interval=2, density_schedule=lambda s: 0.1 if s < 2 else 0.5
    )
    counts = []
    for step in range(4):
        set_grads(tensors, step)
        nano.step()
        counts.append(nano.moment_elements())
    sizes = [p.numel() for p in tensors]
    assert counts[:2] == [sum(math.ceil(0.1 * n) for n in sizes)] * 2
    assert counts[2:] == [sum(math.ceil(0.5 * n) for n in sizes)] * 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"density": 0.0}, "density"),
        ({"density": 1.5}, "density"),
        ({"lr": -1.0}, "lr"),
        ({"mask_interval": 0}, "mask_interval"),
        ({"betas": (0.9, 1.0)}, "betas"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pz.NanoAdam(params(), **kwargs)
    bad = pz.NanoAdam(params(), density_schedule=lambda s: 2.0)
    set_grads(bad.param_groups[0]["params"], 0)
    with pytest.raises(ValueError, match="density_schedule"):
        bad.step()
