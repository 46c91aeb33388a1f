"""Gated delta rule forward + backward: jet-nemotron vs FLA vs causal attention, side by side.

CPU: B=1, H=4, K=V=128, float32, T in {512, 2048, 8192}: our chunked PyTorch form vs FLA's
PyTorch chunked form ``naive_chunk_gated_delta_rule`` (the baseline of the ratios; FLA's Triton
kernels need a GPU), our step-by-step recurrence (T <= 2048) and torch's causal SDPA on the same
q, k, v. GPU: bf16, B·T = 32,768 tokens, H=16, K=V=128, T in {2048, 8192, 32768}: our Triton
chunk kernels vs FLA's ``chunk_gated_delta_rule`` (baseline) and SDPA, forward and fwd+bwd.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from jet_nemotron.ops.gated_delta import chunk_gated_delta_rule, naive_recurrent_gated_delta_rule
from kernels_common.bench import Comparison, compare, drop_failing

LOGGER = logging.getLogger(__name__)
PEER = "FLA"
CPU_SEQ_LENS = (512, 2048, 8192)
GPU_SEQ_LENS = (2048, 8192, 32768)
MAX_RECURRENT_T = 2048  # the step-by-step loop is only a reference: it is left out beyond


def peer_available() -> bool:
    return importlib.util.find_spec("fla") is not None


def _fla(name: str) -> Callable:
    """Import an FLA op; FLA warns at import on machines without a Triton GPU backend."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "naive_chunk":
            from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule as op
        else:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as op
    return op


def make_inputs(B, T, H, K, V, dtype, device, seed=0) -> dict[str, torch.Tensor]:
    """FLA's test distribution: L2-normalised k, ``g = logsigmoid(rand)``, ``β = σ(rand)``."""
    generator = torch.Generator(device).manual_seed(seed)

    def rand(*shape: int, normal: bool = True) -> torch.Tensor:
        make = torch.randn if normal else torch.rand
        return make(*shape, generator=generator, device=device)

    inputs = {
        "q": rand(B, T, H, K),
        "k": F.normalize(rand(B, T, H, K), dim=-1),
        "v": rand(B, T, H, V),
        "g": F.logsigmoid(rand(B, T, H, normal=False)),
        "beta": rand(B, T, H, normal=False).sigmoid(),
    }
    return {
        n: x.to(dtype if n in ("q", "k", "v") else torch.float32).requires_grad_()
        for n, x in inputs.items()
    }


def _attention(q, k, v, g, beta):
    """Causal softmax attention on the same q, k, v ((B, T, H, D) -> (B, H, T, D))."""
    out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True)
    return out.transpose(1, 2)


def _first(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def call(**inputs):
        out = fn(**inputs)
        return out[0] if isinstance(out, tuple) else out

    return call


def _run(fn: Callable, inputs: dict, grad: torch.Tensor | None, names: tuple[str, ...]) -> object:
    if grad is None:
        with torch.no_grad():
            return fn(**inputs)
    out = fn(**inputs)
    return torch.autograd.grad(out, [inputs[n] for n in names], grad)


def candidates(on_cuda: bool) -> dict[str, Callable]:
    found: dict[str, Callable] = {}
    if on_cuda:
        found["jet-nemotron chunk (Triton, C=64)"] = _first(chunk_gated_delta_rule)
        if peer_available():
            found[f"{PEER} chunk_gated_delta_rule (Triton)"] = _first(_fla("chunk"))
    else:
        found["jet-nemotron chunk (PyTorch, C=64)"] = _first(
            functools.partial(chunk_gated_delta_rule, backend="reference")
        )
        if peer_available():
            found[f"{PEER} naive_chunk_gated_delta_rule (PyTorch, C=64)"] = _first(
                _fla("naive_chunk")
            )
        found["jet-nemotron naive recurrent"] = _first(naive_recurrent_gated_delta_rule)
    if not peer_available():
        LOGGER.warning("%s is not installed: pip install 'jet-nemotron[bench]'", PEER)
    found["torch SDPA causal"] = _attention
    return found


def run(
    device: str, out: Path | None, seq_lens: Sequence[int] | None = None, repeat: int = 5
) -> list[Comparison]:
    """Benchmark every sequence length; save ``<out>/gdn_<device>_T<T>_<mode>.{json,md}``."""
    on_cuda = torch.device(device).type == "cuda"
    H, K, V = (16, 128, 128) if on_cuda else (4, 128, 128)
    dtype = torch.bfloat16 if on_cuda else torch.float32
    modes = ("fwd", "fwd+bwd") if on_cuda else ("fwd+bwd",)
    found = candidates(on_cuda)
    baseline = next((n for n in found if n.startswith(PEER)), next(iter(found)))
    tables = []
    for T in seq_lens or (GPU_SEQ_LENS if on_cuda else CPU_SEQ_LENS):
        B = 32768 // T if on_cuda else 1
        inputs = make_inputs(B, T, H, K, V, dtype, device)
        grad = torch.randn(B, T, H, V, device=device, dtype=dtype)
        chosen = {n: f for n, f in found.items() if "recurrent" not in n or T <= MAX_RECURRENT_T}
        for mode in modes:
            title = f"gated delta rule {mode}, B={B} T={T} H={H} K={K} V={V} {str(dtype)[6:]}"
            calls = {
                name: functools.partial(
                    _run, fn, inputs, grad if mode == "fwd+bwd" else None,
                    ("q", "k", "v") if "SDPA" in name else ("q", "k", "v", "g", "beta"),
                )
                for name, fn in chosen.items()
            }  # fmt: skip
            calls, failed = drop_failing(calls)
            for name, why in failed.items():
                LOGGER.warning("skipping %s on %s: %s", name, title, why)
            if not calls:
                raise RuntimeError(f"every candidate failed on {title}: {failed}")
            base = baseline if baseline in calls else next(iter(calls))
            LOGGER.info("benchmarking %s", title)
            table = compare(
                calls, baseline=base, title=title, device=device, repeat=repeat, warmup=1,
                check_outputs=False,
            )  # fmt: skip
            print(table)
            if out is not None:
                table.save(out, f"gdn_{torch.device(device).type}_T{T}_{mode}")
            tables.append(table)
    return tables
