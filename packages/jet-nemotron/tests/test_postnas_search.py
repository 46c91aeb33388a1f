"""Placement search and probes: beam search against exhaustive search, probe scores against a
per-example cross-entropy, the probes' answers against their own arithmetic and keys, and block
selection on a tiny model."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from jet_nemotron.postnas import search as search_module
from jet_nemotron.postnas.probes import (
    Probe,
    answer_probe,
    arithmetic_probe,
    lm_probe,
    retrieval_probe,
    score_probe,
)
from jet_nemotron.postnas.search import PlacementEvaluator, beam_search, search_placement
from jet_nemotron.postnas.selection import select_block
from jet_nemotron.postnas.supernet import SupernetTrainConfig, SuperNetwork

VOCAB = 64


@pytest.fixture(autouse=True)
def reference_ops(monkeypatch):
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "reference")


def llama(layers: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def exhaustive(score, n: int, size: int):
    return min((score(c), c) for c in itertools.combinations(range(n), size))


@pytest.mark.parametrize("seed", range(3))
def test_beam_search_matches_exhaustive_search(seed):
    generator = torch.Generator().manual_seed(seed)
    n = 7
    values = torch.randn(n, generator=generator).tolist()
    additive = lambda p: sum(values[i] for i in p)  # noqa: E731
    # an additive score is solved greedily: beam width 1 finds the exhaustive optimum
    for (placement, score), size in zip(beam_search(additive, n, 4, 1), range(1, 5), strict=True):
        assert (score, placement) == exhaustive(additive, n, size)
    # an arbitrary score: a beam holding every placement of each size is exhaustive
    table = {c: torch.rand((), generator=generator).item()
             for s in range(1, 4) for c in itertools.combinations(range(n), s)}  # fmt: skip
    arbitrary = table.__getitem__
    width = max(math.comb(n, s) for s in range(4))
    for (placement, score), size in zip(beam_search(arbitrary, n, 3, width), range(1, 4),
                                        strict=True):  # fmt: skip
        assert (score, placement) == exhaustive(arbitrary, n, size)


def test_beam_search_refuses_bad_budgets():
    with pytest.raises(ValueError, match=r"in 1\.\.4"):
        beam_search(len, 4, 5, 1)
    with pytest.raises(ValueError, match=r"in 1\.\.4"):
        beam_search(len, 4, 0, 1)
    with pytest.raises(ValueError, match="beam_width"):
        beam_search(len, 4, 2, 0)


def brute_force_score(model, probe: Probe) -> tuple[float, float]:
    """Each example alone, unpadded, full logits."""
    losses, hits = [], []
    for ids, mask in zip(probe.input_ids, probe.answer_mask, strict=True):
        end = int(mask.nonzero().max()) + 1
        logits = model(input_ids=ids[None, :end]).logits[0, :-1]
        chosen = mask[1:end]
        losses.append(F.cross_entropy(logits[chosen], ids[1:end][chosen]).item())
        hits.append(bool((logits[chosen].argmax(-1) == ids[1:end][chosen]).all()))
    return sum(losses) / len(losses), sum(hits) / len(hits)


def test_probe_scores_match_each_example_scored_alone():
    model = llama()
    generator = torch.Generator().manual_seed(1)
    sequences = [(torch.randint(0, VOCAB, (n,), generator=generator).tolist(), [5, 9][:a])
                 for n, a in ((7, 2), (3, 1), (11, 2))]  # fmt: skip
    padded = answer_probe("toy", sequences)
    for probe in (padded, lm_probe(torch.randint(0, VOCAB, (3, 9), generator=generator))):
        with torch.no_grad():
            loss, accuracy = brute_force_score(model, probe)
        score = score_probe(model, probe, batch_size=2)
        assert score.loss == pytest.approx(loss, rel=1e-5)
        assert score.accuracy == accuracy


@pytest.fixture(scope="module")
def tokenizer():
    import benchdata

    return benchdata.smollm2_135m().tokenizer


def test_probe_answers_are_the_sums_and_the_keys(tokenizer):
    arithmetic = arithmetic_probe(tokenizer, examples=5, seed=2)
    for ids, mask in zip(arithmetic.input_ids, arithmetic.answer_mask, strict=True):
        end = int(mask.nonzero().max()) + 1
        text = tokenizer.decode(ids[:end])
        *_, question = text.split("\n")
        left, answer = question.split("=")
        a, b = (int(x) for x in left.split("+"))
        assert int(tokenizer.decode(ids[mask])) == a + b == int(answer)
    retrieval = retrieval_probe(tokenizer, ["A quiet line of filler text."] * 20, 128, 3)
    for ids, mask in zip(retrieval.input_ids, retrieval.answer_mask, strict=True):
        key = tokenizer.decode(ids[mask]).strip()
        assert len(key) == 5
        assert tokenizer.decode(ids[~mask]).count(key) == 2


def test_probes_refuse_bad_input():
    with pytest.raises(ValueError, match="answer tokens"):
        Probe("x", torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="int64"):
        Probe("x", torch.zeros(3), torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="L >= 2"):
        lm_probe(torch.zeros(2, 1, dtype=torch.long))


def probes() -> list[Probe]:
    generator = torch.Generator().manual_seed(2)
    lm = lm_probe(torch.randint(0, VOCAB, (2, 12), generator=generator))
    answer = torch.zeros(2, 12, dtype=torch.bool)
    answer[:, -2:] = True
    lookup = Probe("lookup", torch.randint(0, VOCAB, (2, 12), generator=generator), answer)
    return [lm, lookup]


def test_placement_search_reuses_evaluations_and_normalises_gaps(monkeypatch):
    supernet = SuperNetwork(llama())
    calls = {"n": 0}
    score = search_module.score_probe

    def counted(*args, **kwargs):
        calls["n"] += 1
        return score(*args, **kwargs)

    monkeypatch.setattr(search_module, "score_probe", counted)
    result = search_placement(supernet, probes(), 2, beam_width=2,
                              objectives=("combined", "lm", "lookup"))  # fmt: skip
    # all, none, 4 singles, then pairs: every placement is evaluated once on both probes
    evaluated = {tuple(map(int, k.split(","))) if k else () for k in result.scores}
    assert calls["n"] == 2 * len(evaluated)
    assert len(evaluated) <= 2 + 4 + math.comb(4, 2)
    evaluator = PlacementEvaluator(supernet, probes())
    assert evaluator.gap((0, 1, 2, 3), "lm") == 0.0
    assert evaluator.gap((), "lm") == 1.0
    for task, gaps in result.single_layer.items():
        assert gaps == [evaluator.gap((i,), task) for i in range(4)]
        assert result.important_layers[task][0] == min(range(4), key=gaps.__getitem__)
    combined = evaluator.objective("combined")
    assert result.placement == result.best["combined"][-1][0]
    assert [s for _, s in result.best["combined"]] == [
        pytest.approx(combined(p)) for p, _ in result.best["combined"]
    ]


def test_evaluations_resume_from_their_cache_and_refuse_other_weights(tmp_path, monkeypatch):
    supernet, cache = SuperNetwork(llama()), tmp_path / "scores.json"
    first = search_placement(supernet, probes(), 2, beam_width=1, cache=cache)
    monkeypatch.setattr(search_module, "score_probe", None)  # a rerun must not score anything
    assert search_placement(supernet, probes(), 2, beam_width=1, cache=cache) == first
    other = SuperNetwork(llama())
    with torch.no_grad():
        next(iter(other.linear_blocks()[0].parameters())).add_(1.0)
    with pytest.raises(ValueError, match="other super-network weights or probes"):
        PlacementEvaluator(other, probes(), cache=cache)


def test_a_task_without_a_gap_is_left_out_of_the_objective():
    supernet = SuperNetwork(llama())
    evaluator = PlacementEvaluator(supernet, probes())
    everything = (0, 1, 2, 3)
    # make "lookup" score the same with and without attention: no gap to normalise
    evaluator.scores[()] = {**evaluator(()), "lookup": evaluator(everything)["lookup"]}
    assert evaluator.separating_tasks() == ["lm"]
    with pytest.raises(ValueError, match="does not separate attention from none"):
        evaluator.gap((1,), "lookup")
    combined = evaluator.objective("combined")
    assert combined((1,)) == evaluator.gap((1,), "lm")


def test_placement_search_refuses_bad_input():
    supernet = SuperNetwork(llama())
    with pytest.raises(ValueError, match="at least one probe"):
        search_placement(supernet, [], 1)
    with pytest.raises(ValueError, match=r"in 1\.\.4"):
        search_placement(supernet, probes(), 5)
    with pytest.raises(ValueError, match="objectives must name some of"):
        search_placement(supernet, probes(), 1, objectives=("mmlu",))


def test_block_selection_trains_each_candidate_the_same_way():
    config = SupernetTrainConfig(layerwise_steps=2, path_steps=1, batch_size=2)
    data = torch.randint(0, VOCAB, (6, 12), generator=torch.Generator().manual_seed(4))
    original, results = select_block(llama(), data, [1], probes(), ["gla", "retnet"], config)
    assert [r.excess_loss for r in results] == sorted(r.excess_loss for r in results)
    assert {r.block for r in results} == {"gla", "retnet"}
    for r in results:
        expected = sum(r.scores[t].loss - original[t].loss for t in original) / len(original)
        assert r.excess_loss == pytest.approx(expected)
        assert r.parameters > 0
        assert r.state_numel > 0
    with pytest.raises(ValueError, match="distinct names"):
        select_block(llama(), data, [1], probes(), ["gla", "lstm"], config)
    with pytest.raises(ValueError, match="at least one candidate"):
        select_block(llama(), data, [1], probes(), [], config)
    with pytest.raises(ValueError, match="at least one probe"):
        select_block(llama(), data, [1], [], ["gla"], config)
    with pytest.raises(ValueError, match="keeps attention in every layer"):
        select_block(llama(), data, [0, 1, 2, 3], probes(), ["gla"], config)
