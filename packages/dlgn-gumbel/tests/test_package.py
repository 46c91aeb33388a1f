"""Package-level checks: README example, lean import, CLI, training checkpoints and resume."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dlgn_gumbel
from dlgn_gumbel.__main__ import main
from dlgn_gumbel.data import load_images
from dlgn_gumbel.train import TrainConfig, load_checkpoint, train
from kernels_common.testing import import_footprint, run_markdown_python

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs():
    run_markdown_python(README)


def test_import_does_not_load_triton_or_cuda():
    footprint = import_footprint("import torch, dlgn_gumbel", watch=["triton"])
    assert not footprint["triton"], "triton imported"
    assert not footprint["cuda"]


def test_cli_help():
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--help"])
    assert exit_info.value.code == 0
    assert dlgn_gumbel.__version__ == importlib.metadata.version("dlgn-gumbel")


@pytest.fixture(scope="module")
def digits():
    return load_images("digits")


def _config(steps, **kwargs):
    return TrainConfig(
        layer_sizes=(200, 100), tau=3.0, steps=steps, eval_every=5, batch_size=64, **kwargs
    )


# the authors' settings: residual init, their connections and input layout, and the options
AUTHORS = {"init": "residual", "connections": "difflogic", "thermometer_layout": "threshold"}


@pytest.mark.parametrize(
    ("relaxation", "options"),
    [
        ("softmax", {}),
        ("gumbel", {}),
        ("gumbel", {**AUTHORS, "noise": "per_example"}),
        ("dirichlet", AUTHORS),
    ],
)
def test_resume_continues_exactly(tmp_path, digits, relaxation, options):
    args = (digits.x_train, digits.y_train, digits.x_test[:100], digits.y_test[:100])
    kw = {"num_classes": 10, "backend": "reference", "progress": False}
    config = functools.partial(_config, relaxation=relaxation, **options)
    full = train(config(12), *args, out_dir=tmp_path / "a", **kw)
    train(config(7), *args, out_dir=tmp_path / "b", **kw)
    resumed = train(config(12), *args, out_dir=tmp_path / "b", resume=True, **kw)
    assert resumed.steps == 12
    for p, q in zip(full.net.parameters(), resumed.net.parameters(), strict=True):
        assert torch.equal(p, q)
    net, loaded = load_checkpoint(tmp_path / "b")
    assert loaded == config(12)
    assert all(
        getattr(net.layers[0], k) == v for k, v in options.items() if k != "thermometer_layout"
    )
    assert loaded.encoder().layout == options.get("thermometer_layout", "feature")
    assert loaded.relaxation == relaxation
    assert torch.equal(net.layers[0].weights, full.net.layers[0].weights)
    with pytest.raises(ValueError, match="differs"):
        train(_config(12, relaxation="softmax", lr=0.1), *args, out_dir=tmp_path / "b",
              resume=True, **kw)  # fmt: skip


def test_a_checkpoint_from_before_the_init_options_resumes(tmp_path, digits):
    """Checkpoints written before ``init``, ``init_sigma``, ``noise`` and
    ``thermometer_layout`` existed hold their defaults, and resume."""
    args = (digits.x_train, digits.y_train, digits.x_test[:100], digits.y_test[:100])
    kw = {"num_classes": 10, "backend": "reference", "progress": False}
    train(_config(4), *args, out_dir=tmp_path / "old", **kw)
    state_path = tmp_path / "old" / "checkpoint.json"
    state = json.loads(state_path.read_text())
    for key in ("init", "init_sigma", "noise", "thermometer_layout"):
        del state["config"][key]
    for key in ("init", "init_sigma", "noise"):
        del state["net_config"][key]
    state_path.write_text(json.dumps(state))
    resumed = train(_config(6), *args, out_dir=tmp_path / "old", resume=True, **kw)
    assert resumed.steps == 6


def test_cli_groups_sets_groupsum_k_and_resume_keeps_it(tmp_path, capsys):
    """``--groups 20`` on 10-class digits: the authors' GroupSum with more groups than classes."""
    out = tmp_path / "run"
    argv = ["train", "--dataset", "digits", "--out", str(out), "--layers", "100x2", "--steps",
            "4", "--eval-every", "2", "--batch-size", "32", "--tau", "2", "--backend",
            "reference", "--connections", "random"]  # fmt: skip
    assert main([*argv, "--groups", "20"]) == 0
    net, _ = load_checkpoint(out)
    assert net.config.num_classes == 20
    assert net(torch.zeros(3, 192)).shape == (3, 20)
    capsys.readouterr()
    assert main([*argv, "--steps", "6", "--resume"]) == 2  # without --groups: 10 groups
    assert "20 GroupSum groups, not 10" in capsys.readouterr().err


