"""Every bad invocation is refused with one line on stderr and exit code 2, before any work, and
a failed run leaves no partial output behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import lpc_cache
from kernels_common.testing import assert_refused
from lpc_cache import __main__ as cli_main
from lpc_cache.__main__ import main


@pytest.fixture
def work(tmp_path, monkeypatch, write_trace):
    """An empty working folder holding a valid trace, a valid predictor and a plain file."""
    monkeypatch.chdir(tmp_path)
    write_trace(tmp_path / "t.jsonl")
    config = lpc_cache.PredictorConfig(embedding_dim=4, history=0)
    lpc_cache.ContinuationPredictor(config).save(tmp_path / "pred")
    (tmp_path / "FILE").write_text("not a folder\n")
    return tmp_path


def refused(argv, capsys, root: Path) -> str:
    """``main(argv)`` refuses in one ``lpc-cache...: error:`` line, writing nothing in ``root``."""
    return assert_refused(main, argv, capsys, "lpc-cache", unchanged=root)


SIM = ["simulate", "--trace", "t.jsonl", "--policy", "lru", "--capacity-tokens", "1000"]
SWEEP = ["sweep", "--trace", "t.jsonl", "--capacities", "500,2000", "--out", "sw"]
TRAIN = ["train-predictor", "--trace", "t.jsonl", "--out", "p2"]
BUILD = ["trace", "build", "--out", "x.jsonl", "--conversations", "3"]


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        ([*SIM, "--block-size", "0"], "'0'"),  # a block of 0 tokens (was ZeroDivisionError)
        ([*SIM, "--block-size", "-16"], "'-16'"),  # a negative block size
        ([*SIM, "--block-size", "1.5"], "'1.5'"),  # blocks hold whole tokens
        ([*SIM[:-1], "-1"], "'-1'"),  # a negative capacity
        ([*SIM[:-1], "lots"], "'lots'"),  # not a number
        ([*SIM, "--scale", "nan"], "'nan'"),  # a decay rate must be finite
        ([*SIM, "--scale", "-1"], "'-1'"),  # a negative decay makes old blocks more valuable
        (
            ["simulate", "--trace", "t.jsonl", "--policy", "mru", "--capacity-tokens", "9"],
            "mru",
        ),  # no such policy
        (
            ["simulate", "--trace", "t.jsonl", "--policy", "lru+new", "--capacity-tokens", "9"],
            "lru+new",
        ),  # no such rule
        ([*TRAIN, "--encoder", "bert"], "'bert'"),  # no such encoder
        (
            ["simulate", "--trace", "no.jsonl", "--policy", "lru", "--capacity-tokens", "9"],
            "no.jsonl",
        ),  # a missing trace
        (
            ["simulate", "--trace", "pred", "--policy", "lru", "--capacity-tokens", "9"],
            "pred",
        ),  # a folder is not a trace
        ([*SIM, "--predictor", "nowhere"], "nowhere"),  # a missing predictor folder
        ([*SIM, "--predictor", "t.jsonl"], "t.jsonl"),  # a file is not a predictor folder
        ([*SWEEP[:-1], "FILE/sub"], "FILE"),  # an output folder under a file
        ([*SWEEP[:-1], "FILE"], "FILE"),  # an output folder that is a file
        (
            ["sweep", "--trace", "t.jsonl", "--capacities", "500,x", "--out", "sw"],
            "x",
        ),  # not a number
        (
            ["sweep", "--trace", "t.jsonl", "--capacities", "0,500", "--out", "sw"],
            "'0'",
        ),  # no cache at all
        (["sweep", "--trace", "t.jsonl", "--capacities", "", "--out", "sw"], "''"),  # no capacities
        ([*SWEEP, "--policies", "lru,zzz"], "zzz"),  # an unknown policy in the list
        ([*SWEEP, "--policies", "lru,,fifo"], "lru,,fifo"),  # an empty list entry
        (
            ["train-predictor", "--trace", "missing.jsonl", "--out", "p2"],
            "missing.jsonl",
        ),  # no trace
        ([*TRAIN[:-1], "FILE/sub"], "FILE"),  # a predictor folder under a file
        ([*TRAIN, "--validation-fraction", "1"], "'1'"),  # leaves no training set
        ([*TRAIN, "--validation-fraction", "0"], "'0'"),  # leaves no validation set
        ([*TRAIN, "--validation-fraction", "inf"], "'inf'"),  # not finite
        ([*TRAIN, "--seed", "-1"], "'-1'"),  # numpy seeds are >= 0
        (["trace", "build", "--out", "x.jsonl", "--conversations", "-3"], "'-3'"),  # negative
        (["trace", "build", "--out", "x.jsonl", "--conversations", "0"], "'0'"),  # an empty trace
        ([*BUILD, "--offset", "-1"], "'-1'"),  # a negative first index
        ([*BUILD, "--arrival-rate", "0"], "'0'"),  # no conversations ever arrive
        ([*BUILD, "--mean-gap", "-5"], "'-5'"),  # a negative gap between turns
        ([*BUILD, "--max-concurrent", "0"], "'0'"),  # no conversation could run
        ([*BUILD, "--max-prompt-tokens", "0"], "'0'"),  # every prompt would be cut
        ([*BUILD, "--seed", "-2"], "'-2'"),  # numpy seeds are >= 0
        (["trace", "build", "--out", "FILE/x.jsonl"], "FILE"),  # a trace file under a file
        (["trace", "build", "--out", "pred"], "pred"),  # a folder is not a file name
        (["bench", "--conversations", "0"], "'0'"),  # nothing to benchmark
        (["bench", "--out", "FILE/sub"], "FILE"),  # an output folder under a file
        (["reproduce", "--out", "FILE"], "FILE"),  # a results folder that is a file
    ],
)
def test_bad_arguments_are_refused_at_the_parser(work, capsys, monkeypatch, argv, expect):
    # none of these may reach the work: loading a trace or building one fails the test
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(lpc_cache.trace, "load_trace", no_work)
    monkeypatch.setattr(lpc_cache.trace, "sharegpt_trace", no_work)
    line = refused(argv, capsys, work)
    assert expect in line


def test_lpc_without_a_predictor_is_refused_before_loading_the_trace(work, capsys, monkeypatch):
    # the lpc policy needs the predictor's probabilities
    monkeypatch.setattr(lpc_cache.trace, "load_trace", lambda *a: pytest.fail("trace loaded"))
    for policy in ("lpc", "lpc+untouched"):
        line = refused(
            ["simulate", "--trace", "t.jsonl", "--policy", policy, "--capacity-tokens", "9"],
            capsys,
            work,
        )
        assert "--predictor" in line


def _broken_predictor(root: Path, name: str, config: str | None, weights: bytes | None) -> str:
    folder = root / name
    folder.mkdir()
    good = root / "pred"
    (folder / "config.json").write_text(
        config if config is not None else (good / "config.json").read_text()
    )
    (folder / "model.safetensors").write_bytes(
        weights if weights is not None else (good / "model.safetensors").read_bytes()
    )
    return name


@pytest.mark.parametrize(
    ("config", "weights", "bad_file", "expect"),
    [
        # weights cut short (an interrupted copy)
        (None, "truncate", "model.safetensors", "truncated or not safetensors"),
        # weights that are not safetensors at all
        (None, b"\x00" * 64, "model.safetensors", "not safetensors"),
        # a config.json cut short
        ('{"embedding_dim": 4, "hist', None, "config.json", "truncated"),
        # a config.json that is JSON but not a config
        ("[1, 2, 3]", None, "config.json", "JSON object"),
        # a config.json with a field PredictorConfig does not have
        ('{"embedding_dim": 4, "colour": "red"}', None, "config.json", "colour"),
        # a config.json with an impossible value
        ('{"embedding_dim": 0}', None, "config.json", "embedding_dim"),
        # weights of another architecture (embedding_dim 8 in the config, 4 in the weights)
        ('{"embedding_dim": 8, "history": 0}', None, "model.safetensors", "does not match"),
    ],
)
def test_corrupt_predictor_is_refused_naming_the_file(
    work, capsys, monkeypatch, config, weights, bad_file, expect
):
    if weights == "truncate":
        weights = (work / "pred" / "model.safetensors").read_bytes()[:100]
    folder = _broken_predictor(work, "bad", config, weights)
    # the predictor is checked before the trace is read or anything is embedded
    monkeypatch.setattr(lpc_cache.trace, "load_trace", lambda *a: pytest.fail("trace loaded"))
    for argv in (
        ["simulate", "--trace", "t.jsonl", "--policy", "lpc", "--capacity-tokens", "9"],
        ["sweep", "--trace", "t.jsonl", "--capacities", "9", "--out", "sw", "--policies", "lpc"],
    ):
        line = refused([*argv, "--predictor", folder], capsys, work)
        assert f"bad/{bad_file}" in line
        assert expect in line


def test_missing_predictor_file_is_named(work, capsys):
    # a predictor folder without its weights
    (work / "half").mkdir()
    (work / "half" / "config.json").write_text((work / "pred" / "config.json").read_text())
    argv = ["simulate", "--trace", "t.jsonl", "--policy", "lpc", "--capacity-tokens", "9"]
    line = refused([*argv, "--predictor", "half"], capsys, work)
    assert "model.safetensors" in line
    assert "half" in line


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (b'{"time": 0, "conversation_id": "c0", "turn": 0, "prompt', "t2.jsonl:1"),  # truncated
        (b"\xff\xfe\x00\x01 binary\n", "t2.jsonl:1: not UTF-8"),  # not a text file
        (b'{"time": 0}\n', "missing field"),  # a record without its fields
        (b"\n\n", "holds no requests"),  # an empty trace
    ],
)
def test_corrupt_trace_is_refused_naming_the_file(work, capsys, content, expect):
    (work / "t2.jsonl").write_bytes(content)
    for argv in (
        ["simulate", "--trace", "t2.jsonl", "--policy", "lru", "--capacity-tokens", "9"],
        ["train-predictor", "--trace", "t2.jsonl", "--out", "p2"],
        ["sweep", "--trace", "t2.jsonl", "--capacities", "9", "--out", "sw"],
    ):
        line = refused(argv, capsys, work)
        assert "t2.jsonl" in line
        assert expect in line


def test_train_refuses_a_trace_it_cannot_learn_from_before_embedding(
    work, capsys, monkeypatch, write_trace
):
    monkeypatch.setattr(cli_main, "_encoder", lambda n, d: pytest.fail("encoder loaded"))
    # a trace without user_text gives the predictor nothing to read
    write_trace(work / "bare.jsonl", user_text=False)
    line = refused(["train-predictor", "--trace", "bare.jsonl", "--out", "p2"], capsys, work)
    assert "bare.jsonl" in line
    assert "user_text" in line
    # one conversation cannot be split into a training and a validation set
    write_trace(work / "one.jsonl", conversations=1)
    line = refused(["train-predictor", "--trace", "one.jsonl", "--out", "p2"], capsys, work)
    assert "one.jsonl" in line
    assert "empty" in line


def test_lpc_needs_user_text_before_embedding(work, capsys, monkeypatch, write_trace):
    monkeypatch.setattr(cli_main, "_encoder", lambda n, d: pytest.fail("encoder loaded"))
    # a trace without user_text gives the predictor nothing to read
    write_trace(work / "bare.jsonl", user_text=False)
    argv = ["simulate", "--trace", "bare.jsonl", "--policy", "lpc", "--capacity-tokens", "9"]
    line = refused([*argv, "--predictor", "pred"], capsys, work)
    assert "bare.jsonl" in line
    assert "user_text" in line


def test_debug_shows_the_traceback(work):
    # --debug re-raises the library's error instead of printing one line
    (work / "t2.jsonl").write_text("{")
    with pytest.raises(ValueError, match=r"t2\.jsonl"):
        main(
            [
                "--debug",
                "simulate",
                "--trace",
                "t2.jsonl",
                "--policy",
                "lru",
                "--capacity-tokens",
                "9",
            ]
        )


# --- a failed run leaves nothing behind -------------------------------------------------------


def test_failed_sweep_leaves_no_output_folder(work, capsys, monkeypatch):
    import kernels_common.plotting

    def broken_plot(curves, path, **kwargs):
        Path(path).write_bytes(b"\x89PNG half")  # a partial figure, then the failure
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(kernels_common.plotting, "plot_curves", broken_plot)
    line = refused([*SWEEP, "--policies", "lru"], capsys, work)
    assert line == "lpc-cache: error: cannot write the sweep to sw: No space left on device"
    assert not (work / "sw").exists()
    assert not [p for p in work.iterdir() if p.name.startswith(".")]  # no temporaries either


def test_failed_training_leaves_no_predictor_folder(work, capsys, monkeypatch):
    class Encoder(lpc_cache.HashingEncoder):
        cache_path = Path("unused.npz")

    monkeypatch.setattr(cli_main, "_encoder", lambda name, folder: Encoder(dim=4))
    monkeypatch.setattr(cli_main, "_require", lambda *a, **k: None)

    def broken_save(self, directory):
        (Path(directory) / "model.safetensors").write_bytes(b"half")
        raise OSError(28, "No space left on device", str(directory))

    monkeypatch.setattr(lpc_cache.ContinuationPredictor, "save", broken_save)
    refused(TRAIN, capsys, work)
    assert not (work / "p2").exists()
    monkeypatch.undo()
    monkeypatch.chdir(work)
    monkeypatch.setattr(cli_main, "_encoder", lambda name, folder: Encoder(dim=4))
    monkeypatch.setattr(cli_main, "_require", lambda *a, **k: None)
    assert main(TRAIN) == 0  # the same run, writing normally, fills the folder
    assert {p.name for p in (work / "p2").iterdir()} == {
        "config.json",
        "model.safetensors",
        "training.json",
    }
    assert lpc_cache.ContinuationPredictor.load(work / "p2").config.embedding_dim == 4
    # the authors' network, recorded in the saved config with the encoder it was trained on
    assert main([*TRAIN[:-1], "p3", "--network", "authors", "--encoder", "minilm"]) == 0
    config = lpc_cache.ContinuationPredictor.load(work / "p3").config
    assert (config.network, config.encoder, config.word_budget) == ("authors", "minilm", 192)


def test_save_trace_is_atomic(tmp_path, monkeypatch, write_trace):
    trace = lpc_cache.load_trace(write_trace(tmp_path / "t.jsonl"))
    target = tmp_path / "new" / "copy.jsonl"
    calls = []

    def flaky(request):  # fails after a few lines were written
        calls.append(1)
        if len(calls) > 3:
            raise OSError(28, "No space left on device")
        return original(request)

    original = lpc_cache.Request.to_json
    monkeypatch.setattr(lpc_cache.Request, "to_json", flaky)
    with pytest.raises(OSError, match="No space"):
        lpc_cache.save_trace(trace, target)
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


def test_predictor_save_is_atomic(tmp_path, monkeypatch):
    import safetensors.torch

    predictor = lpc_cache.ContinuationPredictor(lpc_cache.PredictorConfig(embedding_dim=4))

    def broken(tensors, path):
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(OSError, match="No space"):
        predictor.save(tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


def test_corrupt_embedding_cache_is_named(tmp_path):
    from lpc_cache.encoders import _read_cache

    path = tmp_path / "all-MiniLM-L6-v2-256.npz"
    path.write_bytes(b"PK\x03\x04 truncated zip")  # an interrupted write of an older version
    with pytest.raises(ValueError, match=r"all-MiniLM-L6-v2-256\.npz"):
        _read_cache(path, 4)
    np.savez(path, keys=np.array(["a", "b"]), vectors=np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="expected"):  # embeddings of another model size
        _read_cache(path, 4)
    np.savez(path, keys=np.array(["a"]), vectors=np.ones((1, 4), np.float32))
    assert json.dumps(sorted(_read_cache(path, 4))) == '["a"]'


def test_trace_build_writes_whole_or_nothing(work, capsys, monkeypatch):
    small = lpc_cache.load_trace(work / "t.jsonl")
    monkeypatch.setattr(cli_main, "_require", lambda *a, **k: None)
    monkeypatch.setattr(lpc_cache.trace, "sharegpt_trace", lambda *a, **k: small)
    original = lpc_cache.Request.to_json
    calls = []

    def flaky(request):  # the disk fills up after a few lines
        calls.append(1)
        if len(calls) > 3:
            raise OSError(28, "No space left on device")
        return original(request)

    monkeypatch.setattr(lpc_cache.Request, "to_json", flaky)
    line = refused(["trace", "build", "--out", "new/x.jsonl"], capsys, work)
    assert (
        line == "lpc-cache: error: cannot write the trace to new/x.jsonl: No space left on device"
    )
    monkeypatch.setattr(lpc_cache.Request, "to_json", original)
    assert main(["trace", "build", "--out", "new/x.jsonl"]) == 0
    assert len(lpc_cache.load_trace(work / "new" / "x.jsonl")) == len(small)
    # an offset past the end of the data set gives no conversations: nothing is written
    monkeypatch.setattr(lpc_cache.trace, "sharegpt_trace", lambda *a, **k: lpc_cache.Trace([]))
    assert "--offset 99999" in refused(
        ["trace", "build", "--out", "y.jsonl", "--offset", "99999"], capsys, work
    )
