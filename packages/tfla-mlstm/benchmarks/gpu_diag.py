"""Where the time and memory of our TFLA kernels go against mlstm-kernels' TFLA, on one GPU.

    python packages/tfla-mlstm/benchmarks/gpu_diag.py --out DIR [--deadline SECONDS]

bf16, NH=16, DQK=128, DV=256, chunk 128 (the GPU benchmark's setting). Sections in order of
value, each skipped when the deadline is near; ``DIR/diag.json`` is rewritten after every section
and ``DIR/profile_<name>.txt`` holds each profiled call's kernel table:

1. the whole op at S=8192 (B=8): median time of forward and forward + backward, peak memory of
   each above what was allocated before, and the memory held between forward and backward, for
   our mLSTMsig and mLSTM and the anchor's ``chunkwise--triton_xl_chunk_siging``;
2. one profiled forward + backward of each: GPU time in our Triton kernels (or the anchor's)
   against everything else (PyTorch glue), and the number of launches;
3. each of our kernels alone at S=8192 with the default layouts, and the gate gradients' PyTorch
   ops alone;
4. the chunk-state kernels (forward and ``dC``) at S=32768 (B=2, 32 batch-heads, so few programs)
   under several tile layouts ``(steps, DQK, DV, warps, stages)``, the default first;
5. the backward's level-2 kernels (dq, dk + dv, normalizer) at S=8192 (B=8) under several tile
   layouts, the default first;
6. our mLSTM's forward + backward per chunk size (128, 256, 64) at S=8192, 32768, 2048.

It reads the package's private kernel launchers (``tfla_mlstm.kernels``), so it follows them.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from triton.testing import do_bench

from tfla_mlstm import mlstm_chunkwise, mlstmsig_chunkwise
from tfla_mlstm.autograd import _flat, _forward_states, _gate_gradients
from tfla_mlstm.kernels.backward import (
    chunk_states_backward,
    kv_backward,
    normalizer_backward,
    q_backward,
)
from tfla_mlstm.kernels.forward import chunk_output, chunk_states
from tfla_mlstm.kernels.tiles import Tiles
from tfla_mlstm.variant import MLSTM

DEVICE, NH, DQK, DV, L, DTYPE = "cuda", 16, 128, 256, 128, torch.bfloat16
OURS = ("_chunk_", "_normalizer_grad", "_dq_kernel", "_dk_kernel", "_dv_kernel")
ANCHOR = ("mlstm_siging_chunkwise", "_mlstm_chunkwise")


class Diagnosis:
    """Runs sections under a deadline and keeps their results in one JSON file."""

    def __init__(self, out: Path, deadline_s: float) -> None:
        self.out = out
        self.end = time.time() + deadline_s
        self.results: dict = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
        }
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.end - time.time()

    def section(self, name: str, needs_s: float, run: Callable[[], None]) -> None:
        if self.left() < needs_s:
            self.results[name] = f"skipped: {self.left():.0f} s left"
        else:
            start = time.time()
            try:
                run()
            except Exception:  # one failing section must not lose the others
                self.results[f"{name}_error"] = traceback.format_exc()[-3000:]
            print(f"[{name}] {time.time() - start:.0f} s, {self.left():.0f} s left", flush=True)
        (self.out / "diag.json").write_text(json.dumps(self.results, indent=1, default=str))


def candidates() -> dict[str, Callable]:
    found = {
        "ours_sig": functools.partial(mlstmsig_chunkwise, chunk_size=L),
        "ours_mlstm": functools.partial(mlstm_chunkwise, chunk_size=L),
    }
    try:
        from mlstm_kernels.torch import get_mlstm_kernel
    except ImportError as error:  # our own kernels are still timed
        print(f"anchor unavailable ({error}): timing ours only", flush=True)
        return found
    found["anchor_siging"] = functools.partial(
        get_mlstm_kernel("chunkwise--triton_xl_chunk_siging"), chunk_size=L
    )
    return found


def make(B: int, S: int, grad: bool = True) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    generator = torch.Generator(DEVICE).manual_seed(0)

    def randn(*shape: int, shift: float = 0.0) -> torch.Tensor:
        x = torch.randn(*shape, generator=generator, device=DEVICE) + shift
        return x.to(DTYPE).requires_grad_(grad)

    inputs = {
        "q": randn(B, NH, S, DQK),
        "k": randn(B, NH, S, DQK),
        "v": randn(B, NH, S, DV),
        "i": randn(B, NH, S),
        "f": randn(B, NH, S, shift=3.0),
    }
    return inputs, torch.randn(B, NH, S, DV, generator=generator, device=DEVICE).to(DTYPE)


def forward(fn: Callable, x: dict) -> object:
    with torch.no_grad():
        return fn(**x)


def forward_backward(fn: Callable, x: dict, dh: torch.Tensor) -> object:
    return torch.autograd.grad(fn(**x), [x[n] for n in "qkvif"], dh)


def bench(fn: Callable) -> float:
    fn()
    torch.cuda.synchronize()
    return round(do_bench(fn, warmup=10, rep=50, return_mode="median"), 3)


def whole_op(diag: Diagnosis, B: int, S: int) -> None:
    x, dh = make(B, S)
    table = diag.results.setdefault("whole_op", {})
    for name, fn in candidates().items():
        for mode in ("fwd", "fwd+bwd"):
            call = functools.partial(forward, fn, x)
            if mode == "fwd+bwd":
                call = functools.partial(forward_backward, fn, x, dh)
            ms = bench(call)
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            held = None
            if mode == "fwd":
                out = forward(fn, x)
            else:
                out = fn(**x)
                torch.cuda.synchronize()
                held = round((torch.cuda.memory_allocated() - base) / 2**20)
                torch.autograd.grad(out, [x[n] for n in "qkvif"], dh)
            del out
            torch.cuda.synchronize()
            peak = round((torch.cuda.max_memory_allocated() - base) / 2**20)
            table[f"S{S}/{mode}/{name}"] = {"ms": ms, "peak_MiB": peak, "held_MiB": held}
            print(f"S{S}/{mode}/{name}", table[f"S{S}/{mode}/{name}"], flush=True)


def profile(diag: Diagnosis) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    x, dh = make(8, 8192)
    for name, fn in candidates().items():
        forward_backward(fn, x, dh)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            forward_backward(fn, x, dh)
            torch.cuda.synchronize()
        rows = []
        for event in prof.key_averages():
            us = getattr(event, "self_device_time_total", 0)
            if us:
                rows.append((round(us / 1000, 3), event.count, event.key[:100]))
        rows.sort(reverse=True)
        kernels = OURS if name.startswith("ours") else ANCHOR
        diag.results.setdefault("profile_fwd+bwd", {})[name] = {
            "gpu_ms": round(sum(r[0] for r in rows), 3),
            "triton_kernels_ms": round(
                sum(r[0] for r in rows if any(s in r[2] for s in kernels)), 3
            ),
            "launches": sum(r[1] for r in rows),
            "top": rows[:10],
        }
        text = "\n".join(f"{ms:9.3f} ms x{count:<4d} {key}" for ms, count, key in rows)
        (diag.out / f"profile_{name}.txt").write_text(text + "\n")


def prepared(B: int, S: int) -> dict:
    """Every tensor our kernels take, for the mLSTM with the default bf16 layouts."""
    x, dh = make(B, S, grad=False)
    BH = B * NH
    qf, kf, vf, dhf = (_flat(t) for t in (x["q"], x["k"], x["v"], dh))
    initial = (
        torch.zeros(B, NH, DQK, DV, device=DEVICE),
        torch.zeros(B, NH, DQK, device=DEVICE),
        torch.full((B, NH, 1), float("-inf"), device=DEVICE),
    )
    tiles = Tiles.choose(L, DQK, DV, DTYPE)
    states_layout = Tiles.choose(L, DQK, DV, DTYPE, kernel="states")
    gates, (C, n) = _forward_states(kf, vf, x["i"], x["f"], initial, MLSTM, L, states_layout)
    h = torch.empty(BH, S, DV, device=DEVICE, dtype=DTYPE)
    options = {"chunk_size": L, "stabilized": True}
    den, z = chunk_output(
        qf, kf, vf, gates[:-1], (C, n, gates[-1]), h, eps=1e-6, normalize=True, tiles=tiles,
        **options,
    )  # fmt: skip
    backward_tiles = Tiles.choose(L, DQK, DV, DTYPE, kernel="gradients")
    dz, _ = normalizer_backward(
        qf, kf, vf, dhf, gates, (den, z), C, tiles=backward_tiles, **options
    )
    d_last = (torch.zeros(BH, DQK * DV, device=DEVICE), torch.zeros(BH, DQK, device=DEVICE))
    dC, dn = chunk_states_backward(
        qf, dhf, gates, den, dz, d_last, chunk_size=L, tiles=states_layout
    )
    return {
        "x": x, "qf": qf, "kf": kf, "vf": vf, "dhf": dhf, "initial": initial, "gates": gates,
        "C": C, "n": n, "h": h, "den": den, "z": z, "dz": dz, "d_last": d_last, "dC": dC, "dn": dn,
        "tiles": tiles, "backward_tiles": backward_tiles, "state_tiles": states_layout,
    }  # fmt: skip


def launches(P: dict) -> dict[str, Callable[[Tiles], object]]:
    """Each kernel launcher on the prepared tensors, for any tile layout."""
    per_head = [t.reshape(P["qf"].shape[0], -1) for t in P["initial"]]
    _, a, g, _, m_chunk = P["gates"]
    a_max = a.view(a.shape[0], -1, L).amax(-1).contiguous()
    dq = torch.empty_like(P["qf"])
    dk, dv = torch.empty_like(P["kf"]), torch.empty_like(P["vf"])
    common = {"chunk_size": L}
    return {
        "states": lambda T: chunk_states(
            P["kf"], P["vf"], a, g, a_max, per_head, stabilized=True, tiles=T, **common
        ),
        "output": lambda T: chunk_output(
            P["qf"], P["kf"], P["vf"], P["gates"][:-1], (P["C"], P["n"], m_chunk), P["h"],
            eps=1e-6, stabilized=True, normalize=True, tiles=T, **common,
        ),
        "normalizer": lambda T: normalizer_backward(
            P["qf"], P["kf"], P["vf"], P["dhf"], P["gates"], (P["den"], P["z"]), P["C"],
            stabilized=True, tiles=T, **common,
        ),
        "dq": lambda T: q_backward(
            P["qf"], P["kf"], P["vf"], P["dhf"], P["gates"], P["den"], P["dz"],
            (P["C"], P["n"]), dq, tiles=T, **common,
        ),
        "states_bwd": lambda T: chunk_states_backward(
            P["qf"], P["dhf"], P["gates"], P["den"], P["dz"], P["d_last"], tiles=T, **common
        ),
        "dk+dv": lambda T: kv_backward(
            P["qf"], P["kf"], P["vf"], P["dhf"], P["gates"], P["den"], P["dz"],
            (P["dC"], P["dn"]), (dk, dv), tiles=T, **common,
        ),
    }  # fmt: skip


def layout_of(P: dict, name: str) -> Tiles:
    """The default layout of the kernel ``name`` of :func:`launches`."""
    if name.startswith("states"):
        return P["state_tiles"]
    return P["tiles"] if name == "output" else P["backward_tiles"]


def kernels_alone(diag: Diagnosis) -> None:
    P = prepared(8, 8192)
    table = diag.results.setdefault("kernels_ms_S8192", {})
    for name, launch in launches(P).items():
        table[name] = bench(functools.partial(launch, layout_of(P, name)))
    B, S = 8, 8192
    rows = [torch.randn(B, NH, S, device=DEVICE) for _ in range(2)]
    i, f = P["x"]["i"], P["x"]["f"]
    m0 = torch.zeros(B, NH, 1, device=DEVICE)
    table["gate_gradients (torch)"] = bench(
        lambda: _gate_gradients(
            *rows, i, f, m0, MLSTM, torch.zeros(B, NH, device=DEVICE), rows[0], m0
        )
    )
    print(table, flush=True)


# (steps, DQK, DV, warps, stages); ``None`` stands for the default layout of the pass
# the previous 16-bit state layouts (forward, then the backward's recompute) come first
STATE_LAYOUTS = [
    None,
    (64, 128, 128, 4, 2),
    (32, 128, 128, 4, 2),
    (64, 64, 64, 4, 2),
    (128, 64, 128, 4, 1),
]


# the backward's level-2 layouts (dq, dk+dv, normalizer; one layout for all), the default first:
# 64-step blocks are the row count of Hopper's warpgroup MMA (the default's 32 fall back to
# mma.sync), and the four others compile for sm_90 to wgmma without spilling (the mLSTM timed
# here, and the mLSTMsig; benchmarks/compile_sm90.py)
GRADIENT_LAYOUTS = [
    None,
    (64, 128, 128, 8, 1),
    (64, 128, 64, 4, 1),
    (64, 64, 128, 4, 1),
    (64, 64, 64, 4, 1),
]


def sweep(diag: Diagnosis, P: dict, table: dict, names, layouts) -> None:
    """Each layout for every kernel of ``names`` (a layout is timed on all of them before the
    next starts), until the deadline is near."""
    calls = launches(P)
    for layout in layouts:
        for name in names:
            if diag.left() < 15:
                return
            default = layout_of(P, name)
            tiles = default if layout is None else Tiles(*layout[:3], "tf32", *layout[3:])
            key = f"{name}/{'default' if layout is None else layout}"
            try:
                table[key] = bench(functools.partial(calls[name], tiles))
            except Exception as error:  # a layout that does not fit is a result
                table[key] = f"failed: {error!r}"[:300]
            print(key, table[key], flush=True)


def state_tiles(diag: Diagnosis) -> None:
    table = diag.results.setdefault("state_kernels_ms_S32768", {})
    sweep(diag, prepared(2, 32768), table, ("states", "states_bwd"), STATE_LAYOUTS)


def gradient_tiles(diag: Diagnosis) -> None:
    table = diag.results.setdefault("gradient_kernels_ms_S8192", {})
    sweep(diag, prepared(8, 8192), table, ("dq", "dk+dv", "normalizer"), GRADIENT_LAYOUTS)


def chunk_sizes(diag: Diagnosis) -> None:
    """Our mLSTM's forward + backward time and peak memory per chunk size at B·S = 65,536, to
    check ``default_chunk_size`` (the anchor's choice) on our kernels. A new chunk size compiles
    every kernel again, so one starts only with 25 s left."""
    table = diag.results.setdefault("chunk_sizes_fwd+bwd", {})
    for S in (8192, 32768, 2048):
        x, dh = make(65536 // S, S)
        for chunk in (128, 256, 64):
            if diag.left() < 25:
                return
            call = functools.partial(
                forward_backward, functools.partial(mlstm_chunkwise, chunk_size=chunk), x, dh
            )
            ms = bench(call)
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            call()
            torch.cuda.synchronize()
            peak = round((torch.cuda.max_memory_allocated() - base) / 2**20)
            table[f"S{S}/L{chunk}"] = {"ms": ms, "peak_MiB": peak}
            print(f"S{S}/L{chunk}", table[f"S{S}/L{chunk}"], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/gpu/tfla-diag"))
    parser.add_argument("--deadline", type=float, default=140.0, help="seconds for all sections")
    args = parser.parse_args()
    diag = Diagnosis(args.out, args.deadline)
    diag.section("whole_op_S8192", 30, lambda: whole_op(diag, 8, 8192))
    diag.section("profile", 15, lambda: profile(diag))
    diag.section("kernels_alone", 15, lambda: kernels_alone(diag))
    diag.section("state_tiles", 20, lambda: state_tiles(diag))
    diag.section("gradient_tiles", 20, lambda: gradient_tiles(diag))
    diag.section("chunk_sizes", 20, lambda: chunk_sizes(diag))
    print(json.dumps(diag.results, indent=1, default=str)[:6000])


if __name__ == "__main__":
    main()
