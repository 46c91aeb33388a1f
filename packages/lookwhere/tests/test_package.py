"""Package-level checks: README example, lean import, checkpoints, the CLI end to end and its
refusals, a tiny reproduce run."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch

import lookwhere
from kernels_common.results import ReproduceResults
from kernels_common.testing import assert_refused, import_footprint, run_markdown_python
from lookwhere import checkpoint
from lookwhere.__main__ import main
from lookwhere.baselines import DenseClassifier
from lookwhere.model import lookwhere_from_teacher
from lookwhere.vit import ViT, ViTConfig

README = Path(__file__).parents[1] / "README.md"
TINY = ["--size", "48", "--train-images", "32", "--batch-size", "8", "--seed", "1"]


def test_readme_example_runs():
    run_markdown_python(README)


def test_import_is_lean():
    footprint = import_footprint(
        "import torch, lookwhere",
        watch=["triton", "benchdata", "matplotlib", "transformers", "safetensors"],
    )
    assert not any(footprint.values()), footprint


def test_version():
    assert lookwhere.__version__ == importlib.metadata.version("lookwhere")


def test_checkpoint_round_trip_is_bit_exact(tmp_path):
    torch.manual_seed(0)
    teacher = ViT(ViTConfig(dim=16, depth=2, heads=2, patch_size=4, image_size=16))
    model = lookwhere_from_teacher(teacher, selector_depth=1, selector_size=8, num_classes=3, k=5)
    checkpoint.save(model, tmp_path / "lw", extra={"note": "x"})
    loaded, extra = checkpoint.load(tmp_path / "lw")
    assert extra == {"note": "x"}
    assert loaded.k == 5
    assert checkpoint.state_equal(model, loaded)
    images = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(model.eval()(images).logits, loaded(images).logits)
    dense = DenseClassifier(teacher, 4)
    checkpoint.save(dense, tmp_path / "vit")
    assert checkpoint.state_equal(dense, checkpoint.load(tmp_path / "vit")[0])


def test_checkpoint_refuses_broken_folders(tmp_path):
    torch.manual_seed(0)
    dense = DenseClassifier(
        ViT(ViTConfig(dim=16, depth=1, heads=2, patch_size=4, image_size=16)), 2
    )
    folder = checkpoint.save(dense, tmp_path / "vit")
    (folder / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        checkpoint.load(folder)
    spec = json.loads((folder / "lookwhere.json").read_text())
    (folder / "lookwhere.json").write_text(json.dumps({**spec, "format_version": 9}))
    with pytest.raises(ValueError, match="format_version 9"):
        checkpoint.load(folder)
    with pytest.raises(FileNotFoundError, match="lookwhere model description"):
        checkpoint.load(tmp_path / "missing")


def test_cli_pretrain_finetune_evaluate(tmp_path, capsys):
    pre, fine = tmp_path / "pre", tmp_path / "fine"
    common = [*TINY, "--task", "sparse", "--distractors", "1"]
    assert main(["pretrain", *common, "--out", str(pre), "--teacher-steps", "2", "--steps", "2",
                 "--dim", "16", "--heads", "2", "--depth", "2",
                 "--selector-size", "24", "--k-range", "2,8"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert checkpoint.load(pre)[0].selector.vit.config.depth == 1  # the default without --hf
    assert set(report["last_loss"]) == {"cls", "patch", "map", "total"}
    assert (pre / "teacher" / "lookwhere.json").is_file()
    assert main(["finetune", *common, "--checkpoint", str(pre), "--out", str(fine),
                 "--steps", "2", "--k-range", "2,8"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["evaluate", "--size", "48", "--task", "sparse", "--test-images", "16",
                 "--checkpoint", str(fine), "--k", "4,8"]) == 0  # fmt: skip
    rows = json.loads(capsys.readouterr().out)
    assert [r["setting"] for r in rows] == ["k=4", "k=8"]
    assert rows[0]["gflops"] < rows[1]["gflops"]
    assert all(0 <= r["accuracy"] <= 1 and 0 <= r["target_recall"] <= 1 for r in rows)
    assert main(["evaluate", "--size", "48", "--test-images", "16",
                 "--checkpoint", str(pre / "teacher")]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)[0]["method"] == "dense"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pretrain", "--out", "{tmp}/o", "--k-range", "8,4"], "LOW <= HIGH"),
        (["pretrain", "--out", "{tmp}/o", "--task", "video"], "video"),
        (["pretrain", "--out", "{tmp}/o", "--size", "0"], "'0'"),
        (["evaluate", "--checkpoint", "{tmp}/missing"], "missing"),
        (["finetune", "--checkpoint", "{tmp}", "--out", "{tmp}/o"], "lookwhere.json"),
        (["reproduce", "--out", "/proc/forbidden"], "cannot write"),
    ],
)
def test_cli_refuses_bad_input_with_one_line(argv, message, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert_refused(main, argv, capsys, "lookwhere", message, unchanged=tmp_path)


def test_cli_refuses_a_teacher_for_another_size(tmp_path, capsys):
    dense = DenseClassifier(
        ViT(ViTConfig(dim=16, depth=1, heads=2, patch_size=8, image_size=64)), 10
    )
    checkpoint.save(dense, tmp_path / "t")
    argv = ["pretrain", *TINY, "--teacher", str(tmp_path / "t"), "--out", str(tmp_path / "o")]
    assert_refused(main, argv, capsys, "lookwhere", "64px images, not --size 48")


def test_tiny_reproduce_writes_valid_results(tmp_path):
    from lookwhere.experiment import MethodSettings
    from lookwhere.reproduce import ReproduceSettings, reproduce
    from lookwhere.train import TrainConfig

    short = TrainConfig(steps=2, batch_size=8)
    settings = ReproduceSettings(
        train_images=24, test_images=16, crop_steps=2, sparse_stages=((64, 2), (96, 2)),
        global_steps=2, teacher=short,
        vit=ViTConfig(dim=16, depth=2, heads=2, patch_size=8),
        sparse=MethodSettings(pretrain=short, finetune=short, time_batch=4, ks=(6, 12)),
        global_=MethodSettings(selector_size=32, k_range=(4, 16), ks=(8, 16), low_sizes=(32,),
                               tome_rs=(4,), pretrain=short, finetune=short, time_batch=4),
    )  # fmt: skip
    results = reproduce(tmp_path, settings=settings)
    loaded = ReproduceResults.load(tmp_path)
    assert [c.name for c in loaded.claims] == [c.name for c in results.claims]
    assert len(loaded.claims) == 5
    assert all((tmp_path / figure).is_file() for figure in loaded.figures)
    points = json.loads((tmp_path / "points.json").read_text())
    assert {p["method"] for p in points["sparse"]} == {
        "lookwhere", "dense", "low-res", "random", "evit", "tome"
    }  # fmt: skip


def test_checkpoint_refuses_weights_of_another_shape(tmp_path):
    small = DenseClassifier(
        ViT(ViTConfig(dim=16, depth=1, heads=2, patch_size=4, image_size=16)), 2
    )
    wide = DenseClassifier(ViT(ViTConfig(dim=32, depth=1, heads=2, patch_size=4, image_size=16)), 2)
    checkpoint.save(small, tmp_path / "a")
    checkpoint.save(wide, tmp_path / "b")
    (tmp_path / "a" / "model.safetensors").write_bytes(
        (tmp_path / "b" / "model.safetensors").read_bytes()
    )
    with pytest.raises(ValueError, match="does not fit"):
        checkpoint.load(tmp_path / "a")


def test_cli_refuses_a_size_the_patches_do_not_divide_before_any_work(tmp_path, capsys):
    argv = ["pretrain", "--size", "100", "--out", str(tmp_path / "o")]
    assert_refused(main, argv, capsys, "lookwhere", "--size 100", "8-pixel patches")


def test_cli_refuses_a_dinov2_folder_at_the_default_sizes(tmp_path, capsys):
    (tmp_path / "dino").mkdir()
    config = {
        "model_type": "dinov2_with_registers", "patch_size": 14, "hidden_size": 32,
        "num_hidden_layers": 12,
    }  # fmt: skip
    (tmp_path / "dino" / "config.json").write_text(json.dumps(config))
    argv = ["pretrain", "--hf", str(tmp_path / "dino"), "--out", str(tmp_path / "o")]
    assert_refused(main, argv, capsys, "lookwhere", "--size 96", "14-pixel patches")


def test_cli_refuses_a_k_range_beyond_the_grid(tmp_path, capsys):
    argv = ["pretrain", "--size", "32", "--k-range", "4,20", "--out", str(tmp_path / "o")]
    assert_refused(main, argv, capsys, "lookwhere", "16 patches")


def _no_work(monkeypatch):
    import lookwhere.__main__ as cli_module

    def fail(*args, **kwargs):
        raise AssertionError("data was generated before the arguments were checked")

    monkeypatch.setattr(cli_module, "_task", fail)


def test_cli_refuses_a_selector_deeper_than_the_teacher_before_any_work(
    tmp_path, capsys, monkeypatch
):
    _no_work(monkeypatch)
    argv = ["pretrain", "--size", "48", "--depth", "2", "--selector-depth", "3",
            "--out", str(tmp_path / "o")]  # fmt: skip
    assert_refused(main, argv, capsys, "lookwhere", "--selector-depth 3 must be in [1, 2]")
    dense = DenseClassifier(
        ViT(ViTConfig(dim=16, depth=2, heads=2, patch_size=8, image_size=48)), 10
    )
    checkpoint.save(dense, tmp_path / "t")
    argv = ["pretrain", "--size", "48", "--teacher", str(tmp_path / "t"), "--selector-depth", "4",
            "--out", str(tmp_path / "o")]  # fmt: skip
    assert_refused(main, argv, capsys, "lookwhere", "--selector-depth 4 must be in [1, 2]")


def test_cli_selector_depth_defaults_to_the_papers_3_with_hf(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    (tmp_path / "dino").mkdir()
    config = {"model_type": "dinov2", "patch_size": 14, "num_hidden_layers": 2}
    (tmp_path / "dino" / "config.json").write_text(json.dumps(config))
    argv = ["pretrain", "--hf", str(tmp_path / "dino"), "--size", "98", "--k-range", "2,8",
            "--out", str(tmp_path / "o")]  # fmt: skip
    assert_refused(main, argv, capsys, "lookwhere", "--selector-depth 3 must be in [1, 2]")


def _saved_lookwhere(folder: Path, extra: dict | None = None) -> Path:
    torch.manual_seed(0)
    teacher = ViT(ViTConfig(dim=16, depth=2, heads=2, patch_size=8, image_size=48))
    model = lookwhere_from_teacher(teacher, selector_depth=1, selector_size=24, num_classes=10, k=8)
    return checkpoint.save(model, folder, extra=extra)


def test_cli_evaluate_refuses_a_k_beyond_the_grid_before_any_work(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    folder = _saved_lookwhere(tmp_path / "lw", {"size": 48})
    argv = ["evaluate", "--checkpoint", str(folder), "--k", "4,1000"]
    assert_refused(main, argv, capsys, "lookwhere", "--k 1000 must be in [1, 36]")
    argv = ["evaluate", "--checkpoint", str(folder), "--size", "96"]
    assert_refused(main, argv, capsys, "lookwhere", "--size 96", "takes 48px images")


@pytest.mark.parametrize("extra", [{"size": 48}, None])
def test_cli_evaluate_defaults_the_size_to_the_checkpoints(tmp_path, capsys, extra):
    folder = _saved_lookwhere(tmp_path / "lw", extra)
    assert main(["evaluate", "--checkpoint", str(folder), "--test-images", "8", "--k", "4"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["setting"] for r in rows] == ["k=4"]
