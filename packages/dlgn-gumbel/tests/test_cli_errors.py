"""Every bad invocation of ``dlgn-gumbel`` is refused with one line, exit code 2, before any work,
and every output (checkpoint, compiled network, reproduce results) appears whole or not at all."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from dlgn_gumbel.__main__ import main
from dlgn_gumbel.train import TrainConfig, train
from kernels_common.testing import assert_refused

PROG = "dlgn-gumbel"
TINY = ["--layers", "100x2", "--steps", "4", "--eval-every", "2", "--batch-size", "32",
        "--tau", "2", "--backend", "reference", "--connections", "random"]  # fmt: skip


def _refused(capsys, argv, *expect: str, progress: bool = False) -> str:
    """``main(argv)`` refuses in one ``dlgn-gumbel...: error:`` line holding every ``expect``.
    ``progress``: a run that failed while training may also have drawn its progress bar (lines
    of its own, ended before the error)."""
    bar = (lambda line: line.startswith(("gumbel:", "softmax:"))) if progress else None
    return assert_refused(main, argv, capsys, PROG, *expect, other_lines=bar)


def _nothing_in(folder: Path, *allowed: str) -> None:
    """No file or folder (hidden temporaries included) other than ``allowed`` in ``folder``."""
    assert sorted(p.name for p in folder.iterdir()) == sorted(allowed)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A real 4-step checkpoint of a tiny digits network."""
    from dlgn_gumbel.data import load_images

    data = load_images("digits")
    out = tmp_path_factory.mktemp("ck") / "run"
    config = TrainConfig(layer_sizes=(100, 100), tau=2.0, steps=4, eval_every=2, batch_size=32,
                         connections="random")  # fmt: skip
    train(config, data.x_train, data.y_train, data.x_test[:50], data.y_test[:50],
          num_classes=10, out_dir=out, backend="reference", progress=False)  # fmt: skip
    return out


def _copy(checkpoint: Path, target: Path) -> Path:
    target.mkdir()
    for name in ("checkpoint.json", "checkpoint.safetensors"):
        (target / name).write_bytes((checkpoint / name).read_bytes())
    return target


# --- train: numeric and path options, refused at the parser ---------------------------------


@pytest.mark.parametrize(
    ("option", "value", "why"),
    [
        ("--steps", "-5", "a negative step count"),
        ("--steps", "0", "zero steps train nothing"),
        ("--lr", "nan", "a learning rate that is not a number"),
        ("--lr", "-0.1", "a negative learning rate"),
        ("--tau", "0", "GroupSum divides by tau"),
        ("--gumbel-tau", "inf", "an infinite temperature"),
        ("--grad-factor", "-1", "a negative gradient factor"),
        ("--batch-size", "0", "an empty mini-batch"),
        ("--eval-every", "abc", "not a number"),
        ("--thresholds", "0", "no thermometer threshold, no input bits"),
        ("--time-budget", "-3", "a negative time budget"),
        ("--train-subset", "0", "an empty training set"),
        ("--test-subset", "-1", "a negative test-set size"),
        ("--seed", "-1", "a negative seed"),
        ("--seed", str(2**70), "a seed beyond torch's generator range"),
        ("--threads", "-2", "a negative thread count"),
        ("--layers", "0x3", "layers of width 0"),
        ("--layers", "100x0", "a network without layers"),
        ("--layers", "wide", "not a layer spec"),
        ("--backend", "cuda", "not a backend name"),
        ("--backend", "triton", "the Triton kernel needs CUDA tensors and training runs on CPU"),
        ("--dataset", "cifar", "an unknown dataset"),
    ],
)
def test_train_refuses_a_bad_option(tmp_path, capsys, monkeypatch, option, value, why):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the test sessions set it
    out = tmp_path / "out"
    argv = ["train", "--dataset", "digits", "--out", str(out), *TINY, option, value]
    _refused(capsys, argv, option, value)
    _nothing_in(tmp_path)


def test_train_refuses_an_out_that_is_a_file(tmp_path, capsys):
    # --out must be a folder; a file of that name cannot become one
    (tmp_path / "taken").write_text("x")
    _refused(capsys, ["train", "--dataset", "digits", "--out", str(tmp_path / "taken"), *TINY],
             "taken", "not a folder")  # fmt: skip


