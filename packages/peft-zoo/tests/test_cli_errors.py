"""Every bad invocation is refused with one line on stderr and exit code 2, before any model is
loaded; saved adapters appear whole or not at all; a corrupt saved adapter is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import tiny_model

import peft_zoo as pz
import peft_zoo.base
import peft_zoo.models
from kernels_common.testing import assert_refused
from peft_zoo.__main__ import main


@pytest.fixture
def work(tmp_path, monkeypatch):
    """An empty working folder with one plain file in it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("not a folder\n")
    return tmp_path


def refused(argv, capsys, root: Path) -> str:
    """``main(argv)`` refuses in one ``peft-zoo...: error:`` line and writes nothing in ``root``."""
    return assert_refused(main, argv, capsys, "peft-zoo", unchanged=root)


TRAIN = ["train", "--method", "capt", "--model", "tiny", "--task", "arithmetic"]


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        ([*TRAIN, "--steps", "-2"], "'-2'"),  # a negative step count
        ([*TRAIN, "--steps", "0"], "'0'"),  # no training at all
        ([*TRAIN, "--steps", "ten"], "'ten'"),  # not a number
        ([*TRAIN, "--batch-size", "0"], "'0'"),  # an empty batch
        ([*TRAIN, "--lr", "nan"], "'nan'"),  # a learning rate must be finite
        ([*TRAIN, "--lr", "-0.001"], "'-0.001'"),  # and positive
        ([*TRAIN, "--max-len", "0"], "'0'"),  # texts of no tokens
        ([*TRAIN, "--max-len", "8"], "context"),  # 8 tokens are all context: nothing to learn
        ([*TRAIN, "--eval-size", "0"], "'0'"),  # nothing to evaluate (exact match needs one)
        ([*TRAIN, "--max-value", "1"], "'1'"),  # subtraction needs operands up to 2 at least
        ([*TRAIN, "--seed", "-1"], "'-1'"),  # seeds are >= 0
        ([*TRAIN, "--save", "FILE/sub"], "FILE"),  # an adapter folder under a file
        ([*TRAIN, "--save", "FILE"], "FILE"),  # an adapter folder that is a file
        (["train", "--method", "qlora"], "qlora"),  # no such method
        ([*TRAIN, "--model", "gpt-5"], "gpt-5"),  # no such model
        (["reproduce", "--out", "FILE/sub"], "FILE"),  # a results folder under a file
        (["reproduce", "--out", "FILE"], "FILE"),  # a results folder that is a file
        (["bench", "--device", "tpu"], "tpu"),  # an unknown device
        (["bench", "--out", "FILE/sub"], "FILE"),  # an output folder under a file
    ],
)
def test_bad_arguments_are_refused_before_any_work(work, capsys, monkeypatch, argv, expect):
    # loading a model is the first piece of work: none of these may get there
    monkeypatch.setattr(peft_zoo.models, "load_model", lambda *a: pytest.fail("model loaded"))
    line = refused(argv, capsys, work)
    assert expect in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_bench_on_missing_cuda_is_refused(work, capsys):
    # this machine has no CUDA device to benchmark on
    assert "CUDA" in refused(["bench", "--device", "cuda"], capsys, work)


def test_missing_peft_is_refused_before_loading_the_model(work, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    # an environment without the peft library (LoRA is peft's)
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "peft" else real(n))
    monkeypatch.setattr(peft_zoo.models, "load_model", lambda *a: pytest.fail("model loaded"))
    line = refused(["train", "--method", "lora", "--task", "arithmetic"], capsys, work)
    assert "peft-zoo[bench]" in line


def test_eval_size_above_the_corpus_is_refused_before_loading_the_model(work, capsys, monkeypatch):
    benchdata = pytest.importorskip("benchdata")

    class Corpus:
        train = ["a fortune"] * 20
        validation = ["another fortune"] * 10

    monkeypatch.setattr(benchdata, "fortunes_corpus", lambda: Corpus())
    monkeypatch.setattr(peft_zoo.models, "load_model", lambda *a: pytest.fail("model loaded"))
    # 64 held-out texts asked for, 10 exist
    line = refused(["train", "--method", "capt", "--eval-size", "64"], capsys, work)
    assert "--eval-size 64" in line


