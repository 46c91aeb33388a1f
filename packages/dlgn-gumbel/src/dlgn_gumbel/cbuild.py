"""Build (once, cached) and load the C evaluator of compiled networks with the system compiler."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from importlib import resources
from pathlib import Path

logger = logging.getLogger(__name__)

CACHE_ENV_VAR = "DLGN_GUMBEL_CACHE"
COMPILER_ENV_VAR = "CC"
_FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-std=c99")


class CompilerUnavailableError(RuntimeError):
    """No C compiler was found (or it failed); use ``engine='numpy'``."""


def find_compiler() -> str | None:
    """``$CC`` if set, else the first of gcc, cc, clang on ``PATH``."""
    if os.environ.get(COMPILER_ENV_VAR):
        return shutil.which(os.environ[COMPILER_ENV_VAR])
    for name in ("gcc", "cc", "clang"):
        if path := shutil.which(name):
            return path
    return None


def _host_id() -> str:
    """What ``-march=native`` code depends on: the machine type and, on Linux, the CPU's feature
    flags, so that a cache folder shared between different machines (a network home) never hands
    one of them a library built for another CPU."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()}|{platform.processor()}|{flags.strip()}"


def library_key(source: str, compiler: str, host: str) -> str:
    """Cache key of a built evaluator: its source, compiler, flags and host CPU."""
    text = "\n".join((source, compiler, " ".join(_FLAGS), host))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV_VAR) or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "dlgn-gumbel"
    )
    path = Path(root)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-probe"
        probe.touch()
        probe.unlink()
        return path
    except OSError:
        return Path(tempfile.mkdtemp(prefix="dlgn-gumbel-"))


@functools.cache
def load_evaluator() -> ctypes.CDLL:
    """The shared library holding ``dlgn_eval``, compiled on first use into the cache folder
    (``$DLGN_GUMBEL_CACHE``, default ``~/.cache/dlgn-gumbel``)."""
    compiler = find_compiler()
    if compiler is None:
        raise CompilerUnavailableError(
            "no C compiler found (looked at $CC, gcc, cc, clang); install one or use engine='numpy'"
        )
    source = resources.files("dlgn_gumbel").joinpath("_ceval.c").read_text()
    key = library_key(source, compiler, _host_id())
    directory = _cache_dir()
    library = directory / f"dlgn_eval_{key}.so"
    if not library.exists():
        tag = f"{os.getpid()}.{threading.get_ident()}"  # private to this process and thread
        c_file = directory / f"dlgn_eval_{key}.{tag}.c"
        c_file.write_text(source)
        partial = directory / f"dlgn_eval_{key}.{tag}.so"
        command = [compiler, *_FLAGS, str(c_file), "-o", str(partial)]
        logger.info("compiling the C evaluator: %s", " ".join(command))
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, check=False, timeout=300
            )
            failure = result.stderr[-2000:] if result.returncode != 0 else None
        except (OSError, subprocess.TimeoutExpired) as error:  # not runnable, or hung
            failure = str(error)
        finally:
            c_file.unlink(missing_ok=True)
        if failure is not None:
            partial.unlink(missing_ok=True)
            raise CompilerUnavailableError(f"{compiler} failed to build the evaluator:\n{failure}")
        os.replace(partial, library)  # atomic: concurrent builders never see a partial file
    lib = ctypes.CDLL(str(library))
    lib.dlgn_eval.restype = None
    lib.dlgn_block_words.restype = ctypes.c_int64
    return lib
