"""``flashdp.PrivacyEngine`` against Opacus' ``PrivacyEngine`` running the same training loop.

Oracles: Opacus 1.6 (its per-sample-gradient clipping and its RDP accountant), closed forms of
Poisson sampling (binomial batch sizes and inclusion counts) and the controller's own release of
an empty ``accumulate()`` block. Gradient tolerance: ``oracle.RTOL`` (float32, 1e-5 relative to
the largest entry; the two libraries sum the same per-example terms in different orders, and
the observed errors are ~2e-7).
"""

from __future__ import annotations

import math
from collections import namedtuple

import opacus
import pytest
import torch
from oracle import RTOL
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import flashdp
from flashdp import PrivacyEngine
from flashdp.data_loader import DPDataLoader

# Opacus' backward hooks on a first layer whose input (token ids) needs no gradient, and its
# reminder that secure_mode is off: neither concerns the comparison.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning"),
    pytest.mark.filterwarnings("ignore:Secure RNG turned off:UserWarning"),
]

VOCAB, WIDTH, CLASSES, TOKENS = 20, 8, 3, 5


class MeanPool(nn.Module):
    """Averages over the tokens: (B, T, D) -> (B, D)."""

    def forward(self, x):
        return x.mean(1)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Embedding(VOCAB, WIDTH), nn.LayerNorm(WIDTH), MeanPool(), nn.Linear(WIDTH, CLASSES)
    )


def make_dataset(num_examples, seed=1):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (num_examples, TOKENS), generator=generator)
    return TensorDataset(tokens, torch.randint(0, CLASSES, (num_examples,), generator=generator))


def train(engine, model, loader, epochs=1, **options):
    """``engine.make_private`` and the plain Opacus loop; returns the engine's objects and every
    step's gradients."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=loader, **options
    )
    return model, optimizer, loader, run_loop(model, optimizer, loader, epochs)


def run_loop(model, optimizer, loader, epochs):
    grads = []
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            grads.append([p.grad.clone() for p in model.parameters()])
    return grads


def assert_close(got, expected):
    for a, b in zip(got, expected, strict=True):
        error = (a - b).abs().max() / b.abs().max().clamp_min(1e-12)
        assert error <= RTOL, f"relative error {error:.2e}"


# With C = 1.5 the examples' whole-gradient norms (1.21 to 1.77 at the start) straddle the bound,
# and per layer C/√5 = 0.67 clips the head's weight for some examples only; the explicit bounds
# cut into every parameter's range.
PER_LAYER_BOUNDS = [0.25, 0.2, 0.45, 1.0, 0.8]


@pytest.mark.parametrize(
    ("clipping", "flashdp_norm", "opacus_norm"),
    [
        ("flat", 1.5, 1.5),
        ("per_layer", 1.5, [1.5 / math.sqrt(5)] * 5),  # flashdp's default C_l = C/√L
        ("per_layer", PER_LAYER_BOUNDS, PER_LAYER_BOUNDS),
    ],
    ids=["flat", "per_layer_float", "per_layer_list"],
)
def test_three_steps_match_opacus_without_noise(clipping, flashdp_norm, opacus_norm):
    """The same model, data and fixed batches: every step's gradient and the final weights."""
    data = make_dataset(12)
    options = {"noise_multiplier": 0.0, "poisson_sampling": False, "clipping": clipping}
    model, _, _, grads = train(
        PrivacyEngine(),
        make_model(),
        DataLoader(data, batch_size=4),
        max_grad_norm=flashdp_norm,
        backend="reference",
        **options,
    )
    reference, _, _, expected = train(
        opacus.PrivacyEngine(accountant="rdp"),
        make_model(),
        DataLoader(data, batch_size=4),
        max_grad_norm=opacus_norm,
        **options,
    )
    assert len(grads) == len(expected) == 3
    for step_grads, step_expected in zip(grads, expected, strict=True):
        assert_close(step_grads, step_expected)
    assert_close(list(model.parameters()), list(reference.parameters()))
    assert flashdp.get_controller(model).steps == 3


