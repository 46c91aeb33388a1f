"""The per-layer choice of clipping method (flashdp.plan) and the host synchronisations of a
private step.

The plan is checked against its cost formulas written out by hand for known shapes (GPT-2
small on a GPU, small CPU shapes); the step's synchronisations are counted by wrapping every
Tensor method that reads device values on the host.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

import flashdp
from flashdp.plan import FLOPS_PER_BYTE, plan_linear
from kernels_common.testing import device_for_backend

MIB = 2**20


def test_gpt2_small_on_a_gpu_stores_the_mlp_and_recomputes_the_head():
    """T = 1024, B = 8, the default 256 MiB workspace on CUDA. The 768×3072 MLP weight: 28
    examples fit, one chunk; storing costs 200 flops per byte of (8 examples + 1 sum) × 8 bytes
    per weight element, 14,400 against the 16,384 of a second GEMM (2·B·T): store. The
    768×50257 head fits one example per chunk, so the sum's traffic is paid 8 times
    (25,600): recompute."""
    mlp = plan_linear(8, 1024, 768, 3072, clipping="per_layer", device="cuda", triton=True)
    weight = 768 * 3072
    gemm = 2.0 * 8 * 1024 * weight
    assert (256 * MIB) // (4 * weight) == 28
    assert dict(mlp.costs) == {
        "store": gemm + FLOPS_PER_BYTE["cuda"] * 8 * (8 + 1) * weight,
        "recompute": 2 * gemm,
    }
    assert (mlp.method, mlp.chunk) == ("store", 8)
    head = plan_linear(8, 1024, 768, 50257, clipping="per_layer", device="cuda", triton=True)
    assert (256 * MIB) // (4 * 768 * 50257) == 1
    assert head.method == "recompute"
    bigger = plan_linear(8, 1024, 768, 50257, clipping="per_layer", device="cuda", triton=True,
                         workspace_mb=2048)  # fmt: skip
    assert (bigger.method, bigger.chunk) == ("store", 8)


def test_one_token_per_example_takes_the_rank_one_norm_on_the_gpu():
    """T = 1 (pooled features): the rank-one norm costs 2·B·(D_in + D_out), far below a second
    GEMM or the workspace, and reads nothing from the device."""
    plan = plan_linear(64, 1, 768, 768, clipping="flat", device="cuda", triton=True)
    assert plan.method == "ghost"
    assert dict(plan.costs)["ghost"] == 2.0 * 64 * 768 * 768 + 2.0 * 64 * 1536


def test_short_sequences_on_a_gpu_recompute():
    """T = 128: a second GEMM (2·128 flops per element) is cheaper than the workspace (1600)."""
    plan = plan_linear(8, 128, 768, 3072, clipping="per_layer", device="cuda", triton=True)
    assert (plan.method, plan.chunk) == ("recompute", 0)


def test_flat_clipping_and_an_empty_workspace_never_store():
    for options in ({"clipping": "flat"}, {"clipping": "per_layer", "workspace_mb": 0}):
        plan = plan_linear(8, 1024, 768, 3072, device="cuda", triton=True, **options)
        assert plan.method == "recompute"
        assert "store" not in dict(plan.costs)
    # a weight larger than the workspace: not even one example fits
    plan = plan_linear(2, 4096, 4096, 4096, clipping="per_layer", device="cuda", triton=True,
                       workspace_mb=32)  # fmt: skip
    assert plan.method == "recompute"


def test_reference_path_weighs_the_gram_form():
    """On the CPU reference: Gram norm 2·B·T²·(D_in + D_out) against the stored GEMM's
    workspace 10·8·B·D_in·D_out; T = 1 is the rank-one form, nearly free."""
    assert (
        plan_linear(16, 128, 256, 256, clipping="per_layer", device="cpu", triton=False).method
        == "store"
    )
    assert (
        plan_linear(16, 1, 256, 256, clipping="per_layer", device="cpu", triton=False).method
        == "ghost"
    )
    flat = plan_linear(16, 128, 256, 256, clipping="flat", device="cpu", triton=False)
    gemm = 2.0 * 16 * 128 * 256 * 256
    assert dict(flat.costs) == {"ghost": gemm + 2.0 * 16 * 128 * 128 * 512}  # fmt: skip


def test_controller_reports_the_plan_of_the_last_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 40), nn.Tanh(), nn.Linear(40, 3))
    private = flashdp.make_private(
        model, max_grad_norm=1.0, noise_multiplier=0.0, backend="reference"
    )
    controller = flashdp.get_controller(private)
    assert controller.plan() == {}
    private[0](torch.randn(4, 64, 6)).sum().backward()  # a pass of the first layer alone
    assert sorted(controller.plan()) == ["0.weight"]
    private(torch.randn(4, 64, 6)).sum().backward()
    plans = controller.plan()
    assert sorted(plans) == ["0.weight", "2.weight"]
    for name, (d_in, d_out) in {"0.weight": (6, 40), "2.weight": (40, 3)}.items():
        expected = plan_linear(4, 64, d_in, d_out, clipping="per_layer", device="cpu", triton=False)
        assert plans[name] == expected


SYNCING = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__",
           "nonzero", "unique")  # fmt: skip
PACKAGE = str(Path(flashdp.__file__).parent)


@pytest.fixture
def host_reads(monkeypatch):
    """Every call, made directly from flashdp's code, of a Tensor method that reads device
    values on the host (a synchronisation on a GPU): (function, method) pairs."""
    calls: list[tuple[str, str]] = []
    for method in SYNCING:
        original = getattr(torch.Tensor, method)

        def wrapped(self, *args, _original=original, _method=method, **kwargs):
            caller = inspect.currentframe().f_back
            if caller.f_code.co_filename.startswith(PACKAGE):
                calls.append((caller.f_code.co_name, _method))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, wrapped)
    return calls


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
def test_a_private_gpt2_step_reads_the_device_once(clipping, triton_backend, host_reads):
    """A full private step of a small GPT-2 (embeddings, LayerNorm, Conv1D, LM head; forward,
    backward, noise, release) on the GPU path reads one value on the host: the finiteness flag
    of the pass, at its end."""
    transformers = pytest.importorskip("transformers")

    config = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                        tie_word_embeddings=False)  # fmt: skip
    device = device_for_backend(triton_backend)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(device)
    private = flashdp.make_private(
        model, max_grad_norm=1.0, noise_multiplier=1.0, clipping=clipping, backend=triton_backend
    )
    tokens = torch.randint(0, 40, (3, 12)).to(device)
    host_reads.clear()  # make_private's own checks are not part of the step
    for _ in range(2):
        private(tokens, labels=tokens).loss.backward()
    assert host_reads == [("_check_finite", "tolist")] * 2
    assert flashdp.get_controller(private).steps == 2


@pytest.mark.gpu
def test_a_private_step_on_cuda_synchronises_once_per_pass():
    """CUDA's own account (torch.cuda.set_sync_debug_mode): a private step of the benchmark's
    GPT in bf16 with the compiled kernels synchronises the host once per backward pass beyond
    what the same non-private step does."""
    import warnings

    from flashdp.tiny_gpt import GPTConfig, SequenceCrossEntropy, TinyGPT

    config = GPTConfig(vocab_size=64, seq_len=64, width=64, depth=2, heads=2)
    tokens = torch.randint(0, 64, (4, 64), device="cuda")
    loss_fn = SequenceCrossEntropy()

    def synchronisations(model) -> int:
        loss_fn(model(tokens), tokens).backward()  # warm-up: autotuning, lazy initialisation
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                loss_fn(model(tokens), tokens).backward()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    torch.manual_seed(0)
    baseline = synchronisations(TinyGPT(config).to("cuda", torch.bfloat16))
    torch.manual_seed(0)
    private = flashdp.make_private(
        TinyGPT(config).to("cuda", torch.bfloat16),
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        backend="triton",
    )
    assert synchronisations(private) == baseline + 1
