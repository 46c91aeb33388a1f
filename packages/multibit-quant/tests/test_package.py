"""Package-level checks: README example, lean import, the CLI end to end and its refusals, a
tiny reproduce run."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import multibit_quant as mbq
from kernels_common.results import ReproduceResults
from kernels_common.testing import import_footprint, run_markdown_python
from multibit_quant.__main__ import _checkpoint_data, _parser, main

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs():
    run_markdown_python(README)


def test_import_is_lean():
    footprint = import_footprint("import torch, multibit_quant", watch=["triton", "benchdata"])
    assert not footprint["triton"]
    assert not footprint["benchdata"]
    assert not footprint["cuda"]


def test_cli_train_evaluate_export(tmp_path, capsys):
    out = tmp_path / "run"
    code = main([
        "train", "--width", "4", "--bits", "2,8", "--evaluate-bits", "3", "--epochs", "1",
        "--train-subset", "256", "--test-subset", "128", "--coreset", "0.5", "--out", str(out),
    ])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(report["accuracy"]) == {"2", "3", "8"}
    assert (out / "model.safetensors").is_file()
    assert (out / "train.json").is_file()
    # evaluate on the same test images: the inputs are scaled as in training, so equal numbers
    evaluate = ["evaluate", "--checkpoint", str(out), "--bits", "2,3,8", "--test-subset", "128"]
    assert main(evaluate) == 0
    assert json.loads(capsys.readouterr().out) == report["accuracy"]
    assert main([*evaluate[:4], "2..4", "--test-subset", "64"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"2", "3", "4"}
    # a second run into the same folder is refused, before any training
    assert main(["train", "--epochs", "1", "--train-subset", "64", "--out", str(out)]) == 2
    assert "already holds a checkpoint; pass --overwrite" in capsys.readouterr().err
    exported = tmp_path / "model8.safetensors"
    code = main([
        "export", "--checkpoint", str(out), "--bits", "8", "--out", str(exported),
        "--test-subset", "64", "--verify", "64",
    ])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert exported.is_file()
    assert report["predictions_equal"] == report["of"] == 64
    assert mbq.__version__ == importlib.metadata.version("multibit-quant")


def _image_folders(root: Path, classes: int = 3, per_class: int = 10) -> None:
    """``root/{train,test}/class<c>/<i>.png``, 8x8 grayscale noise."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in range(classes):
            (root / split / f"class{c}").mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (8, 8), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / f"class{c}" / f"{i}.png")


def test_cli_subsets_of_an_image_folder_are_stratified(tmp_path, capsys):
    """--train-subset / --test-subset on an ImageFolder (read class by class) keep as many
    images of every class, for train as for evaluate; too many is refused in one line."""
    _image_folders(tmp_path / "data")
    data = ["--dataset", "folder", "--data-path", str(tmp_path / "data")]
    out = tmp_path / "run"
    code = main(["train", "--width", "4", "--bits", "4", "--epochs", "1", *data,
                 "--train-subset", "12", "--test-subset", "9", "--out", str(out)])  # fmt: skip
    assert code == 0
    capsys.readouterr()
    report = json.loads((out / "train.json").read_text())
    assert report["trained_examples"] == {"4": 12}  # one epoch over the 12 kept images
    args = _parser().parse_args(["evaluate", "--checkpoint", str(out), *data, "--test-subset", "9"])
    test = _checkpoint_data(args, json.loads((out / "config.json").read_text()))
    assert torch.bincount(test.labels).tolist() == [3, 3, 3]
    args.test_subset = None
    everything = _checkpoint_data(args, json.loads((out / "config.json").read_text()))
    assert all((everything.images == image).all((1, 2, 3)).any() for image in test.images)
    assert main(["evaluate", "--checkpoint", str(out), *data, "--test-subset", "31"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == "multibit-quant: error: --test-subset 31 asks for more than the 30 test images"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--bits", "2,16", "--out", "{tmp}"], "bit-widths must be 2 to 8"),
        (["train", "--bits", "4..2", "--out", "{tmp}"], "bits must look like"),
        (["train", "--coreset", "1.5", "--out", "{tmp}"], "fraction in (0, 1], got '1.5'"),
        (["train", "--epochs", "-5", "--out", "{tmp}"], "positive integer"),
        (["train", "--lr", "nan", "--out", "{tmp}"], "finite number, got 'nan'"),
        (["train", "--out", "/proc/forbidden"], "cannot write"),
        (["evaluate", "--checkpoint", "{tmp}"], "is not a checkpoint"),
        (["export", "--out", "{tmp}/x.bin", "--checkpoint", "{tmp}"], ".safetensors file"),
    ],
)
def test_cli_refuses_bad_input_with_one_line(argv, message, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1, error  # one line, no usage block
    assert error[0].startswith("multibit-quant ")
    assert message in error[0], error
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"config.json": '{"format_version": 1, ', "model.safetensors": b"x"}, "truncated"),
        ({"config.json": "[1, 2]", "model.safetensors": b"x"}, "not a JSON object"),
        ({"config.json": '{"format_version": 7}', "model.safetensors": b"x"}, "format_version 7"),
    ],
)
def test_cli_names_a_corrupt_checkpoint(files, message, tmp_path, capsys):
    # a damaged checkpoint folder: the error names the file and what is wrong with it
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    assert main(["evaluate", "--checkpoint", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"multibit-quant: error: {tmp_path / 'config.json'}")
    assert message in error
    assert "\n" not in error


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "folder"], "--dataset folder needs --data-path"),
        (["--model", "vit", "--width", "4"], "--width sizes the ResNet-20"),
        (["--dim", "8"], "--dim sizes the ViT"),
        (["--bits", "32", "--evaluate-bits", "4", "--weight", "lsq"], "--bits must include"),
    ],
)
def test_cli_reports_bad_combinations_as_one_line_and_writes_nothing(
    argv, message, tmp_path, capsys
):
    out = tmp_path / "new"
    code = main(["train", *argv, "--train-subset", "32", "--test-subset", "16", "--out", str(out)])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("multibit-quant: error: ")
    assert message in error
    assert "\n" not in error
    assert not out.exists()  # nothing created on a refusal


def test_cli_trains_a_vit_sized_to_the_images(tmp_path, capsys):
    code = main([
        "train", "--model", "vit", "--dim", "16", "--bits", "4", "--epochs", "1",
        "--train-subset", "64", "--test-subset", "32", "--out", str(tmp_path / "vit"),
    ])  # fmt: skip
    assert code == 0
    config = json.loads((tmp_path / "vit" / "config.json").read_text())
    assert config["architecture"]["kwargs"] == {"image_size": 28, "patch": 7, "dim": 16}
    assert config["normalization"] is not None


def test_tiny_reproduce_writes_valid_results(tmp_path):
    from multibit_quant.reproduce import ReproduceSettings, run

    settings = ReproduceSettings(
        train_images=200, test_images=100, width=4, epochs=1, alignment_batch=64
    )
    results = run(tmp_path, settings=settings)
    loaded = ReproduceResults.load(tmp_path)
    assert [c.name for c in loaded.claims] == [c.name for c in results.claims]
    assert (tmp_path / "summary.md").is_file()
    assert all((tmp_path / figure).is_file() for figure in loaded.figures)
    assert len(loaded.settings["schemes"]) == 6  # the five schemes, coresets at two rates
