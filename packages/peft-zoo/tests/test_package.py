"""Package-level checks: README example, lean import, CLI, the trainer on the tiny model."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import math
import re
from pathlib import Path

import pytest
import torch

import peft_zoo as pz
from kernels_common.testing import import_footprint, run_markdown_python
from peft_zoo.data import ByteTokenizer, arithmetic_problems, corrupt, lm_batch, qa_batch
from peft_zoo.models import tiny_llama
from peft_zoo.trainer import TrainSettings, build_learner, exact_match, perplexity, train

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs():
    run_markdown_python(README)


def test_import_is_lean():
    footprint = import_footprint("import torch, peft_zoo", watch=["triton", "peft", "benchdata"])
    assert not footprint["triton"]
    assert not footprint["peft"]
    assert not footprint["benchdata"]
    assert not footprint["cuda"]


def test_cli_train_tiny(capsys, tmp_path):
    from peft_zoo.__main__ import main

    command = ["train", "--method", "capt", "--model", "tiny", "--task", "arithmetic"]
    options = ["--steps", "2", "--eval-size", "2", "--batch-size", "2", "--save", str(tmp_path)]
    code = main(command + options)
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["trainable"] == 64  # one task vector of the width-64 tiny model
    assert len(report["losses"]) == 2
    assert 0.0 <= report["em_after"] <= 1.0
    assert (tmp_path / "adapter_model.safetensors").is_file()
    with pytest.raises(SystemExit) as exit_info:
        main(["reproduce", "--help"])
    assert exit_info.value.code == 0
    assert pz.__version__ == importlib.metadata.version("peft-zoo")


def test_batches_mask_context_and_padding():
    tok = ByteTokenizer()
    batch = qa_batch(tok, [("Q: 1+1?", " 2"), ("Q: 10+1?", " 11")])
    for row, (question, answer) in enumerate([("Q: 1+1?", " 2"), ("Q: 10+1?", " 11")]):
        n_q, n_a = len(question), len(answer) + 1  # + end of sequence
        assert batch.context_mask[row].sum() == n_q
        assert batch.attention_mask[row].sum() == n_q + n_a
        labels = batch.labels[row][batch.labels[row] != -100].tolist()
        assert labels == [*answer.encode(), tok.eos_token_id]
    lm = lm_batch(tok, ["abcdefgh", "abc"], max_len=6, context_len=2)
    assert lm.input_ids.shape == (2, 6)
    assert (lm.labels[0] != -100).sum() == 4


def test_generated_tasks_are_seeded_and_correct():
    problems = arithmetic_problems(50, seed=3)
    assert problems == arithmetic_problems(50, seed=3)
    for question, answer in problems:
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        expected = numbers[0] + numbers[1] if "more" in question else numbers[0] - numbers[1]
        assert int(answer) == expected
    texts = [f"text number {i} with some words" for i in range(40)]
    noisy = corrupt(texts, 0.2, 0.3, seed=0)
    assert sum(a != b for a, b in zip(texts, noisy, strict=True)) == 8


def test_trainer_counts_and_lope_two_stages():
    model, tok = tiny_llama()
    settings = TrainSettings(
        steps=4, batch_size=2, num_virtual_tokens=4, ptmoe_rank=3, lope_stage1_fraction=0.5
    )
    h, _layers = 64, 2
    learner = build_learner("ptmoe", copy.deepcopy(model), tok, settings)
    assert learner.trainable == 2 * 4 * 3 + 3 * h + 2 * h + 2
    lope = build_learner("lope", copy.deepcopy(model), tok, settings)
    layer = lope.model.lope_layers()[0]
    texts = ["some text to learn from"] * 8
    make = lambda t: lm_batch(tok, t, 16, 2)  # noqa: E731
    snapshots = []
    original_step = lope.optimizer.step

    def recording_step(*args, **kwargs):
        out = original_step(*args, **kwargs)
        snapshots.append((layer.lope_B_D.detach().clone(), layer.lope_B.detach().clone()))
        return out

    lope.optimizer.step = recording_step
    train(lope, texts, make, settings, progress=False)
    b_d = [s[0] for s in snapshots]
    b = [s[1] for s in snapshots]
    assert not torch.equal(b_d[0], torch.zeros_like(b_d[0]))  # stage I trains B_D...
    assert torch.equal(b[1], torch.zeros_like(b[1]))  # ...not the normal experts
    assert torch.equal(b_d[1], b_d[3])  # stage II: B_D frozen
    assert not torch.equal(b[3], b[1])  # and the experts learn
    assert perplexity(lope, [make(texts[:2])]) > 1.0


def test_unknown_method_and_model():
    model, tok = tiny_llama()
    with pytest.raises(ValueError, match="unknown method 'dora'"):
        build_learner("dora", model, tok, TrainSettings())
    from peft_zoo.models import load_model

    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        load_model("gpt5")


def _greedy_verdict(learner, tok, question: str, answer: str) -> bool:
    """Oracle for ``exact_match``: token-by-token ``generate`` (greedy, no cache shortcuts)."""
    q = tok(question)["input_ids"]
    a = tok(answer)["input_ids"]
    ids = torch.tensor([q])
    out = learner.model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=len(a) + 1,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
    )[0, len(q) :].tolist()
    return out[: len(a)] == a and not tok.decode(out[len(a) :])[:1].isdigit()


@pytest.mark.parametrize("method", ["full", "capt"])
def test_exact_match_equals_greedy_generate(method):
    model, tok = tiny_llama()
    learner = build_learner(method, model, tok, TrainSettings(steps=1))
    learner.model.eval()
    problems = []
    for i, (question, answer) in enumerate(arithmetic_problems(12, seed=1, max_value=9)):
        if i % 2:  # answers that greedy decoding does produce (its first 1-3 tokens)
            ids = torch.tensor([tok(question)["input_ids"]])
            out = learner.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=1 + i % 3,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
            answer = tok.decode(out[0, ids.shape[1] :].tolist()) or " 1"
        problems.append((question, answer))
    verdicts = [_greedy_verdict(learner, tok, q, a) for q, a in problems]
    assert any(verdicts)
    assert not all(verdicts)
    for problem, verdict in zip(problems, verdicts, strict=True):
        assert exact_match(learner, tok, [problem]) == float(verdict)
    # batched (right-padded, different lengths) gives the same count
    assert exact_match(learner, tok, problems, batch_size=5) == sum(verdicts) / len(problems)


def test_exact_match_rejects_empty():
    model, tok = tiny_llama()
    with pytest.raises(ValueError, match="at least one problem"):
        exact_match(build_learner("full", model, tok, TrainSettings()), tok, [])


def test_prompt_tuning_baseline_has_ptmoe_text_init():
    pytest.importorskip("peft")
    model, tok = tiny_llama()
    settings = TrainSettings(num_virtual_tokens=7, init_text="abc")
    learner = build_learner("prompt-tuning", model, tok, settings)
    prompt = learner.model.prompt_encoder["default"].embedding.weight
    ids = torch.tensor([97, 98, 99, 97, 98, 99, 97])  # bytes of "abc" repeated to T = 7
    assert torch.equal(prompt, model.get_input_embeddings().weight[ids])


def test_beats_claim_is_strict_and_flags_degenerate_measurements():
    from peft_zoo.reproduce import beats_claim

    def claim(ours, theirs, higher=True):
        return beats_claim("c", "p", ours, theirs, "u", higher, floor=0.0, ceiling=100.0)

    assert claim(12.5, 10.0).passed
    assert claim(12.5, 10.0).measured == 2.5
    assert not claim(10.0, 12.5).passed
    for ours, theirs in ((0.0, 0.0), (100.0, 100.0), (40.0, 40.0)):  # tie: not measured
        result = claim(ours, theirs)
        assert math.isnan(result.measured)
        assert not result.passed
    assert claim(80.0, 81.0, higher=False).passed  # lower is better (perplexity)
    assert not claim(81.0, 81.0, higher=False).passed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": {"full": 1e-4}}, "missing"),
        ({"lr": {**TrainSettings().lr, "lora": 0.0}}, "positive"),
        ({"nanoadam_density": 0.0}, "nanoadam_density"),
        ({"steps": 0}, "steps"),
    ],
)
def test_train_settings_reject_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainSettings(**kwargs)


def test_arithmetic_problems_respect_max_value():
    for question, answer in arithmetic_problems(200, seed=0, max_value=9):
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        assert all(1 <= n <= 9 for n in numbers)
        a, b = numbers
        assert int(answer) == (a + b if "more" in question else a - b)
    with pytest.raises(ValueError, match="max_value"):
        arithmetic_problems(3, seed=0, max_value=1)
