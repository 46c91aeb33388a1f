"""Starting replicas: a local launcher (spawned processes sharing a file store) and torchrun.

``launch_local(fn, nprocs, args)`` spawns ``nprocs`` processes, initialises the default process
group in each (gloo on CPU, NCCL when ``backend="nccl"``, one GPU per rank) through a
``FileStore`` in a fresh temporary folder (no port to race for), calls ``fn(rank, world_size,
*args)`` and returns the per-rank results. If any worker dies, the others are terminated and
:class:`WorkerFailed` is raised, so a killed replica ends the whole job (as torchrun does); resume
from the last checkpoint by launching again.

Under ``torchrun`` call :func:`init_from_env` in the script instead.
"""

from __future__ import annotations

import datetime as dt
import os
import queue as queue_module
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["WorkerFailed", "init_from_env", "launch_local"]

BACKENDS = ("gloo", "nccl")


class WorkerFailed(RuntimeError):
    """A replica exited with a non-zero code (the job was stopped).

    ``rank`` is the root cause: a replica that died without raising, else the one whose exception
    was raised earliest (its peers then fail in a collective, as a consequence).
    ``also_failed`` lists the ranks that failed after it.
    """

    def __init__(
        self,
        rank: int,
        exitcode: int,
        traceback_text: str | None = None,
        also_failed: Sequence[int] = (),
    ) -> None:
        message = f"replica {rank} exited with code {exitcode}; the other replicas were stopped"
        if also_failed:
            message += f" (replicas {sorted(also_failed)} failed after it)"
        if traceback_text:
            message += f"\n--- replica {rank} raised ---\n{traceback_text}"
        super().__init__(message)
        self.rank, self.exitcode, self.traceback = rank, exitcode, traceback_text
        self.also_failed = tuple(sorted(also_failed))


class _Raised:
    """What a replica puts on the result queue when ``fn`` raised: the traceback and when."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.time = time.time()


FAILURE_GRACE_S = 2.0  # how long the peers of a failed replica get to report their own failure


def _first_failure(
    failed: dict[int, int], collected: dict[int, Any]
) -> tuple[int, int, str | None]:
    """The root cause among the failed replicas ``{rank: exitcode}``: a replica that died without
    raising (killed, ``os._exit``, out of memory: nothing a peer does causes that), else the one
    that raised first (its peers then raise in a collective), ties by rank."""

    def order(rank: int) -> tuple[int, float, int]:
        raised = collected.get(rank)
        if not isinstance(raised, _Raised):
            return (0, 0.0, rank)
        return (1, raised.time, rank)

    rank = min(failed, key=order)
    raised = collected.get(rank)
    return rank, failed[rank], raised.text if isinstance(raised, _Raised) else None


def _worker(rank, world_size, store_path, backend, timeout_s, threads, fn, args, results):
    torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=timeout_s),
    )
    try:
        try:
            value = fn(rank, world_size, *args)
        except BaseException:
            results.put((rank, _Raised(traceback.format_exc())))
            raise
        results.put((rank, value))
    finally:
        dist.destroy_process_group()


def launch_local(
    fn: Callable[..., Any],
    nprocs: int,
    args: Sequence[Any] = (),
    *,
    backend: str = "gloo",
    timeout_s: float = 600.0,
    threads_per_process: int = 1,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` new processes; return results by rank.

    ``fn`` must be importable (a module-level function) and its return value picklable.
    ``start_method`` defaults to ``"forkserver"`` where available (a clean server process that
    imports torch and ``fn``'s module once, then forks the replicas of this and later launches:
    much faster than ``"spawn"``, without forking a parent that may hold threads) and
    ``"spawn"`` elsewhere.
    """
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive integer, got {nprocs!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < 1:
        raise ValueError("backend 'nccl' needs CUDA devices; use 'gloo' on CPU")
    methods = mp.get_all_start_methods()
    method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
    if method not in methods:
        raise ValueError(f"start_method must be one of {methods}, got {method!r}")
    context = mp.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(["torch", "torch.distributed", fn.__module__])
    results = context.Queue()
    folder = Path(tempfile.mkdtemp(prefix="scaling-laws-store-"))
    processes = []
    try:
        for rank in range(nprocs):
            process = context.Process(
                target=_worker,
                args=(
                    rank,
                    nprocs,
                    str(folder / "store"),
                    backend,
                    timeout_s,
                    threads_per_process,
                    fn,
                    tuple(args),
                    results,
                ),
                daemon=False,
            )
            process.start()
            processes.append(process)
        collected: dict[int, Any] = {}

        def drain(timeout: float | None) -> None:
            while True:
                try:
                    rank, value = results.get(timeout=timeout) if timeout else results.get_nowait()
                except queue_module.Empty:
                    return
                collected[rank] = value
                timeout = None

        while True:
            drain(0.05)
            if any(p.exitcode not in (None, 0) for p in processes):
                # let the peers of the failed replica fail too and send their tracebacks, so the
                # root cause can be told from the collective errors it causes
                deadline = time.monotonic() + FAILURE_GRACE_S
                while time.monotonic() < deadline and any(p.is_alive() for p in processes):
                    drain(0.05)
                drain(None)
                failed = {
                    r: p.exitcode for r, p in enumerate(processes) if p.exitcode not in (None, 0)
                }
                rank, exitcode, text = _first_failure(failed, collected)
                raise WorkerFailed(rank, exitcode, text, [r for r in failed if r != rank])
            if all(p.exitcode == 0 for p in processes) and len(collected) == nprocs:
                break
            if all(p.exitcode == 0 for p in processes):
                time.sleep(0.05)  # results still in the pipe
                if results.empty() and len(collected) < nprocs:
                    raise RuntimeError("a replica exited without returning a result")
        return [collected[r] for r in range(nprocs)]
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():  # ignored SIGTERM (e.g. stuck in a collective)
                process.kill()
                process.join()
        shutil.rmtree(folder, ignore_errors=True)


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Initialise the default group from torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``...); NCCL when CUDA is available unless ``backend`` says otherwise.
    Returns ``(rank, world_size)``."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise RuntimeError("RANK/WORLD_SIZE not set: start the script with torchrun")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()