def test_epsilon_matches_opacus_rdp_accountant():
    """Poisson sampling at q = 1/4 (N = 32, batches of 8), σ = 1.1, two epochs: ε at δ = 1e-5
    after the run equals Opacus' RDP accountant's after its own run of the same loop."""
    data = make_dataset(32)
    options = {"noise_multiplier": 1.1, "max_grad_norm": 1.0, "epochs": 2}
    engine = PrivacyEngine()
    model, optimizer, loader, grads = train(
        engine,
        make_model(),
        DataLoader(data, batch_size=8, generator=torch.Generator().manual_seed(2)),
        noise_generator=torch.Generator().manual_seed(3),
        **options,
    )
    reference = opacus.PrivacyEngine(accountant="rdp")
    train(
        reference,
        make_model(),
        DataLoader(data, batch_size=8, generator=torch.Generator().manual_seed(2)),
        **options,
    )
    assert len(grads) == 8
    assert flashdp.get_controller(model).steps == 8
    assert isinstance(loader, DPDataLoader)
    assert loader.sample_rate == 0.25
    assert optimizer.expected_batch_size == 8
    assert engine.get_epsilon(1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-6)
    assert engine.accountant.history == [(1.1, 0.25, 8)]


def test_make_private_with_epsilon_reaches_the_target():
    """ε after the planned epochs (3 epochs of 4 batches at q = 1/4) lies in [target − 0.01,
    target] (Opacus' default epsilon_tolerance), by the engine and by Opacus' RDP accountant
    given the σ found."""
    data = make_dataset(32)
    target, delta = 2.0, 1e-5
    engine = PrivacyEngine()
    model = make_model()
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=8, generator=torch.Generator().manual_seed(4)),
        target_epsilon=target,
        target_delta=delta,
        epochs=3,
        max_grad_norm=1.0,
    )
    assert len(run_loop(model, optimizer, loader, epochs=3)) == 12
    spent = engine.get_epsilon(delta)
    assert target - 0.01 <= spent <= target
    reference = opacus.accountants.RDPAccountant()
    reference.history = [(optimizer.noise_multiplier, 0.25, 12)]
    assert spent == pytest.approx(reference.get_epsilon(delta), rel=1e-6)


