"""Build (once, cached) and load the C evaluator of compiled networks with the system compiler."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
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
    key = hashlib.sha256((source + compiler + " ".join(_FLAGS)).encode()).hexdigest()[:16]
    directory = _cache_dir()
    library = directory / f"dlgn_eval_{key}.so"
    if not library.exists():
        c_file = directory / f"dlgn_eval_{key}.{os.getpid()}.c"
        c_file.write_text(source)
        partial = directory / f"dlgn_eval_{key}.{os.getpid()}.so"
        command = [compiler, *_FLAGS, str(c_file), "-o", str(partial)]
        logger.info("compiling the C evaluator: %s", " ".join(command))
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        c_file.unlink(missing_ok=True)
        if result.returncode != 0:
            raise CompilerUnavailableError(
                f"{compiler} failed to build the evaluator:\n{result.stderr[-2000:]}"
            )
        os.replace(partial, library)  # atomic: concurrent builders never see a partial file
    lib = ctypes.CDLL(str(library))
    lib.dlgn_eval.restype = None
    lib.dlgn_block_words.restype = ctypes.c_int64
    return lib
