"""The ``postnas`` command line on a tiny random Llama with a character tokenizer: the files each
action writes, checked against brute force over their own records and a direct cross-entropy of
the original model, resumption, and the refusals of bad command lines."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from jet_nemotron.__main__ import main
from jet_nemotron.data import TokenRows
from jet_nemotron.postnas import cli as postnas_cli
from jet_nemotron.postnas import hardware
from jet_nemotron.postnas import supernet as supernet_module

VOCAB, LAYERS, SEQ_LEN = 64, 3, 12


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


class CharTokenizer:
    """One token per character (ids 2..63), EOS 1, no chat template."""

    eos_token_id = 1
    chat_template = None

    def __call__(self, text, add_special_tokens=True, return_tensors=None):
        ids = [2 + ord(c) % (VOCAB - 2) for c in text]
        return {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids}

    def decode(self, ids):
        return "".join(chr(32 + int(i) % 90) for i in ids)


def rows() -> TokenRows:
    generator = torch.Generator().manual_seed(7)
    return TokenRows(
        torch.randint(0, VOCAB, (8, SEQ_LEN), generator=generator),
        torch.randint(0, VOCAB, (4, SEQ_LEN), generator=generator),
    )


TRAIN = ["postnas", "train-supernet", "--layerwise-steps", "2", "--path-steps", "2",
         "--batch-size", "2", "--save-every", "3", "--source", "fortunes", "--seq-len",
         str(SEQ_LEN), "--num-texts", "50"]  # fmt: skip
PROBES = ["--examples", "2", "--retrieval-context", "64"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The loaders replaced by the tiny model and rows (the text settings each call asked for
    are recorded), and a super-network trained by the command line in ``folder``."""
    asked = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERNELS_COMMON_BACKEND", "reference")
        patch.setattr(postnas_cli, "_load_model", lambda folder: (llama(), CharTokenizer()))
        patch.setattr(postnas_cli, "_token_rows", lambda tok, text: asked.append(text) or rows())
        patch.setattr(postnas_cli, "_filler", lambda: ["a fortune", "another one"])
        folder = tmp_path_factory.mktemp("postnas") / "supernet"
        assert main([*TRAIN, "--out", str(folder)]) == 0
        yield folder, asked


def original_lm_loss(examples: int) -> float:
    """Mean over held-out rows of the original model's mean next-token cross-entropy."""
    validation = rows().validation[:examples]
    with torch.no_grad():
        logits = llama()(validation).logits[:, :-1]
    per_token = F.cross_entropy(logits.transpose(1, 2), validation[:, 1:], reduction="none")
    return per_token.mean(1).mean().item()


def test_constants_match_the_library():
    from jet_nemotron.data import SOURCES
    from jet_nemotron.postnas.blocks import LINEAR_BLOCKS
    from jet_nemotron.postnas.probes import TASKS
    from jet_nemotron.postnas.search import COMBINED

    assert postnas_cli.BLOCKS == LINEAR_BLOCKS
    assert postnas_cli.SOURCES == SOURCES
    assert (COMBINED, *TASKS) == postnas_cli.OBJECTIVES


def test_train_supernet_writes_its_files_and_resumes(tiny, capsys):
    folder, asked = tiny
    history = json.loads((folder / "history.json").read_text())
    assert [len(history[k]) for k in ("layerwise", "paths", "sampled")] == [2, 2, 2]
    assert (folder / "losses.png").stat().st_size > 0
    settings = {"model": None, "source": "fortunes", "seq_len": SEQ_LEN, "num_texts": 50}
    assert json.loads((folder / "run.json").read_text()) == settings
    assert asked[0] == settings
    assert torch.load(folder / "supernet.pt", weights_only=False)["step"] == 4
    # the same command again continues from the finished checkpoint: no step is added
    assert main([*TRAIN, "--out", str(folder)]) == 0
    assert json.loads((folder / "history.json").read_text()) == history
    capsys.readouterr()
    # another training config, or other text, on the same folder is refused
    assert main([*TRAIN, "--out", str(folder), "--path-steps", "3"]) == 2
    assert "written by another run" in capsys.readouterr().err
    assert main([*TRAIN, "--out", str(folder), "--seq-len", "16"]) == 2
    assert "holds a run with other settings" in capsys.readouterr().err
    assert main([*TRAIN, "--out", str(folder), "--layerwise-steps", "0", "--path-steps", "0"]) == 2
    assert "nothing to train" in capsys.readouterr().err