def test_train_refuses_an_architecture_before_loading_data(tmp_path, capsys, monkeypatch):
    # the last width (105) does not split into 10 classes; known without reading any image
    import dlgn_gumbel.data

    monkeypatch.setattr(dlgn_gumbel.data, "load_images", _no_data)
    argv = ["train", "--dataset", "digits", "--out", str(tmp_path / "o"), *TINY]
    _refused(capsys, [*argv, "--layers", "105x2"], "105", "divisible")
    # "unique" connections need each layer half as wide as its 64 x 3 = 192 input bits
    _refused(capsys, [*argv, "--layers", "20x2", "--connections", "unique"], "192", "unique")
    _refused(capsys, [*argv, "--layers", "20x2", "--connections", "difflogic"], "192", "difflogic")
    # options that would be recorded but have no effect are refused, not ignored
    _refused(capsys, [*argv, "--init-sigma", "3"], "--init-sigma 3", "--init residual")
    _refused(capsys, [*argv, "--relaxation", "softmax", "--noise", "per_example"],
             "--noise per_example", "softmax")  # fmt: skip
    _refused(capsys, [*argv, "--init", "dirichlet"], "--init", "dirichlet")
    _refused(capsys, [*argv, "--groups", "5"], "--groups 5", "10 classes")
    _refused(capsys, [*argv, "--groups", "30"], "divisible by num_classes=30")
    _nothing_in(tmp_path)


def test_train_refuses_a_bad_backend_from_the_environment(tmp_path, capsys, monkeypatch):
    # no --backend: $KERNELS_COMMON_BACKEND is used, and "bogus" names no backend
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "bogus")
    monkeypatch.setattr("dlgn_gumbel.data.load_images", _no_data)
    argv = ["train", "--dataset", "digits", "--out", str(tmp_path / "o"), "--layers", "100x2"]
    _refused(capsys, argv, "bogus")
    _nothing_in(tmp_path)


def _no_data(name):
    raise AssertionError("the data was loaded before the invocation was checked")


# --- train --resume: the checkpoint is checked before any data is loaded -----------------------


def test_resume_refuses_a_missing_checkpoint(tmp_path, capsys, monkeypatch):
    # --resume, but --out holds no checkpoint
    monkeypatch.setattr("dlgn_gumbel.data.load_images", _no_data)
    out = tmp_path / "none"
    _refused(capsys, ["train", "--dataset", "digits", "--out", str(out), *TINY, "--resume"],
             "--resume", "none")  # fmt: skip
    _nothing_in(tmp_path)