def test_cli_diagnose_writes_its_table_as_json(tmp_path, capsys):
    out = tmp_path / "diag.json"
    argv = ["diagnose", "--dataset", "digits", "--layers", "100x2", "--draws", "3",
            "--batch-size", "16", "--init", "residual", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "cos(draw, mean of 3)" in printed
    result = json.loads(out.read_text())
    assert result["net_config"]["init"] == "residual"
    assert [row["layer"] for row in result["layers"]] == [1, 2]
    assert all(-1 <= row["cos_draw_softmax"] <= 1 for row in result["layers"])


def test_checkpoint_halves_from_different_steps_are_refused(tmp_path, digits):
    """Tensors and JSON state are renamed into place one after the other; a run killed between
    the two renames leaves halves of different steps, which resume must refuse."""
    import json

    args = (digits.x_train, digits.y_train, digits.x_test[:50], digits.y_test[:50])
    kw = {"num_classes": 10, "backend": "reference", "progress": False}
    train(_config(5), *args, out_dir=tmp_path, **kw)
    state = tmp_path / "checkpoint.json"
    meta = json.loads(state.read_text())
    assert meta["steps"] == 5
    assert not list(tmp_path.glob("*.partial"))
    meta["steps"] = 10  # the JSON of a later step next to the tensors of step 5
    state.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="different steps"):
        train(_config(12), *args, out_dir=tmp_path, resume=True, **kw)
    with pytest.raises(ValueError, match="different steps"):
        load_checkpoint(tmp_path)


def test_train_refuses_empty_data(digits):
    """An empty training set used to train on empty batches (NaN loss) without complaint."""
    with pytest.raises(ValueError, match="non-empty"):
        train(_config(2), digits.x_train[:0], digits.y_train[:0], digits.x_test, digits.y_test,
              num_classes=10, progress=False)  # fmt: skip