def test_search_placement_picks_the_best_recorded_placement(tiny, tmp_path, capsys):
    folder, asked = tiny
    out = tmp_path / "placement"
    command = ["postnas", "search-placement", "--supernet", str(folder), "--beam-width", "3",
               *PROBES, "--out", str(out)]  # fmt: skip
    assert main([*command, "--budget", "2"]) == 0
    assert asked[-1] == json.loads((folder / "run.json").read_text())  # the supernet's text
    result = json.loads((out / "placement.json").read_text())
    assert (out / "importance.png").stat().st_size > 0
    # a beam of 3 keeps every placement of 3 layers: brute force over the recorded scores
    scores = result["scores"]
    full, none = scores["0,1,2"], scores[""]
    tasks = list(full)
    assert tasks == ["lm", "retrieval", "arithmetic"]

    # a task enters the objective only if removing every attention costs it >= 1e-3 nats
    separating = [t for t in tasks if none[t]["loss"] - full[t]["loss"] >= 1e-3]
    assert result["unseparated"] == [t for t in tasks if t not in separating]
    assert separating  # the random model's probes do separate: the objective is defined

    def combined_gap(placement):
        loss = scores[",".join(map(str, placement))]
        gaps = [(loss[t]["loss"] - full[t]["loss"]) / (none[t]["loss"] - full[t]["loss"])
                for t in separating]  # fmt: skip
        return sum(gaps) / len(gaps)

    expected = min(itertools.combinations(range(LAYERS), 2), key=lambda p: (combined_gap(p), p))
    assert result["placement"] == list(expected)
    assert result["budget"] == 2
    # the all-attention path is the original model, scored on the held-out rows
    lm = result["reference"]["all"]["lm"]["loss"]
    assert lm == pytest.approx(original_lm_loss(2), rel=1e-5)  # float32 sums in another order
    printed = capsys.readouterr().out
    assert f"placement of 2 attention layers: {list(expected)}" in printed
    for task in tasks:
        assert (f"{task}: most important layers" in printed) == (task in separating)
    # refusals: a budget beyond the layers, a folder that holds no super-network
    assert main([*command, "--budget", "4"]) == 2
    assert "exceeds the model's 3 layers" in capsys.readouterr().err
    # an unfinished super-network, or a budget it never trained, is refused
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "run.json").write_text((folder / "run.json").read_text())
    payload = torch.load(folder / "supernet.pt", weights_only=True)
    torch.save({**payload, "step": 3}, unfinished / "supernet.pt")
    at = command.index(str(folder))
    assert main([*command[:at], str(unfinished), *command[at + 1 :], "--budget", "1"]) == 2
    assert "stopped at step 3 of 4" in capsys.readouterr().err
    narrow = {**payload, "config": {**payload["config"], "max_attention": 1}}
    torch.save(narrow, unfinished / "supernet.pt")
    assert main([*command[:at], str(unfinished), *command[at + 1 :], "--budget", "2"]) == 2
    assert "above the super-network's max_attention=1" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    command[command.index(str(folder))] = str(empty)
    assert main([*command, "--budget", "1"]) == 2
    assert "holds no supernet.pt" in capsys.readouterr().err


def test_select_block_ranks_the_candidates(tiny, tmp_path, capsys):
    out = tmp_path / "blocks"
    command = ["postnas", "select-block", "--blocks", "jet", "gla", "--layerwise-steps", "1",
               "--path-steps", "1", "--batch-size", "2", *PROBES, "--out", str(out)]  # fmt: skip
    assert main([*command, "--placement", "1"]) == 0
    result = json.loads((out / "blocks.json").read_text())
    assert (out / "blocks.png").stat().st_size > 0
    assert result["placement"] == [1]
    assert result["original"]["lm"]["loss"] == pytest.approx(original_lm_loss(2), rel=1e-5)
    ranked = result["results"]
    assert sorted(r["block"] for r in ranked) == ["gla", "jet"]
    for entry in ranked:  # the excess loss is the mean over tasks of loss - original loss
        excess = [entry["scores"][t]["loss"] - result["original"][t]["loss"]
                  for t in result["original"]]  # fmt: skip
        assert entry["excess_loss"] == pytest.approx(sum(excess) / len(excess), rel=1e-12)
    assert ranked[0]["excess_loss"] <= ranked[1]["excess_loss"]
    assert "1. " + ranked[0]["block"] in capsys.readouterr().out
    assert sorted(p.name for p in out.glob("*.pt")) == ["gla.pt", "jet.pt"]
    # the same command again trains nothing: each candidate resumes from its finished checkpoint
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(supernet_module, "optimizer_step", None)
        assert main([*command, "--placement", "1"]) == 0
    assert json.loads((out / "blocks.json").read_text()) == result
    assert main([*command, "--placement", "1", "5"]) == 2
    assert "--placement [5] are outside the model's layers 0..2" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # --placement is required
        main(command)
    assert refused.value.code == 2
    assert "--placement" in capsys.readouterr().err


def test_search_hw_writes_the_front_and_resumes(tiny, tmp_path, monkeypatch, capsys):
    out = tmp_path / "hardware"
    command = ["postnas", "search-hw", "--placement", "0", "--state-size", "256", "--heads", "2",
               "--key-dims", "8", "16", "--value-dims", "8", "16", "32", "--layerwise-steps", "1",
               "--batch-size", "2", "--context", "8", "--new-tokens", "2", "--examples", "2",
               "--out", str(out)]  # fmt: skip
    assert main(command) == 0
    saved = json.loads((out / "hardware.json").read_text())
    assert (out / "pareto.png").stat().st_size > 0
    assert saved["layer_types"] == ["attn", "jet", "jet"]
    shapes = sorted((r["num_heads"], r["head_dim"], r["head_v_dim"]) for r in saved["records"])
    grid = [(2, k, v) for k in (8, 16) for v in (8, 16, 32) if 2 * k * v == 256]
    assert shapes == grid
    assert "Pareto front of 2 shapes of state 256" in capsys.readouterr().out

    def unexpected(*args, **kwargs):
        raise AssertionError("a finished shape was measured again")

    # the same command again reads every shape from hardware.json
    monkeypatch.setattr(hardware, "_measure", unexpected)
    assert main(command) == 0
    assert json.loads((out / "hardware.json").read_text()) == saved
    command[command.index("--examples") + 1] = "3"  # another probe: the records do not carry over
    assert main(command) == 2
    assert "holds a run with other settings" in capsys.readouterr().err
    command[command.index("--examples") + 1] = "2"
    command[command.index("--placement") + 1] = "3"
    assert main(command) == 2
    assert "outside the model's layers" in capsys.readouterr().err
