"""Package-level checks: README example, lean import, selections on disk, the evaluation's
noise metrics, the CLI end to end on a tiny model and its refusals."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch
from helpers import byte_tokenizer, tiny_llama, tiny_task

import qcs
from kernels_common.testing import assert_refused, import_footprint, run_markdown_python
from qcs import (
    InstructionPair,
    LoraSettings,
    QCSConfig,
    Selection,
    TrainConfig,
    Workbench,
    noise_metrics,
    tokenize_pairs,
)
from qcs.__main__ import main

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs():
    run_markdown_python(README)


def test_import_is_lean():
    footprint = import_footprint(
        "import torch, qcs", watch=["triton", "benchdata", "peft", "transformers", "matplotlib"]
    )
    assert not any(footprint.values()), footprint


def test_version():
    assert qcs.__version__ == importlib.metadata.version("qcs")


def test_selection_round_trip_and_damaged_files(tmp_path):
    selection = Selection(
        "qcs",
        [3, 1],
        torch.tensor([0.1, 0.9, 0.2, 0.8]),
        0.5,
        token_weights={1: torch.tensor([0.9, 0.1]), 3: torch.tensor([0.1])},
        trace=[{"step": 0, "mean_val_loss": 1.5}],
        settings={"seed": 2},
    )
    path = selection.save(tmp_path / "sel.json")
    loaded = Selection.load(path)
    assert loaded.indices.tolist() == [1, 3]
    assert loaded.method == "qcs"
    assert torch.equal(loaded.scores, selection.scores)
    assert {i: w.tolist() for i, w in loaded.token_weights.items()} == {
        1: pytest.approx([0.9, 0.1]), 3: pytest.approx([0.1])}  # fmt: skip
    weights = loaded.weights_for([2, 2, 3, 1])
    assert weights[0].tolist() == [1.0, 1.0]
    assert weights[3].tolist() == pytest.approx([0.1])
    with pytest.raises(ValueError, match="different tokenization"):
        loaded.weights_for([2, 5, 3, 1])
    with pytest.raises(FileNotFoundError):
        Selection.load(tmp_path / "none.json")
    (tmp_path / "cut.json").write_text(path.read_text()[:40])
    with pytest.raises(ValueError, match=r"cut\.json"):
        Selection.load(tmp_path / "cut.json")
    (tmp_path / "old.json").write_text(json.dumps({"format_version": 0}))
    with pytest.raises(ValueError, match="format_version"):
        Selection.load(tmp_path / "old.json")
    with pytest.raises(ValueError, match="lie in"):
        Selection("random", [7], torch.zeros(4), 0.25)


def test_noise_metrics_by_hand():
    tokenizer = byte_tokenizer()
    pairs = [InstructionPair(f"Q{i}", "abcd") for i in range(4)]
    pool = tokenize_pairs(pairs, tokenizer)
    pool.noisy_sequence = torch.tensor([True, False, False, True])
    pool.noisy_tokens[1] = torch.zeros(len(pool.response_ids[1]), dtype=torch.bool)
    pool.noisy_tokens[1][:2] = True  # two garbage tokens in sequence 1
    length = len(pool.response_ids[1])
    w = torch.full((length,), 0.9)
    w[1:3] = 0.1  # one garbage token and one clean token down-weighted
    selection = Selection("qcs", [1, 3], torch.zeros(4), 0.5,
                          token_weights={1: w, 3: torch.full((length,), 0.9)})  # fmt: skip
    got = noise_metrics(pool, selection)
    assert got["exclusion_precision"] == 0.5  # excluded {0, 2}: 0 is noisy
    assert got["exclusion_recall"] == 0.5  # noisy {0, 3}: 0 is excluded
    assert got["selected_clean"] == 0.5
    assert got["pool_clean"] == 0.5
    assert got["downweight_precision"] == 0.5
    assert got["downweight_recall"] == 0.5
    plain = noise_metrics(pool, Selection("random", [1], torch.zeros(4), 0.25))
    assert plain["downweight_recall"] == 0.0
    assert plain["downweight_precision"] is None


def test_workbench_runs_every_method_and_restores_the_adapters():
    tokenizer, pool, validation = tiny_task()
    bench = Workbench(tiny_llama(len(tokenizer)), pool, validation, LoraSettings(layers=1))
    before = bench.validation.mean_loss()
    config = QCSConfig(outer_steps=2, samples=2, inner=TrainConfig(steps=1, batch_size=4))
    for method in qcs.METHODS:
        selection = bench.select(
            method, 0.5, config=config, less=qcs.LessConfig(warmup_fraction=0.5, projection_dim=32)
        )
        assert len(selection) == (8 if method == "full" else 4)
        assert bench.validation.mean_loss() == before  # adapters back at their start
        if method == "qcs":
            lengths = pool.response_lengths
            for i, w in selection.token_weights.items():
                high = int((w > 0.5).sum())
                assert high == max(1, round(0.5 * int(lengths[i])))
                assert all(min(abs(v - 0.1), abs(v - 0.9)) < 1e-6 for v in w.tolist())
    again = Workbench(tiny_llama(len(tokenizer)), pool, validation, LoraSettings(layers=1))
    first = bench.select("qcs", 0.5, config=config)
    assert torch.equal(first.scores, again.select("qcs", 0.5, config=config).scores)
    with pytest.raises(ValueError, match="unknown method"):
        bench.select("oracle", 0.5)


def _tiny_model_folder(tmp_path: Path) -> tuple[Path, Path]:
    tokenizer = byte_tokenizer()
    folder = tmp_path / "model"
    tiny_llama(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Tell me fact {i}.",
                                        "output": f"Fact {i}: cats sleep a lot."}) + "\n"
                            for i in range(12)))  # fmt: skip
    return folder, data


TINY = ["--pool", "8", "--pool-target", "2", "--validation", "2", "--heldout", "2",
        "--target-test", "2", "--max-length", "160", "--max-prompt-tokens", "140",
        "--lora-layers", "1", "--outer-steps", "2", "--samples", "2", "--epochs", "1"]  # fmt: skip


def test_cli_select_then_finetune(tmp_path, capsys):
    folder, data = _tiny_model_folder(tmp_path)
    common = ["--model", str(folder), "--data", str(data), *TINY]
    assert main(["select", "--method", "qcs", "--budget", "0.5",
                 "--out", str(tmp_path / "sel.json"), *common]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["size"] == 5
    selection = Selection.load(tmp_path / "sel.json")
    assert selection.settings["task"]["pool_general"] == 8
    assert selection.token_weights
    assert main(["finetune", "--selection", str(tmp_path / "sel.json"),
                 "--out", str(tmp_path / "adapter"), *common]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == 1
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["select", "--budget", "1.5", "--out", "s.json"], "1.5"),
        (["select", "--budget", "0", "--out", "s.json"], "'0'"),
        (["select", "--epsilon", "0.5", "--out", "s.json"], "0.5"),
        (["select", "--method", "oracle", "--out", "s.json"], "oracle"),
        (["compare", "--budgets", "0.05,2"], "2"),
        (["finetune", "--selection", "missing.json", "--out", "a"], "missing.json"),
    ],
)
def test_cli_refuses_bad_input(argv, expect, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_refused(main, argv, capsys, "qcs", expect)


class _Scripted:
    """A stand-in LM whose greedy generation is a fixed text per prompt (left-padded batch)."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies = tokenizer, replies

    def generate(self, input_ids, attention_mask, max_new_tokens, do_sample, pad_token_id):
        assert not do_sample
        assert (attention_mask[:, -1] == 1).all()  # left padding
        rows = []
        for reply in self.replies[: len(input_ids)]:
            ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"][:max_new_tokens]
            rows.append(torch.tensor(ids + [pad_token_id] * (max_new_tokens - len(ids))))
        self.replies = self.replies[len(input_ids) :]
        return torch.cat([input_ids, torch.stack(rows)], dim=1)


def test_exact_match_reads_the_generated_answer():
    tokenizer = byte_tokenizer()
    target = tokenize_pairs(qcs.arithmetic_pairs(3, seed=0), tokenizer, max_length=200)
    gold = target.answers
    replies = [f"so the answer is {gold[0]}.", "The answer is 99999.", f"answer is: {gold[2]}"]
    model = _Scripted(tokenizer, replies)
    assert qcs.exact_match(model, tokenizer, target, batch_size=2) == pytest.approx(2 / 3)
