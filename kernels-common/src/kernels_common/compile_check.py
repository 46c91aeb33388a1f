"""What a workload's Triton kernels would use on an H100 / H200, found without a GPU.

Inside :func:`compile_only`, every Triton kernel launch is compiled for ``sm_90`` (the H100 and
H200) with each of its autotune configs, and is not run. The inputs may be
CPU tensors, so a workload can be traced on a machine with no GPU at the shapes it will have on
one: the launch wrappers choose their tiles exactly as they would there, and the glue between
launches runs on uninitialised outputs (nothing that depends on kernel results is meaningful).

Triton's own ``ptxas -v`` log of each kernel (its flags, so the numbers are those of the binary
it builds) gives its registers and spills. :class:`KernelResources` holds those, the shared
memory Triton allocates and the tensor-core instructions in the PTX: ``wgmma`` (Hopper's
warpgroup MMA) and ``mma.sync`` (the warp-level MMA of earlier chips, which Hopper also runs, at
a lower rate).

Compiling needs Triton's compiler, not its interpreter: under ``TRITON_INTERPRET=1``
(``@triton.jit`` then builds interpreted functions) use :func:`compile_workload`, which runs a
workload function in a fresh Python process without it.

This is a resource report, not a timing: it says whether a layout fits the chip, spills registers
or uses tensor cores, which is what a kernel's speed on the chip starts from.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kernels_common.backend import INTERPRET_ENV_VAR, interpreter_enabled

# sm_90 (H100, H200): the largest shared memory one block may use (227 KiB, opted in above 48 KiB)
# and the register file of one multiprocessor, by the CUDA programming guide's table for 9.0
SM90_SHARED_PER_BLOCK = 232_448
SM90_REGISTERS_PER_SM = 65_536
MAX_REGISTERS_PER_THREAD = 255


@dataclass(frozen=True)
class KernelResources:
    """One compiled kernel: its name, the compile-time constants it was specialised on (tile
    sizes among them), the launch options, and what it uses on the chip.

    ``spill_stores`` / ``spill_loads`` are bytes per thread moved to local memory because the
    registers ran out; ``wgmma`` / ``mma`` count the tensor-core instructions in the PTX (each
    is one instruction of the program text, not of the run)."""

    name: str
    constants: dict[str, Any]
    num_warps: int
    num_stages: int
    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    wgmma: int
    mma: int
    arch: int = 90

    @property
    def tensor_cores(self) -> bool:
        """Whether any product runs on tensor cores."""
        return self.wgmma + self.mma > 0

    @property
    def spills(self) -> bool:
        return self.spill_stores + self.spill_loads > 0

    @property
    def fits(self) -> bool:
        """Whether one block fits an sm_90 multiprocessor: its shared memory under the per-block
        limit and its registers under the register file."""
        threads = 32 * self.num_warps
        return (
            self.shared_bytes <= SM90_SHARED_PER_BLOCK
            and self.registers * threads <= SM90_REGISTERS_PER_SM
        )

    def label(self) -> str:
        """``name[A=1, B=2]``: the kernel and its integer / string constants, sorted."""
        shown = ", ".join(
            f"{key}={value}"
            for key, value in sorted(self.constants.items())
            if isinstance(value, int | str) and not isinstance(value, bool)
        )
        return f"{self.name}[{shown}]" if shown else self.name


def _ptxas_report(log: str) -> tuple[int, int, int]:
    """Registers, spill stores and spill loads (bytes) of the entry function, from the ``ptxas -v``
    log of Triton's own assembly of the kernel (its flags, so the numbers are the binary's)."""
    entry = log.split("Compiling entry function", 1)[-1]
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", entry)
    registers = re.search(r"Used (\d+) registers", entry)
    if spills is None or registers is None:
        raise RuntimeError(f"no ptxas -v report in Triton's compile log:\n{log}")
    return int(registers.group(1)), int(spills.group(1)), int(spills.group(2))


def _resources(name: str, constants: dict[str, Any], kernel: Any, log: str) -> KernelResources:
    ptx = kernel.asm["ptx"]
    registers, stores, loads = _ptxas_report(log)
    return KernelResources(
        name=name,
        constants=constants,
        num_warps=kernel.metadata.num_warps,
        num_stages=kernel.metadata.num_stages,
        registers=registers,
        spill_stores=stores,
        spill_loads=loads,
        shared_bytes=kernel.metadata.shared,
        wgmma=len(re.findall(r"\bwgmma\.mma_async\b", ptx)),
        mma=len(re.findall(r"\bmma\.sync\b", ptx)),
        arch=kernel.metadata.target.arch,
    )


class _CompileOnlyDriver:
    """The part of Triton's driver a compile-only launch asks for: a device, a stream and the
    target (no CUDA runtime is touched)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


def _plain(value: Any) -> Any:
    """A constant as JSON can carry it (Triton dtypes and other objects by their text)."""
    return value if isinstance(value, bool | int | float | str) or value is None else str(value)