def test_resume_refuses_a_truncated_checkpoint(tmp_path, capsys, checkpoint, monkeypatch):
    # the tensors of the latest checkpoint were cut short (a full disk, a killed copy)
    monkeypatch.setattr("dlgn_gumbel.data.load_images", _no_data)
    out = _copy(checkpoint, tmp_path / "run")
    data = (out / "checkpoint.safetensors").read_bytes()
    (out / "checkpoint.safetensors").write_bytes(data[: len(data) // 2])
    line = _refused(capsys, ["train", "--dataset", "digits", "--out", str(out), *TINY,
                             "--steps", "8", "--resume"], "checkpoint.safetensors")  # fmt: skip
    assert "truncated" in line


def test_resume_refuses_a_changed_config(tmp_path, capsys, checkpoint, monkeypatch):
    # the checkpoint was trained with lr 0.01; resuming with another lr is a different run
    monkeypatch.setattr("dlgn_gumbel.data.load_images", _no_data)
    out = _copy(checkpoint, tmp_path / "run")
    _refused(capsys, ["train", "--dataset", "digits", "--out", str(out), *TINY, "--steps", "8",
                      "--lr", "0.1", "--resume"], "lr=0.01", "0.1")  # fmt: skip


# --- compile: the checkpoint folder and its two files ----------------------------------------


def test_compile_refuses_a_missing_folder(tmp_path, capsys):
    # the checkpoint folder does not exist
    _refused(capsys, ["compile", "--checkpoint", str(tmp_path / "nope"), "--out",
                      str(tmp_path / "c")], "nope")  # fmt: skip
    _nothing_in(tmp_path)


def test_compile_refuses_an_empty_folder(tmp_path, capsys):
    # a folder, but not one written by `train`
    (tmp_path / "empty").mkdir()
    _refused(capsys, ["compile", "--checkpoint", str(tmp_path / "empty"), "--out",
                      str(tmp_path / "c")], "checkpoint.json", "not found")  # fmt: skip
    _nothing_in(tmp_path, "empty")


@pytest.mark.parametrize(
    ("name", "damage", "expect", "why"),
    [
        ("checkpoint.safetensors", lambda b: b[: len(b) // 2], "truncated", "cut in half"),
        ("checkpoint.safetensors", lambda b: b"garbage bytes", "not safetensors", "not the format"),
        ("checkpoint.safetensors", lambda b: b"", "safetensors", "an empty file"),
        ("checkpoint.json", lambda b: b[: len(b) // 2], "truncated", "cut in half"),
        ("checkpoint.json", lambda b: b"\xff\xfe", "not UTF-8", "binary, not JSON"),
        ("checkpoint.json", lambda b: b"[1, 2]", "not a JSON object", "JSON, but not the state"),
        ("checkpoint.json", lambda b: b'{"steps": 4}', "'config'", "the state lacks its config"),
    ],
)
def test_compile_refuses_a_damaged_checkpoint(tmp_path, capsys, checkpoint, name, damage, expect,
                                               why):  # fmt: skip
    ck = _copy(checkpoint, tmp_path / "ck")
    (ck / name).write_bytes(damage((ck / name).read_bytes()))
    _refused(capsys, ["compile", "--checkpoint", str(ck), "--out", str(tmp_path / "c")],
             str(ck / name), expect)  # fmt: skip
    _nothing_in(tmp_path, "ck")


def test_compile_refuses_halves_of_different_steps(tmp_path, capsys, checkpoint):
    # the JSON state of a later step next to the tensors of step 4: a run killed while saving
    ck = _copy(checkpoint, tmp_path / "ck")
    meta = json.loads((ck / "checkpoint.json").read_text())
    (ck / "checkpoint.json").write_text(json.dumps({**meta, "steps": 6}))
    _refused(capsys, ["compile", "--checkpoint", str(ck), "--out", str(tmp_path / "c")],
             "different steps")  # fmt: skip


def test_compile_refuses_a_dataset_of_another_shape(tmp_path, capsys, checkpoint):
    # trained on digits (64 pixels x 3 thresholds); fashion-mnist has 784 pixels per image
    _refused(capsys, ["compile", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "c"),
                      "--dataset", "fashion-mnist"], "192", "2352")  # fmt: skip
    _nothing_in(tmp_path)


def test_compile_reports_a_missing_compiler_in_one_line(tmp_path, capsys, checkpoint, monkeypatch):
    # --engine c without a C compiler: CompilerUnavailableError, before anything is written
    import dlgn_gumbel.cbuild

    def no_compiler():
        raise dlgn_gumbel.cbuild.CompilerUnavailableError("no C compiler found (test)")

    monkeypatch.setattr(dlgn_gumbel.cbuild, "load_evaluator", no_compiler)
    _refused(capsys, ["compile", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "c"),
                      "--engine", "c"], "no C compiler", "--engine numpy")  # fmt: skip
    _nothing_in(tmp_path)


def test_compile_refuses_an_out_that_is_a_file(tmp_path, capsys, checkpoint):
    # --out names an existing file, not a folder
    (tmp_path / "file").write_text("x")
    _refused(capsys, ["compile", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "file")],
             "file", "not a folder")  # fmt: skip


# --- reproduce ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("option", "value"), [("--threads", "-1"), ("--threads", "2.5")])
def test_reproduce_refuses_a_bad_option(tmp_path, capsys, option, value):
    # a negative or fractional thread count
    _refused(capsys, ["reproduce", "--out", str(tmp_path / "r"), option, value], option, value)
    _nothing_in(tmp_path)


def test_reproduce_that_fails_leaves_no_folder(tmp_path, capsys, monkeypatch):
    # a run that fails after writing some of its files leaves no results folder behind
    import dlgn_gumbel.reproduce

    def half_a_run(out, quick, settings):
        (out / "accuracy_discrete_acc.png").write_bytes(b"partial")
        raise OSError(28, "No space left on device", str(out / "results.json"))

    monkeypatch.setattr(dlgn_gumbel.reproduce, "_run", half_a_run)
    _refused(capsys, ["reproduce", "--quick", "--out", str(tmp_path / "r")], "no space left")
    _nothing_in(tmp_path)


# --- outputs appear whole or not at all ------------------------------------------------------


def test_a_failed_first_checkpoint_leaves_no_folder(tmp_path, capsys, monkeypatch):
    # the disk fills while the first checkpoint's tensors are written
    trainer = sys.modules["dlgn_gumbel.train"]  # the module (the package exports a `train` too)

    def full_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise OSError(28, "No space left on device", filename)

    monkeypatch.setattr(trainer, "save_file", full_disk)
    out = tmp_path / "run"
    line = _refused(capsys, ["train", "--dataset", "digits", "--out", str(out), *TINY],
                    "No space left", progress=True)  # fmt: skip
    assert line.endswith(str(out))  # the output folder is named, not a temporary one
    _nothing_in(tmp_path)


def test_a_failed_compiled_save_leaves_no_folder(tmp_path, capsys, checkpoint, monkeypatch):
    # the compiled network's config cannot be written after its tensors were
    import dlgn_gumbel.compiled

    real = dlgn_gumbel.compiled.save_file

    def then_fail(tensors, filename, metadata=None):
        real(tensors, filename, metadata)
        raise OSError(28, "No space left on device", filename)

    monkeypatch.setattr(dlgn_gumbel.compiled, "save_file", then_fail)
    args = ["compile", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "c")]
    _refused(capsys, [*args, "--engine", "numpy"], "No space left")
    _nothing_in(tmp_path)


def test_an_interrupted_resave_keeps_the_previous_checkpoint(tmp_path, checkpoint, monkeypatch):
    # a later checkpoint that fails mid-write leaves the earlier one whole and resumable
    from dlgn_gumbel.data import load_images
    from dlgn_gumbel.train import check_checkpoint

    out = _copy(checkpoint, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupted(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(sys.modules["dlgn_gumbel.train"], "save_file", interrupted)
    data = load_images("digits")
    config = TrainConfig(layer_sizes=(100, 100), tau=2.0, steps=6, eval_every=2, batch_size=32,
                         connections="random")  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        train(config, data.x_train, data.y_train, data.x_test[:50], data.y_test[:50],
              num_classes=10, out_dir=out, resume=True, backend="reference",
              progress=False)  # fmt: skip
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert check_checkpoint(out)["steps"] == 4
    _nothing_in(tmp_path, "run")


def test_debug_shows_the_traceback(tmp_path):
    # --debug re-raises the refusal (here: --resume without a checkpoint) instead of one line
    from kernels_common.cli import CommandError

    with pytest.raises(CommandError, match="checkpoint folder not found"):
        main(["train", "--dataset", "digits", "--out", str(tmp_path / "x"), *TINY, "--resume",
              "--debug"])  # fmt: skip
    assert not os.listdir(tmp_path)


def test_an_absurd_depth_is_refused_before_it_is_built(tmp_path, capsys):
    # 8000x10^20 would overflow (or build a tuple of 10^9 widths for 8000x10^9)
    argv = ["train", "--dataset", "digits", "--out", str(tmp_path / "out"), "--layers"]
    for depth in ("100000000000000000000", "1000000000"):
        _refused(capsys, [*argv, f"8000x{depth}"], "--layers", "at most 10000 layers")


# --- diagnose --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["--draws", "1"], "need at least 2 draws"),
        (["--noisy", "softmax"], "invalid choice"),
        (["--init-sigma", "inf"], "expected a finite number"),
        (["--layers", "10x2"], "at least half as wide"),
        (["--layers", "105x2"], "divisible by num_classes"),
        (["--init-sigma", "2"], "needs --init residual"),
    ],
)
def test_diagnose_refuses_a_bad_option(capsys, monkeypatch, argv, expect):
    monkeypatch.setattr("dlgn_gumbel.data.load_images", _no_data)
    _refused(capsys, ["diagnose", "--dataset", "digits", *argv], expect)


def test_diagnose_refuses_architecture_options_with_a_checkpoint(capsys, checkpoint, monkeypatch):
    monkeypatch.setattr("dlgn_gumbel.data.load_images", _no_data)
    _refused(capsys, ["diagnose", "--dataset", "digits", "--checkpoint", str(checkpoint),
                      "--init", "residual", "--layers", "100x2"],
             "--layers, --init", "comes from --checkpoint")  # fmt: skip
    _refused(capsys, ["diagnose", "--dataset", "fashion-mnist", "--checkpoint", str(checkpoint)],
             "trained on 192 input bits", "gives 2352")  # fmt: skip