def test_poisson_loader_draws_binomial_batches():
    """N = 40 examples at q = 1/10 (batches of 4), 2000 batches: the batch sizes are
    Binomial(40, 0.1) (mean 4, variance 3.6) and every example is in Binomial(2000, 0.1) of them
    (mean 200, sd 13.4); all checked to 5 standard errors. The batches are the user's collate
    function applied to the dataset at the indices a PoissonSampler draws from the same seed."""
    num_examples, batches = 40, 2000
    data = TensorDataset(torch.arange(num_examples))

    def tagged_collate(examples):  # the user's collate function, recognisable by its tag
        return {"index": torch.stack([e[0] for e in examples]), "tag": torch.zeros(len(examples))}

    source = DataLoader(data, batch_size=4, collate_fn=tagged_collate)
    loader = DPDataLoader.from_data_loader(
        source, sampling_generator=torch.Generator().manual_seed(5)
    )
    assert len(loader) == len(source) == 10
    assert loader.sample_rate == 0.1
    assert loader.expected_batch_size == 4
    replay = iter(
        flashdp.PoissonSampler(40, 0.1, steps=batches, generator=torch.Generator().manual_seed(5))
    )
    sizes, counts = [], torch.zeros(num_examples)
    for _ in range(batches // len(loader)):
        for batch in loader:
            assert batch.keys() == {"index", "tag"}
            assert batch["index"].tolist() == next(replay)
            sizes.append(len(batch["index"]))
            counts[batch["index"]] += 1
    sizes = torch.tensor(sizes, dtype=torch.float64)
    q, n = 0.1, len(sizes)
    mean, variance = num_examples * q, num_examples * q * (1 - q)
    assert abs(sizes.mean() - mean) <= 5 * math.sqrt(variance / n)
    # the sample variance's standard error from the binomial's fourth central moment
    fourth = variance * (1 + 3 * (num_examples - 2) * q * (1 - q))
    assert abs(sizes.var() - variance) <= 5 * math.sqrt((fourth - variance**2) / n)
    inclusion_sd = math.sqrt(n * q * (1 - q))
    assert (counts - n * q).abs().max() <= 5 * inclusion_sd


class PairDataset(Dataset):
    """Three examples: a float feature vector and an int label."""

    def __len__(self):
        return 3

    def __getitem__(self, index):
        return torch.full((2, 3), float(index)), index


Pair = namedtuple("Pair", ["features", "label"])


@pytest.mark.parametrize(
    ("collate_fn", "unpack"),
    [
        (None, lambda batch: batch),
        (lambda ex: Pair(*torch.utils.data.default_collate(ex)), lambda batch: batch),
        (
            lambda ex: dict(zip("xy", torch.utils.data.default_collate(ex), strict=True)),
            dict.values,
        ),
    ],
    ids=["default", "namedtuple", "dict"],
)
def test_empty_batches_keep_structure_shape_and_dtype(collate_fn, unpack):
    source = DataLoader(PairDataset(), batch_size=1, collate_fn=collate_fn)
    loader = DPDataLoader.from_data_loader(
        source, sampling_generator=torch.Generator().manual_seed(0)
    )
    batches = [batch for _ in range(10) for batch in loader]  # P(empty) = (2/3)³ per batch
    empty = [batch for batch in batches if len(next(iter(unpack(batch)))) == 0]
    full = [batch for batch in batches if len(next(iter(unpack(batch)))) > 0]
    assert empty
    assert full
    for batch in empty:
        assert type(batch) is type(full[0])
        features, labels = unpack(batch)
        assert features.shape == (0, 2, 3)
        assert features.dtype == torch.float32
        assert labels.shape == (0,)
        assert labels.dtype == torch.int64


def test_worker_processes_draw_the_same_batches():
    """One worker process: the batches (empty ones included, built from the template the worker
    receives) are those a PoissonSampler draws from the same seed."""
    source = DataLoader(PairDataset(), batch_size=1, num_workers=1)
    loader = DPDataLoader.from_data_loader(
        source, sampling_generator=torch.Generator().manual_seed(0)
    )
    assert loader.num_workers == 1
    replay = _sampler(3, 0)
    for (features, labels), indices in zip(loader, replay, strict=True):
        assert labels.tolist() == indices
        assert features.shape == (len(indices), 2, 3)
    assert not all(replay_indices for replay_indices in _sampler(3, 0))  # an empty batch ran


def test_empty_batch_without_an_empty_form_is_refused_at_construction():
    data = TensorDataset(torch.zeros(4, 2))
    source = DataLoader(data, batch_size=2, collate_fn=lambda ex: ("text", torch.stack(ex[0])))
    with pytest.raises(TypeError, match=r"batch\[0\] is a str"):
        DPDataLoader.from_data_loader(source)


def test_empty_batch_steps_with_noise_only():
    """An empty Poisson batch through the plain loop releases noise only, with one accountant
    step: exactly what an empty ``accumulate()`` block releases from the same noise seed (the
    clipped sums are exact zeros either way)."""
    data = make_dataset(3)
    seed = next(s for s in range(100) if not next(iter(_sampler(3, s))))  # first batch empty
    engine = PrivacyEngine()
    options = {"noise_multiplier": 1.3, "max_grad_norm": 0.7, "backend": "reference"}
    model = make_model()
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=1),
        sampling_generator=torch.Generator().manual_seed(seed),
        noise_generator=torch.Generator().manual_seed(6),
        **options,
    )
    x, y = next(iter(loader))
    assert x.shape == (0, TOKENS)
    assert y.shape == (0,)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    assert flashdp.get_controller(model).steps == 1
    assert engine.accountant.steps == 1

    twin = flashdp.make_private(
        make_model(),
        clipping="flat",
        expected_batch_size=1,
        sample_rate=1 / 3,
        generator=torch.Generator().manual_seed(6),
        **options,
    )
    with flashdp.get_controller(twin).accumulate():
        pass
    for released, expected in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(released.grad, expected.grad)


def _sampler(num_examples, seed):
    """The engine's sampling of a loader with batches of 1: q = 1/N, N batches an epoch."""
    return flashdp.PoissonSampler(
        num_examples, 1 / num_examples, num_examples, torch.Generator().manual_seed(seed)
    )


def _private(engine=None, model=None, **options):
    model = make_model() if model is None else model
    defaults = {
        "module": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "data_loader": DataLoader(make_dataset(8), batch_size=4),
        "noise_multiplier": 1.0,
        "max_grad_norm": 1.0,
    }
    return (engine or PrivacyEngine()).make_private(**{**defaults, **options})


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"batch_first": False}, ValueError, "examples in the"),
        ({"clipping": "adaptive"}, ValueError, "adaptive clipping is not implemented"),
        ({"grad_sample_mode": "ghost"}, ValueError, "grad_sample_mode='ghost' is not supported"),
        ({"rand_on_empty": True}, ValueError, "fabricated data"),
        ({"wrap_model": False}, ValueError, "in place"),
        ({"augmult": 2}, TypeError, "unexpected keyword arguments"),
        ({"max_grad_norm": [1.0] * 5}, ValueError, "needs clipping='per_layer'"),
        ({"max_grad_norm": [1.0] * 4, "clipping": "per_layer"}, ValueError, "4 bounds"),
        (
            {"sampling_generator": torch.Generator(), "poisson_sampling": False},
            ValueError,
            "poisson",
        ),
        (
            {"optimizer": torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)},
            ValueError,
            "not parameters of the module",
        ),
    ],
)
def test_options_flashdp_cannot_honour_are_refused(options, error, match):
    with pytest.raises(error, match=match):
        _private(**options)