def test_cli_train_then_compile(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        ["train", "--dataset", "digits", "--out", str(out), "--layers", "100x2", "--steps", "6",
         "--eval-every", "3", "--batch-size", "32", "--tau", "2", "--backend", "reference"]
    )  # fmt: skip
    assert code == 0
    assert (out / "checkpoint.safetensors").is_file()
    assert (out / "compiled" / "config.json").is_file()
    assert main(["compile", "--checkpoint", str(out), "--out", str(tmp_path / "c"),
                 "--engine", "numpy", "--dataset", "digits"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "test accuracy" in printed
    assert "images/s" in printed


def test_reproduce_pipeline_tiny(tmp_path, monkeypatch):
    # the CPU path users run (the test sessions' TRITON_INTERPRET=1 would pick the interpreter,
    # too slow for the 1 s budgets to reach a shared evaluation step)
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "reference")
    from dlgn_gumbel.reproduce import ReproduceSettings, _reduction, _time_to, run
    from kernels_common.results import ReproduceResults

    assert _reduction(0.2, 0.05) == pytest.approx(75.0)
    assert _reduction(0.02, -0.04) == pytest.approx(-100.0)  # a gap of the other sign grew
    history = [
        {"discrete_acc": 0.3, "train_time_s": 1.0},
        {"discrete_acc": 0.6, "train_time_s": 2.0},
    ]
    assert _time_to(history, 0.5) == 2.0
    assert _time_to(history, 0.7) == float("inf")
    with pytest.raises(ValueError, match="at least 1176 wide"):
        ReproduceSettings(None, None, (2000,) * 6, 1.0, 5, sweep_widths=(1000, 2000))
    tiny = ReproduceSettings(
        train_subset=600,
        test_subset=200,
        layer_sizes=(200, 100),
        budget_s=1.0,
        eval_every=5,
        sweep_depths=(1, 2),
        sweep_widths=(100,),
        sweep_steps=3,
        diagnose_draws=2,
        connections="random",  # "unique" needs 2 * width >= 2352 input bits
    )
    results = run(tmp_path, settings=tiny)
    loaded = ReproduceResults.load(tmp_path)
    assert [c.name for c in loaded.claims] == [c.name for c in results.claims]
    exact = next(c for c in results.claims if c.name.startswith("compiled =="))
    assert exact.passed
    assert (tmp_path / "summary.md").is_file()
    assert all((tmp_path / f).is_file() for f in results.figures)
    settings = loaded.settings
    assert set(settings["runs"]) == {"softmax", "gumbel", "softmax+residual", "gumbel+residual"}
    assert len(settings["sweep"]) == 2 * 3  # depths x the three sweep arms
    assert set(settings["gradient_agreement"]) == {
        "randn, shared noise", "randn, per_example noise",
        "residual, shared noise", "residual, per_example noise",
    }  # fmt: skip
    step = settings["equal_step"]
    assert step is not None
    for row in settings["runs"].values():  # every arm's row at the shared step is from its run
        assert row["equal_steps"] == next(h for h in row["history"] if h["step"] == step)


def test_paper_width_script_smoke(tmp_path):
    """The GPU script for the authors' width, shrunk to a CPU run: it trains the three arms with
    the authors' settings and reports the claims."""
    script = Path(__file__).parents[1] / "benchmarks" / "paper_width.py"
    data = tmp_path / "fmnist.npz"
    gen = np.random.default_rng(0)
    np.savez_compressed(
        data,
        x_train=gen.integers(0, 256, (300, 784), dtype=np.uint8),
        y_train=gen.integers(0, 10, 300),
        x_test=gen.integers(0, 256, (100, 784), dtype=np.uint8),
        y_test=gen.integers(0, 10, 100),
    )
    out = tmp_path / "report"
    subprocess.run(
        [sys.executable, str(script), "--smoke", "--data", str(data), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    report = json.loads((out / "paper_width.json").read_text())
    assert set(report["runs"]) == {"softmax", "gumbel", "softmax+residual", "gumbel+residual"}
    assert set(report["claims"]) == {"softmax vs gumbel", "softmax+residual vs gumbel+residual"}
    assert report["runs"]["gumbel"]["neurons"] == 2 * 1200


@pytest.mark.gpu
def test_training_on_cuda_follows_the_cpu_run(digits):
    """``train(device="cuda")``: the network, its batches and its evaluation run on the GPU (the
    Triton kernel), and softmax training follows the CPU run: the mean loss of the first 5 steps
    agrees to 1e-3 relative. (The logits themselves are not compared: Adam turns float32
    reordering noise in a near-zero gradient into a full lr-sized step.)"""
    args = (digits.x_train, digits.y_train, digits.x_test[:100], digits.y_test[:100])
    config = _config(5, relaxation="softmax")
    cpu = train(config, *args, num_classes=10, backend="reference", progress=False)
    gpu = train(config, *args, num_classes=10, progress=False, device="cuda")
    assert all(p.is_cuda for p in gpu.net.parameters())
    assert gpu.history[0]["step"] == 5
    assert gpu.history[0]["loss"] == pytest.approx(cpu.history[0]["loss"], rel=1e-3)
