"""IFD against a direct computation, LESS's projection and Adam transform, random and full."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_llama, tiny_task

from qcs import (
    LessConfig,
    LoraSettings,
    RademacherProjector,
    ResponseScorer,
    TrainConfig,
    add_lora,
    ifd_scores,
    ifd_selection,
    less_scores,
    random_selection,
)
from qcs.selection import seeded
from qcs.train import lora_state


def mean_nll(model, ids, start):
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0].double()
    return float(F.cross_entropy(logits[start - 1 : -1], ids[start:]))


def test_ifd_is_the_ratio_of_perplexities_under_the_base_model():
    tokenizer, pool, _ = tiny_task()
    base = tiny_llama(len(tokenizer), layers=3)
    # both perplexities over the response's second to last token
    reference = [
        math.exp(mean_nll(base, torch.cat([p, r]), len(p) + 1) - mean_nll(base, r, 1))
        for p, r in zip(pool.prompt_ids, pool.response_ids, strict=True)
    ]
    model = add_lora(tiny_llama(len(tokenizer), layers=3), LoraSettings(layers=1))
    with torch.no_grad():  # adapters that change the model: IFD must switch them off
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    got = ifd_scores(ResponseScorer(model, pool))
    torch.testing.assert_close(got, torch.tensor(reference, dtype=torch.float64),
                               rtol=1e-5, atol=0)  # fmt: skip


def test_rademacher_projection_keeps_inner_products_within_the_jl_bound():
    """For m unit vectors and dimension d, JL keeps every pairwise inner product within
    ε = sqrt(8 ln m / d) (with high probability; seeded here)."""
    m, dim_in, dim_out = 20, 5000, 2048
    x = F.normalize(torch.randn(m, dim_in, generator=torch.Generator().manual_seed(0)), dim=1)
    projector = RademacherProjector(dim_in, dim_out, seed=1, block=1500)
    y = projector(x)
    bound = math.sqrt(8 * math.log(m) / dim_out)
    assert float((y @ y.T - x @ x.T).abs().max()) <= bound
    assert torch.equal(projector(x), y)  # the same seed, the same matrix
    entries = projector(torch.eye(dim_in)[:3])
    assert torch.allclose(entries.abs(), torch.full_like(entries, 1 / math.sqrt(dim_out)))


def test_less_scores_match_a_direct_recomputation():
    """One checkpoint: warm-up, then Adam-transformed pool gradients and plain validation
    gradients, projected, normalised, mean cosine (recomputed here with the model's own loss)."""
    tokenizer, pool, validation = tiny_task()
    model = add_lora(tiny_llama(len(tokenizer), layers=3), LoraSettings(layers=1), seed=0)
    config = LessConfig(warmup_fraction=0.5, warmup_epochs=1, projection_dim=64,
                        train=TrainConfig(steps=1, batch_size=4, lr=1e-2))  # fmt: skip
    pool_scorer = ResponseScorer(model, pool)
    val_scorer = ResponseScorer(model, validation)
    initial = lora_state(model)
    scores = less_scores(pool_scorer, val_scorer, config, seed=0)
    assert all(torch.equal(p, initial[n]) for n, p in model.named_parameters() if p.requires_grad)

    # the same warm-up by hand: 4 random examples, one step of Adam at lr 1e-2
    params = [p for p in model.parameters() if p.requires_grad]
    warm = torch.randperm(len(pool), generator=seeded(0, "less-warmup"))[:4]
    optimizer = torch.optim.Adam(params, lr=1e-2)
    ids = torch.Generator().manual_seed(0)
    order = warm[torch.randperm(4, generator=ids)].tolist()
    loss = ResponseScorer(model, pool, cache_prefix=False).weighted_loss(order)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    avg = torch.cat([optimizer.state[p]["exp_avg"].reshape(-1) for p in params])
    avg_sq = torch.cat([optimizer.state[p]["exp_avg_sq"].reshape(-1) for p in params])

    def grad(data, i):
        ids = torch.cat([data.prompt_ids[i], data.response_ids[i]])
        logits = model(input_ids=ids[None]).logits[0]
        start = len(data.prompt_ids[i])
        loss = F.cross_entropy(logits[start - 1 : -1], ids[start:])
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])

    rows = []
    for i in range(len(pool)):
        g = grad(pool, i)
        rows.append((0.9 * avg + 0.1 * g) / torch.sqrt(0.999 * avg_sq + 0.001 * g**2 + 1e-8))
    targets = torch.stack([grad(validation, j) for j in range(len(validation))])
    projector = RademacherProjector(avg.numel(), 64, seed=0)
    a = F.normalize(projector(torch.stack(rows)), dim=1)
    b = F.normalize(projector(targets), dim=1)
    torch.testing.assert_close(scores, (a @ b.T).mean(1).double(), rtol=1e-4, atol=1e-5)


def test_ifd_ranks_scores_below_one_first():
    scores = torch.tensor([0.5, 1.2, 0.9, 3.0, 0.7], dtype=torch.float64)
    selection = ifd_selection(None, 0.6, scores)  # 3 of 5
    assert selection.indices.tolist() == [0, 2, 4]
    assert ifd_selection(None, 0.8, scores).indices.tolist() == [0, 1, 2, 4]


def test_random_selection_is_seeded_and_sized():
    a, b = random_selection(100, 0.05, seed=4), random_selection(100, 0.05, seed=4)
    assert torch.equal(a.indices, b.indices)
    assert len(a) == 5
    assert not torch.equal(a.indices, random_selection(100, 0.05, seed=5).indices)
    with pytest.raises(ValueError, match="budget"):
        random_selection(100, 1.5)