def test_engine_settings_are_refused():
    with pytest.raises(ValueError, match=r"only 'rdp'.*reported by"):
        PrivacyEngine(accountant="prv")
    with pytest.raises(ValueError, match="no cryptographically secure source"):
        PrivacyEngine(secure_mode=True)
    with pytest.raises(RuntimeError, match="call make_private first"):
        PrivacyEngine().get_epsilon(1e-5)


def test_a_second_model_or_a_private_model_is_refused():
    engine = PrivacyEngine()
    model, _, _ = _private(engine)
    with pytest.raises(RuntimeError, match="already made a model private"):
        _private(engine)
    with pytest.raises(ValueError, match="already private"):
        _private(model=model)


def test_step_needs_exactly_one_released_batch():
    model, optimizer, _ = _private(poisson_sampling=False)
    x, y = make_dataset(4).tensors
    with pytest.raises(RuntimeError, match="without a released logical batch"):
        optimizer.step()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    with pytest.raises(RuntimeError, match="without a released logical batch"):
        optimizer.step()  # the same gradients again
    optimizer.zero_grad()
    for _ in range(2):
        nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match=r"2 logical batches.*accumulate"):
        optimizer.step()


def test_epsilon_without_poisson_sampling_says_why():
    engine = PrivacyEngine()
    _private(engine, poisson_sampling=False)
    with pytest.raises(RuntimeError, match=r"poisson_sampling=False.*flashdp\.get_epsilon"):
        engine.get_epsilon(1e-5)
    with pytest.raises(ValueError, match="calibrates σ for Poisson sampling"):
        PrivacyEngine().make_private_with_epsilon(
            module=make_model(),
            optimizer=torch.optim.SGD(make_model().parameters(), lr=0.1),
            data_loader=DataLoader(make_dataset(8), batch_size=4),
            target_epsilon=1.0,
            target_delta=1e-5,
            epochs=1,
            max_grad_norm=1.0,
            poisson_sampling=False,
        )


def test_optimizer_passes_through_to_the_wrapped_one():
    """Learning-rate schedulers, the state dict and parameter groups are the wrapped
    optimizer's; only a released batch lets it step."""
    model, optimizer, _ = _private(poisson_sampling=False, backend="reference")
    inner = optimizer.original_optimizer
    assert optimizer.param_groups is inner.param_groups
    assert optimizer.state is inner.state
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    x, y = make_dataset(4).tensors
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    scheduler.step()
    assert inner.param_groups[0]["lr"] == 0.05
    assert optimizer.state_dict() == inner.state_dict()


@pytest.mark.parametrize(
    ("sample_rate", "steps"), [(1 / 3, 3), (1 / 49, 49), (0.1, 10), (0.3, 4), (1.0, 1)]
)
def test_one_epoch_of_poisson_batches_is_the_ceiling_of_one_over_q(sample_rate, steps):
    """⌈1/q⌉ batches by default, also where 1/q is an integer that floating-point division
    misses (q = 1/3, 1/49)."""
    assert len(flashdp.PoissonSampler(10, sample_rate)) == steps


def test_denominator_equals_opacus_when_the_batches_do_not_divide_the_data():
    """N = 405 in batches of 10: q = 1/41, and Opacus divides by ⌊q·N⌋ = 9 (not round(9.88)):
    a switched script keeps its gradient scale."""
    data = make_dataset(405)
    model = make_model()
    ours = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=10),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    model = make_model()
    theirs = opacus.PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=10),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    assert ours[1].expected_batch_size == theirs[1].expected_batch_size == 9
    assert ours[2].sample_rate == theirs[2].sample_rate == 1 / 41


def test_a_model_made_private_by_the_engine_refuses_ddp(tmp_path):
    """The engine's loader samples the whole dataset in every process: under DDP an example
    could join several ranks' batches while ε is reported for q. Refused at the forward."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = make_model()
        model, _, _ = PrivacyEngine().make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(make_dataset(20), batch_size=5),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )
        ddp = nn.parallel.DistributedDataParallel(model)
        with pytest.raises(RuntimeError, match=r"made private by flashdp\.PrivacyEngine"):
            ddp(make_dataset(3)[:][0])
    finally:
        dist.destroy_process_group()
