"""Package-level checks: README example, lean import, checkpoints, the shipped weights on real
images, tiling, the CLI end to end and its refusals, a tiny reproduce run."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY
from PIL import Image

import spikesr
from kernels_common.results import ReproduceResults
from kernels_common.testing import assert_refused, import_footprint, run_markdown_python
from spikesr import checkpoint
from spikesr.__main__ import main
from spikesr.baselines import EDSR, bicubic_upscale
from spikesr.data import Pair, benchmark_images, read_image
from spikesr.evaluate import evaluate, upscale
from spikesr.metrics import psnr
from spikesr.model import SpikeSR
from spikesr.resize import degrade, modcrop

README = Path(__file__).parents[1] / "README.md"


@pytest.fixture(scope="module")
def aero3() -> np.ndarray:
    """A held-out real aerial photograph (never trained on), cropped to 192 x 256."""
    return benchmark_images("aerial")["aero3"][144:336, 192:448]


def test_readme_example_runs():
    run_markdown_python(README)


def test_import_is_lean():
    footprint = import_footprint(
        "import torch, spikesr",
        watch=["benchdata", "matplotlib", "safetensors", "PIL", "skimage", "spikingjelly"],
    )
    assert not any(footprint.values()), footprint


def test_train_and_evaluate_from_public_names_only(tmp_path):
    # what train() and evaluate() take is made by public functions, from image files on disk
    rng = np.random.default_rng(0)
    for i in range(2):
        pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / f"{i}.png")
    images = spikesr.folder_images(tmp_path)
    np.testing.assert_array_equal(images["0"], spikesr.read_image(tmp_path / "0.png"))
    pairs = spikesr.make_pairs(images, 2)
    assert all(isinstance(pair, spikesr.Pair) for pair in pairs)
    model = spikesr.SpikeSR(TINY)
    sampler = spikesr.PatchSampler(pairs, 2, lr_patch=16)
    log = spikesr.train(model, sampler, spikesr.TrainConfig(steps=1, batch_size=1, lr_patch=16))
    assert isinstance(log, spikesr.TrainLog)
    scores = spikesr.evaluate(spikesr.model_upscaler(model), pairs, 2)
    bicubic = spikesr.evaluate(spikesr.bicubic_upscaler(2), pairs, 2)
    expected = np.mean([psnr(bicubic_upscale(p.lr, 2), p.hr, y_channel=True) for p in pairs])
    assert bicubic.psnr == pytest.approx(expected, rel=1e-12)
    assert set(scores.per_image) == {"0", "1"}
    spikesr.write_image(tmp_path / "out.png", spikesr.upscale(model, pairs[0].lr))
    assert spikesr.read_image(tmp_path / "out.png").shape == pairs[0].hr.shape
    assert set(spikesr.__all__) <= set(dir(spikesr))


def test_version():
    assert spikesr.__version__ == importlib.metadata.version("spikesr")


@pytest.mark.parametrize("half", [False, True])
def test_checkpoint_round_trip(tmp_path, half):
    torch.manual_seed(0)
    model = SpikeSR(TINY).eval()
    checkpoint.save(model, tmp_path / "m.safetensors", extra={"note": "x"}, half=half)
    loaded, extra = checkpoint.load(tmp_path / "m.safetensors")
    assert extra == {"note": "x"}
    assert loaded.config == model.config
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        expected = a.half().float() if half and a.is_floating_point() else a
        assert torch.equal(b, expected), name
    edsr = EDSR(2, 4, 1)
    checkpoint.save(edsr, tmp_path / "e.safetensors")
    assert type(checkpoint.load(tmp_path / "e.safetensors")[0]) is EDSR


def test_checkpoint_refuses_broken_and_foreign_files(tmp_path):
    from safetensors.torch import save_file

    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 10)
    with pytest.raises(ValueError, match=r"broken\.safetensors"):
        checkpoint.load(broken)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    with pytest.raises(ValueError, match="not a spikesr weights file"):
        checkpoint.load(foreign)
    with pytest.raises(FileNotFoundError, match=r"missing\.safetensors"):
        checkpoint.load(tmp_path / "missing.safetensors")


def test_checkpoint_refuses_metadata_that_does_not_fit_its_weights(tmp_path, capsys):
    from safetensors.torch import save_file

    model = SpikeSR(TINY)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}

    def write(name: str, spec: dict, weights: dict = state) -> Path:
        metadata = {"format_version": checkpoint.FORMAT_VERSION, "model": json.dumps(spec)}
        save_file(weights, str(tmp_path / name), metadata=metadata)
        return tmp_path / name

    config = model.config.to_dict()
    wider = write("wider.safetensors", {"kind": "spikesr", "config": config | {"width": 32}})
    shapes = r"weights do not fit the model in its metadata \(shapes head\.weight \(16, 3, 3, 3\)"
    with pytest.raises(ValueError, match=rf"wider\.safetensors: its {shapes} instead of \(32,"):
        checkpoint.load(wider)
    image = tmp_path / "in.png"
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(image)
    argv = ["upscale", str(image), str(tmp_path / "out.png"), "--weights", str(wider)]
    assert_refused(main, argv, capsys, "spikesr", "wider.safetensors", "do not fit")
    fewer = {k: v for k, v in state.items() if k != "tail.0.weight"}
    fewer["extra.weight"] = torch.zeros(1)
    partial = write("partial.safetensors", {"kind": "spikesr", "config": config}, fewer)
    with pytest.raises(ValueError, match=r"missing tail\.0\.weight; unexpected extra\.weight"):
        checkpoint.load(partial)
    bare = write("bare.safetensors", {"kind": "spikesr"})
    with pytest.raises(ValueError, match=r"bare\.safetensors: .* no model \(missing 'config'\)"):
        checkpoint.load(bare)
    odd = write("odd.safetensors", {"kind": "spikesr", "config": config | {"colour": 1}})
    with pytest.raises(ValueError, match=r"odd\.safetensors: its model metadata .*colour"):
        checkpoint.load(odd)
    assert checkpoint.load(write("ok.safetensors", {"kind": "spikesr", "config": config}))


@pytest.mark.parametrize("scale", [2, 4])
def test_shipped_weights_beat_bicubic_on_a_held_out_aerial_photo(aero3, scale):
    model = spikesr.pretrained(scale)
    assert model.config.scale == scale
    assert not model.training
    hr = modcrop(aero3, scale)
    lr = degrade(hr, scale)
    ours = psnr(upscale(model, lr), hr, y_channel=True)
    bicubic = psnr(bicubic_upscale(lr, scale), hr, y_channel=True)
    assert ours > bicubic + 0.3, (ours, bicubic)


def test_tiles_change_outputs_only_slightly(aero3):
    model = spikesr.pretrained(4)
    lr = degrade(modcrop(aero3, 4), 4)  # 48 x 64
    whole = upscale(model, lr, tile=None)
    tiled = upscale(model, lr, tile=32, overlap=8)
    # seams: the DSA's patches and matches differ per tile; a fraction of a grey level on average
    assert np.abs(whole - tiled).mean() < 1 / 255
    assert psnr(tiled, whole, y_channel=True) > 40


def test_tiles_cover_any_shape_and_keep_the_mode():
    torch.manual_seed(1)
    model = SpikeSR(TINY).train()
    lr = np.random.default_rng(1).random((40, 120, 3)).astype(np.float32)
    tiled = upscale(model, lr, tile=48, overlap=8)  # one tile down, three across
    assert tiled.shape == (80, 240, 3)
    assert model.training  # upscale runs in eval mode and puts the mode back
    left = upscale(model, lr[:, :48], tile=None)  # the first tile alone, the same network
    # its columns that no other tile reaches are that tile's output exactly
    np.testing.assert_allclose(tiled[:, :64], left[:, :64], rtol=0, atol=1e-6)


def test_upscale_moves_the_model_back_to_its_own_device(monkeypatch):
    # one device here: the model's moves are recorded (it stays on the CPU, standing in for a
    # second device); the gpu test below checks the parameters themselves
    model = SpikeSR(TINY)
    moves = []

    def to(device):
        moves.append(torch.device(device))
        return model

    monkeypatch.setattr(model, "to", to)
    lr = np.random.default_rng(0).random((16, 16, 3)).astype(np.float32)
    upscale(model, lr, device="cpu:0")
    assert moves == [torch.device("cpu", 0), torch.device("cpu")]


@pytest.mark.gpu
def test_upscale_on_cuda_leaves_the_model_on_the_cpu():
    model = SpikeSR(TINY)
    lr = np.random.default_rng(0).random((16, 16, 3)).astype(np.float32)
    on_cpu = upscale(model, lr)
    on_cuda = upscale(model, lr, device="cuda")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    np.testing.assert_allclose(on_cuda, on_cpu, rtol=0, atol=1e-4)  # float32 reordering


def test_training_progress_bar_stays_off_when_stderr_is_not_a_terminal(capsys):
    from spikesr.data import PatchSampler, make_pairs
    from spikesr.train import TrainConfig, train

    pairs = make_pairs({"a": np.random.default_rng(0).random((32, 32, 3))}, 2)
    sampler = PatchSampler(pairs, 2, lr_patch=16)
    train(
        SpikeSR(TINY), sampler, TrainConfig(steps=2, batch_size=1, lr_patch=16), progress="a label"
    )
    assert "a label" not in capsys.readouterr().err  # captured: not a terminal


def test_upscale_and_evaluate_refuse_images_outside_unit_range(aero3):
    model = spikesr.pretrained(4)
    lr = degrade(modcrop(aero3[:64, :64], 4), 4)
    with pytest.raises(ValueError, match=r"LR image has values in \[\d+, \d+\].*divide by 255"):
        upscale(model, lr * 255)  # would come out nearly all white
    with pytest.raises(ValueError, match="LR image has non-finite values"):
        upscale(model, np.full_like(lr, np.nan))  # would come out all NaN
    pairs = [Pair("aero3", modcrop(aero3[:64, :64], 4), lr)]
    with pytest.raises(ValueError, match=r"aero3: the upscaler's output has values in \[\d+, \d+"):
        evaluate(lambda image: np.round(bicubic_upscale(image, 4) * 255), pairs, 4)


def test_upscale_command_on_a_real_image(tmp_path, aero3, capsys):
    lr = degrade(modcrop(aero3[:96, :128], 4), 4)  # 24 x 32
    source = tmp_path / "in.png"
    Image.fromarray(np.round(lr * 255).astype(np.uint8)).save(source)
    assert main(["upscale", str(source), str(tmp_path / "out.png"), "--scale", "4"]) == 0
    out = read_image(tmp_path / "out.png")
    assert out.shape == (96, 128, 3)
    expected = upscale(spikesr.pretrained(4), read_image(source))
    assert np.abs(out - expected).max() <= 0.5 / 255 + 1e-6  # the output is 8-bit
    assert "in.png (32x24)" in capsys.readouterr().out


def test_train_and_evaluate_commands(tmp_path, capsys):
    rng = np.random.default_rng(0)
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (64, 72, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    weights = tmp_path / "w.safetensors"
    argv = ["train", "--out", str(weights), "--images", str(folder), "--scale", "2",
            "--width", "16", "--groups", "1", "--blocks", "1", "--time-steps", "2",
            "--steps", "2", "--batch-size", "2", "--lr-patch", "16"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["parameters"] == spikesr.parameter_count(checkpoint.load(weights)[0])
    assert (
        main(["evaluate", "--weights", str(weights), "--scale", "2", "--images", str(folder)]) == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert set(rows) == {"bicubic", "model"}
    assert set(rows["model"]["per_image"]) == {"0", "1"}


def test_cli_refusals(tmp_path, capsys):
    gray = tmp_path / "gray.png"
    Image.fromarray(np.zeros((32, 32), dtype=np.uint8)).save(gray)
    tiny = tmp_path / "tiny.png"
    Image.fromarray(np.zeros((10, 12, 3), dtype=np.uint8)).save(tiny)
    out = str(tmp_path / "o.png")
    assert_refused(main, ["upscale", str(gray), out, "--scale", "3"], capsys, "spikesr", "3")
    assert_refused(
        main, ["upscale", str(gray), out], capsys, "spikesr", "grayscale", "--repeat-gray"
    )
    assert_refused(main, ["upscale", str(tiny), out], capsys, "spikesr", "10x12", "16x16")
    assert_refused(
        main, ["upscale", str(tmp_path / "none.png"), out], capsys, "spikesr", "none.png"
    )
    x2 = tmp_path / "x2.safetensors"
    checkpoint.save(SpikeSR(TINY), x2)
    assert_refused(main, ["upscale", str(tiny), out, "--weights", str(x2)], capsys, "spikesr",
                   "x2 network, not --scale 4")  # fmt: skip
    assert_refused(main, ["train", "--out", str(x2), "--lr-patch", "12"], capsys, "spikesr",
                   "--lr-patch 12")  # fmt: skip
    assert not (tmp_path / "o.png").exists()


def test_tiny_reproduce_writes_valid_results(tmp_path):
    from spikesr.model import SpikeSRConfig
    from spikesr.reproduce import ReproduceSettings, reproduce
    from spikesr.train import TrainConfig

    settings = ReproduceSettings(
        network=SpikeSRConfig(scale=4, width=16, groups=1, blocks=1, time_steps=2, qk_dim=8,
                              mlp_dim=16),
        train=TrainConfig(steps=2, batch_size=2, lr_patch=16), edsr_blocks=2, tile=64, threads=1,
    )  # fmt: skip
    results = reproduce(tmp_path, settings=settings)
    loaded = ReproduceResults.load(tmp_path)
    assert [c.name for c in loaded.claims] == [c.name for c in results.claims]
    assert len(results.claims) == 5
    assert results.claims[-1].name == "energy: ANN counterpart (one step) / SpikeSR"
    for name in ("summary.md", "networks.json", "training_loss.png", "crops.png"):
        assert (tmp_path / name).is_file(), name
    table = json.loads((tmp_path / "networks.json").read_text())
    names = {"bicubic", "edsr", "ann_twin", "spikesr", "without_hda", "without_dsa", "ann_one_step"}
    assert set(table) == names
    assert table["spikesr"]["acs_g"] > 0
    assert table["ann_twin"]["acs_g"] == 0