def test_debug_shows_the_traceback(work, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "peft" else real(n))
    # --debug re-raises the refusal instead of printing one line
    with pytest.raises(Exception, match="needs peft"):
        main(["--debug", "train", "--method", "lora", "--task", "arithmetic"])


# --- outputs appear whole or not at all ---------------------------------------------------------

QUICK = [*TRAIN, "--steps", "2", "--batch-size", "2", "--eval-size", "2"]


def test_failed_save_leaves_no_adapter_folder(work, capsys, monkeypatch):
    def broken(tensors, path, metadata=None):
        Path(path).write_bytes(b"half")  # a partial file, then the disk fills up
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(peft_zoo.base, "save_file", broken)
    capsys.readouterr()
    assert main([*QUICK, "--save", "ad"]) == 2
    err = capsys.readouterr().err  # the training's progress bar, then the error
    assert err.strip().splitlines()[-1] == (
        "peft-zoo: error: cannot save the adapter to ad: No space left on device"
    )
    assert "Traceback" not in err
    assert not (work / "ad").exists()
    assert not [p for p in work.iterdir() if p.name.startswith(".")]  # no temporaries either
    monkeypatch.undo()
    monkeypatch.chdir(work)
    capsys.readouterr()
    assert main([*QUICK, "--save", "ad"]) == 0  # the same run without the fault
    assert json.loads(capsys.readouterr().out)["trainable"] == 64
    assert {p.name for p in (work / "ad").iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }


def test_save_pretrained_is_atomic(tmp_path, monkeypatch):
    model = pz.get_peft_model(tiny_model("llama"), pz.CaPTConfig())

    def broken(tensors, path, metadata=None):
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(peft_zoo.base, "save_file", broken)
    with pytest.raises(OSError, match="No space"):
        model.save_pretrained(tmp_path / "adapter")
    assert list(tmp_path.iterdir()) == []


# --- a corrupt saved adapter is refused, naming the file ----------------------------------------


@pytest.fixture
def saved(tmp_path):
    folder = tmp_path / "adapter"
    pz.get_peft_model(tiny_model("llama"), pz.LoPEConfig()).save_pretrained(folder)
    return folder


def _edit_config(folder: Path, change) -> None:
    path = folder / "adapter_config.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("damage", "bad_file", "expect"),
    [
        # an interrupted copy: the weights cut short
        (
            lambda f: (f / "adapter_model.safetensors").write_bytes(
                (f / "adapter_model.safetensors").read_bytes()[:64]
            ),
            "adapter_model.safetensors",
            "truncated or not safetensors",
        ),
        # the config cut short
        (
            lambda f: (f / "adapter_config.json").write_text('{"format_version": 1, "base'),
            "adapter_config.json",
            "truncated",
        ),
        # a config that is not JSON at all
        (
            lambda f: (f / "adapter_config.json").write_bytes(b"\x89PNG\r\n"),
            "adapter_config.json",
            "not",
        ),
        # a config written by a newer format
        (
            lambda f: _edit_config(f, lambda m: m.update(format_version=2)),
            "adapter_config.json",
            "format_version 2",
        ),
        # a config of a method this version does not know
        (
            lambda f: _edit_config(f, lambda m: m["config"].update(method="dora")),
            "adapter_config.json",
            "dora",
        ),
        # a config of another rank than the saved tensors
        (
            lambda f: _edit_config(f, lambda m: m["config"].update(r=8)),
            "adapter_model.safetensors",
            "shape",
        ),
        # a saved training stage that does not exist
        (
            lambda f: _edit_config(f, lambda m: m.update(state={"stage": 7})),
            "adapter_config.json",
            "stage",
        ),
        # a config without its fields
        (
            lambda f: (f / "adapter_config.json").write_text('{"format_version": 1}'),
            "adapter_config.json",
            "not an adapter config",
        ),
    ],
)
def test_corrupt_adapter_is_refused_naming_the_file(saved, damage, bad_file, expect):
    damage(saved)
    with pytest.raises(ValueError, match=expect) as info:
        pz.from_pretrained(tiny_model("llama"), saved)
    assert str(saved / bad_file) in str(info.value)


def test_missing_adapter_file_is_named(saved):
    # a folder whose weights were never written
    (saved / "adapter_model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"adapter_model\.safetensors"):
        pz.from_pretrained(tiny_model("llama"), saved)
