"""Side-by-side benchmarks of the chunkwise ops against ``mlstm-kernels`` and causal attention.

CPU (the issue's setting): fwd+bwd of our chunkwise op (PyTorch path) vs ``mlstm-kernels``'
``chunkwise--native_autograd`` (the baseline of the ratios) and ``parallel--native_autograd``, and
torch's causal SDPA, at B=1, NH=4, DQK=64, DV=128, float32. GPU: the paper's setting scaled to one
card, bf16, B*S = 65,536 tokens, NH=16, DQK=128, DV=256, our TFLA kernels vs the anchor's
``chunkwise--triton_xl_chunk`` (baseline) and SDPA (its flash kernel needs DQK = DV, so with
DQK = 128 != DV = 256 PyTorch picks the memory-efficient or math kernel), forward and fwd+bwd.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels_common.bench import Comparison, compare, drop_failing
from tfla_mlstm.ops import mlstm_chunkwise, mlstmsig_chunkwise

LOGGER = logging.getLogger(__name__)
PEER = "mlstm-kernels"
CPU_SEQ_LENS = (512, 2048, 8192)
GPU_SEQ_LENS = (2048, 8192, 32768)
# the anchor's quadratic kernel holds several (S, S) matrices per head: above this it is skipped
MAX_PARALLEL_S = 4096


def peer_available() -> bool:
    return importlib.util.find_spec("mlstm_kernels") is not None


def make_inputs(B, NH, S, DQK, DV, dtype, device, seed=0) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device).manual_seed(seed)

    def randn(*shape: int, shift: float = 0.0) -> torch.Tensor:
        x = torch.randn(*shape, generator=generator, device=device) + shift
        return x.to(dtype).requires_grad_()

    return {
        "q": randn(B, NH, S, DQK),
        "k": randn(B, NH, S, DQK),
        "v": randn(B, NH, S, DV),
        "i": randn(B, NH, S),
        "f": randn(B, NH, S, shift=3.0),
    }


ANCHOR_KERNELS = {
    "mlstm": "chunkwise--triton_xl_chunk",
    "mlstmsig": "chunkwise--triton_xl_chunk_siging",
}


def kernel_workload(
    dtype: str = "bfloat16",
    variant: str = "mlstm",
    anchor: bool = False,
    S: int = 512,
    DQK: int = 128,
    DV: int = 256,
    chunk_size: int = 128,
) -> None:
    """One forward and backward pass of our TFLA kernels (or, with ``anchor``, of
    ``mlstm-kernels``' ``triton_xl_chunk`` / ``_siging`` kernels) on CPU tensors, B = 1, NH = 2:
    the workload ``kernels_common.compile_check`` compiles for a GPU without running it. The
    tiles depend on the head dimensions, chunk size and dtype, not on B, NH or S."""
    from tfla_mlstm.autograd import tfla_chunkwise
    from tfla_mlstm.ops import _run
    from tfla_mlstm.variant import MLSTM, mlstmsig

    if variant not in ANCHOR_KERNELS:
        raise ValueError(f"variant must be one of {sorted(ANCHOR_KERNELS)}, got {variant!r}")
    inputs = make_inputs(1, 2, S, DQK, DV, getattr(torch, dtype), "cpu")
    if anchor:
        from mlstm_kernels.torch import get_mlstm_kernel

        h = get_mlstm_kernel(ANCHOR_KERNELS[variant])(**inputs, chunk_size=chunk_size)
    else:  # the public ops' own path, with the Triton form whatever the tensors' device
        chosen = MLSTM if variant == "mlstm" else mlstmsig(normalize=True)
        h = _run(tfla_chunkwise, **inputs, initial_state=None, return_last_state=False,
                 variant=chosen, eps=1e-6, chunk_size=chunk_size)  # fmt: skip
    h.float().sum().backward()


def sdpa(q, k, v, i, f):
    """Causal softmax attention on the same q, k, v (gates unused): the Transformer's kernel."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _run(fn: Callable, inputs: dict, grad: torch.Tensor | None, names: str) -> object:
    """Forward (``grad=None``) or fwd+bwd returning the input gradients; keeps no state."""
    if grad is None:
        with torch.no_grad():
            return fn(**inputs)
    out = fn(**inputs)
    return torch.autograd.grad(out, [inputs[n] for n in names], grad)


def candidates_cpu() -> dict[str, Callable]:
    found = {
        "tfla-mlstm chunkwise (reference, L=64)": functools.partial(
            mlstm_chunkwise, chunk_size=64, backend="reference"
        ),
        "tfla-mlstm mLSTMsig chunkwise (reference, L=64)": functools.partial(
            mlstmsig_chunkwise, chunk_size=64, backend="reference"
        ),
        "torch SDPA causal": sdpa,
    }
    if peer_available():
        from mlstm_kernels.torch import get_mlstm_kernel

        found[f"{PEER} chunkwise--native_autograd (L=64)"] = functools.partial(
            get_mlstm_kernel("chunkwise--native_autograd"), chunk_size=64
        )
        found[f"{PEER} parallel--native_autograd"] = get_mlstm_kernel("parallel--native_autograd")
    else:
        LOGGER.warning("%s is not installed: pip install 'tfla-mlstm[bench]'", PEER)
    return found


def candidates_gpu() -> dict[str, Callable]:
    found = {
        "tfla-mlstm TFLA (L=128)": functools.partial(mlstm_chunkwise, chunk_size=128),
        "tfla-mlstm TFLA mLSTMsig (L=128)": functools.partial(mlstmsig_chunkwise, chunk_size=128),
        "torch SDPA causal": sdpa,
    }
    if peer_available():
        from mlstm_kernels.torch import get_mlstm_kernel

        found[f"{PEER} chunkwise--triton_xl_chunk (L=128)"] = functools.partial(
            get_mlstm_kernel("chunkwise--triton_xl_chunk"), chunk_size=128
        )
        found[f"{PEER} chunkwise--triton_xl_chunk_siging (L=128)"] = functools.partial(
            get_mlstm_kernel("chunkwise--triton_xl_chunk_siging"), chunk_size=128
        )
    return found


def run(
    device: str,
    out: Path | None,
    seq_lens: Sequence[int] | None = None,
    repeat: int = 5,
    exclude: Sequence[str] = (),
) -> list[Comparison]:
    """Benchmark every sequence length; save ``<out>/chunkwise_<device>_S<S>_<mode>.{json,md}``.

    ``exclude``: candidates whose name contains any of these strings are left out (a peer whose
    compiler aborts the process on this machine cannot be dropped from inside it).
    """
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda:
        setting = {"B_times_S": 65536, "NH": 16, "DQK": 128, "DV": 256, "dtype": torch.bfloat16}
        candidates, modes = candidates_gpu(), ("fwd", "fwd+bwd")
    else:
        setting = {"B": 1, "NH": 4, "DQK": 64, "DV": 128, "dtype": torch.float32}
        candidates, modes = candidates_cpu(), ("fwd+bwd",)
    candidates = {n: f for n, f in candidates.items() if not any(e in n for e in exclude)}
    if not candidates:
        raise ValueError(f"exclude={list(exclude)} leaves no candidate")
    baseline = next((n for n in candidates if n.startswith(PEER)), next(iter(candidates)))
    tables = []
    for S in seq_lens or (GPU_SEQ_LENS if on_cuda else CPU_SEQ_LENS):
        B = setting["B_times_S"] // S if on_cuda else setting["B"]
        NH, DQK, DV, dtype = setting["NH"], setting["DQK"], setting["DV"], setting["dtype"]
        inputs = make_inputs(B, NH, S, DQK, DV, dtype, device)
        grad = torch.randn(B, NH, S, DV, device=device, dtype=dtype)
        chosen = {
            name: fn
            for name, fn in candidates.items()
            if on_cuda or "parallel" not in name or S <= MAX_PARALLEL_S
        }
        for mode in modes:
            names = "qkv" if "SDPA" in baseline else "qkvif"
            title = (
                f"mLSTM {mode}, B={B} NH={NH} S={S} DQK={DQK} DV={DV} "
                f"{str(dtype).removeprefix('torch.')}"
            )
            calls = {
                name: functools.partial(
                    _run, fn, inputs, grad if mode == "fwd+bwd" else None,
                    "qkv" if "SDPA" in name else names,
                )
                for name, fn in chosen.items()
            }  # fmt: skip
            calls, failed = drop_failing(calls)  # the first call is each one's warm-up
            for name, why in failed.items():
                LOGGER.warning("skipping %s on %s: %s", name, title, why)
            if not calls:
                raise RuntimeError(f"every candidate failed on {title}: {failed}")
            # the ratios are quoted against the anchor; if it cannot run, against our first kernel
            base = baseline if baseline in calls else next(iter(calls))
            LOGGER.info("benchmarking %s", title)
            table = compare(
                calls, baseline=base, title=title, device=device, repeat=repeat,
                warmup=1, check_outputs=False,
            )  # fmt: skip
            print(table)
            if out is not None:
                table.save(out, f"chunkwise_{torch.device(device).type}_S{S}_{mode}")
            tables.append(table)
    return tables
