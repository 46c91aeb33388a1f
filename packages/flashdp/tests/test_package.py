"""Package-level checks: README example, lean import, CLI, Poisson sampling."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

import flashdp
from kernels_common.testing import import_footprint, markdown_python_blocks

README = Path(__file__).parents[1] / "README.md"
TORCHRUN_MARK = "# torchrun "  # a block that needs several processes (test_distributed.py)


def test_readme_example_runs():
    """Every Python block of the README in order, in one namespace, as a reader would."""
    namespace = {"__name__": "readme"}
    blocks = [b for b in markdown_python_blocks(README) if not b.startswith(TORCHRUN_MARK)]
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)


def test_import_does_not_load_triton_or_cuda():
    footprint = import_footprint("import torch, flashdp", watch=["triton"])
    assert not footprint["triton"], "triton imported"
    assert not footprint["cuda"]


def test_cli_help():
    from flashdp.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["reproduce", "--help"])
    assert exit_info.value.code == 0
    assert flashdp.__version__ == importlib.metadata.version("flashdp")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["bench", "--device", "cuda"], "no usable CUDA"),  # this torch build has no CUDA
        (["bench", "--device", "tpu"], "'tpu'"),  # not a device flashdp knows
        (["reproduce", "--out", "results.json"], "results.json"),  # the folder is a file
    ],
)
def test_cli_refuses_bad_arguments_in_one_line(argv, named, tmp_path, capsys, monkeypatch):
    from flashdp.__main__ import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only build
    (tmp_path / "results.json").write_text("{}")
    argv = [str(tmp_path / a) if a == "results.json" else a for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"flashdp {argv[0]}: error: argument")
    assert named in err
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_poisson_sampling_rate():
    """Each example is drawn with probability q, independently: over 200 batches of N = 500 at
    q = 0.05 the inclusion count of an example is Binomial(200, 0.05) (mean 10, sd 3.1); the mean
    over examples has sd 0.14, so ±0.6 is four standard errors."""
    sampler = flashdp.PoissonSampler(
        500, 0.05, steps=200, generator=torch.Generator().manual_seed(0)
    )
    counts = torch.zeros(500)
    sizes = []
    for batch in sampler:
        counts[batch] += 1
        sizes.append(len(batch))
        assert len(set(batch)) == len(batch)
    assert counts.mean().item() == pytest.approx(10.0, abs=0.6)
    assert counts.var().item() == pytest.approx(200 * 0.05 * 0.95, rel=0.25)
    assert sampler.expected_batch_size == 25
    assert min(sizes) < 25 < max(sizes)


def test_poisson_loader_empty_batches_and_bad_input():
    x = torch.arange(3.0)[:, None]
    loader = flashdp.PoissonLoader(
        (x,), sample_rate=0.01, steps=5, generator=torch.Generator().manual_seed(0)
    )
    shapes = [batch[0].shape for batch in loader]
    assert torch.Size([0, 1]) in shapes
    with pytest.raises(ValueError, match="first dimension"):
        flashdp.PoissonLoader((x, torch.zeros(4)), sample_rate=0.5)
    with pytest.raises(ValueError, match="sample_rate"):
        flashdp.PoissonSampler(10, 0.0)