@contextlib.contextmanager
def compile_only() -> Iterator[list[KernelResources]]:
    """Within the block, compile every Triton kernel launch for CUDA ``sm_90`` with each of its
    autotune configs, instead of running it; yield the list the distinct compiled kernels are
    appended to (in launch order).

    Autotuners compile all their configs (``prune_configs_by`` and config pre-hooks are not
    applied); ``triton.heuristics`` apply as they would at launch. Launches return ``None``.

    Raises:
        RuntimeError: the Triton interpreter is enabled (use :func:`compile_workload`).
    """
    if interpreter_enabled():
        raise RuntimeError(
            f"compile_only needs Triton's compiler; {INTERPRET_ENV_VAR} is set, so kernels are "
            "interpreted functions: use compile_workload, which runs in a process without it"
        )
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    found: list[KernelResources] = []
    seen: set[str] = set()
    jit_run, tune_run = JITFunction.run, Autotuner.run

    # each function's in-memory kernels, set aside while the block compiles for the target (they
    # may be for another device) and put back after it, so neither side sees the other's
    set_aside: dict[int, tuple[Any, Any]] = {}

    def compile_launch(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        if id(self) not in set_aside:
            set_aside[id(self)] = (self, self.device_caches)
            self.device_caches = collections.defaultdict(self.create_binder)
        # Triton prints its ptxas -v log when asked; every launch is compiled afresh so each has
        # one (a kernel already compiled in this block is reported once)
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            kernel = jit_run(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel.hash in seen:
            return
        seen.add(kernel.hash)
        names = [param.name for param in self.params]
        constants = {
            names[path[0]]: _plain(value)
            for path, value in kernel.src.constants.items()
            if len(path) == 1
        }
        found.append(_resources(self.fn.__name__, constants, kernel, log.getvalue()))

    def compile_configs(self: Any, *args: Any, **kwargs: Any) -> None:
        for config in self.configs:
            self.fn.run(*args, **kwargs, **config.all_kwargs())

    # the driver in force, if any (reading ``driver.active`` would create one, and on a machine
    # without a GPU there is none to create)
    previous = driver._active
    knobs_before = knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile
    driver.set_active(_CompileOnlyDriver(GPUTarget("cuda", 90, 32)))
    knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = True, True
    JITFunction.run, Autotuner.run = compile_launch, compile_configs
    try:
        yield found
    finally:
        JITFunction.run, Autotuner.run = jit_run, tune_run
        for function, caches in set_aside.values():
            function.device_caches = caches
        knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = knobs_before
        driver._active = previous


def _split(spec: str) -> tuple[str, str]:
    module, sep, function = spec.partition(":")
    if not sep or not module or not function:
        raise ValueError(f"a workload is 'package.module:function', got {spec!r}")
    return module, function


def compile_workload(spec: str, **kwargs: Any) -> list[KernelResources]:
    """Call the function ``spec`` (``"package.module:function"``) with ``kwargs`` (JSON values)
    under :func:`compile_only`, in a fresh Python process without the Triton interpreter, and
    return its kernels.

    Raises:
        ValueError: ``spec`` is not ``module:function``.
        RuntimeError: the process failed; its error output is in the message.
    """
    _split(spec)
    environment = {k: v for k, v in os.environ.items() if k != INTERPRET_ENV_VAR}
    command = [sys.executable, "-m", "kernels_common", "compile", spec,
               "--kwargs", json.dumps(kwargs), "--json", "--debug"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    if done.returncode:
        raise RuntimeError(f"compiling {spec} failed:\n{done.stderr[-4000:]}")  # the traceback
    # the JSON is the last line: whatever the workload printed comes before it
    return [KernelResources(**row) for row in json.loads(done.stdout.splitlines()[-1])]


def run_workload(spec: str, **kwargs: Any) -> list[KernelResources]:
    """:func:`compile_workload`'s work in this process (the interpreter must be off)."""
    module, name = _split(spec)
    function = getattr(importlib.import_module(module), name)
    with compile_only() as found:
        function(**kwargs)
    return found


def to_json(kernels: Sequence[KernelResources]) -> str:
    return json.dumps([asdict(kernel) for kernel in kernels])


def resources_table(kernels: Sequence[KernelResources], *, constants: Sequence[str] = ()) -> str:
    """A Markdown table, one row per kernel: the named ``constants`` (all integer and string
    ones when none are named), warps, stages, registers, spilled bytes, shared KiB and the
    tensor-core instruction kind."""

    def shown(kernel: KernelResources) -> str:
        if not constants:
            return kernel.label().removeprefix(kernel.name).strip("[]")
        return ", ".join(f"{c}={kernel.constants[c]}" for c in constants if c in kernel.constants)

    rows = [
        "| kernel | constants | warps | stages | registers | spills (B) | shared (KiB) "
        "| tensor cores |",
        "|---|---|--:|--:|--:|--:|--:|---|",
    ]
    for kernel in kernels:
        cores = ("wgmma" if kernel.wgmma else "mma.sync" if kernel.mma else "none") + (
            "" if kernel.fits else " (does not fit)"
        )
        rows.append(
            f"| {kernel.name} | {shown(kernel)} | {kernel.num_warps} | {kernel.num_stages} "
            f"| {kernel.registers} | {kernel.spill_stores} | {kernel.shared_bytes / 1024:.1f} "
            f"| {cores} |"
        )
    return "\n".join(rows)
