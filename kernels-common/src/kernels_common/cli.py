"""What every package's command line shares.

* :class:`ArgumentParser` reports a bad argument as one line, ``<prog>: error: <message>``, with
  exit code 2, and :func:`run` turns the library's own exceptions (bad values, missing or corrupt
  files, an unavailable backend or device) into the same one line. A real bug keeps its traceback,
  and ``--debug`` shows the traceback of everything.
* The argument types below check a value when the command line is parsed, so a bad invocation is
  refused before any work starts.
* :func:`atomic_file` and :func:`atomic_folder` make outputs appear whole or not at all: a failed
  or interrupted run leaves neither a partial file nor an empty folder behind.

A package's ``main`` reads::

    def main(argv=None) -> int:
        parser = cli.ArgumentParser(prog="my-package", description=...)
        ...  # sub-commands with set_defaults(func=...)
        return cli.run(parser, lambda args: args.func(args), argv)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "ArgumentParser",
    "CommandError",
    "atomic_file",
    "atomic_folder",
    "device",
    "existing_file",
    "existing_folder",
    "finite_float",
    "fraction",
    "int_list",
    "nonnegative_float",
    "nonnegative_int",
    "output_file",
    "output_folder",
    "positive_float",
    "positive_int",
    "read_json",
    "read_safetensors",
    "run",
    "user_error_types",
]


class CommandError(Exception):
    """A refusal that the command line reports as one line (exit code 2)."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line: ``<prog>: error: <message>``.

    Sub-parsers made by :meth:`add_subparsers` are of this class too, and every parser accepts
    ``--debug`` (show tracebacks) before or after the sub-command.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._is_subparser = kwargs.pop("_is_subparser", False)
        super().__init__(*args, **kwargs)
        self.add_argument(
            "--debug",
            action="store_true",
            # a sub-command's flag must not reset one given before it
            default=argparse.SUPPRESS if self._is_subparser else False,
            help="show the full traceback of an error",
        )

    def add_subparsers(self, **kwargs: Any):  # type: ignore[override]
        action = super().add_subparsers(**kwargs)
        original = action.add_parser

        def add_parser(name: str, **options: Any) -> ArgumentParser:
            return original(name, _is_subparser=True, **options)

        action.add_parser = add_parser  # type: ignore[method-assign]
        return action

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def user_error_types() -> tuple[type[BaseException], ...]:
    """The exceptions :func:`run` reports as one line: the library's own refusals.

    ``ValueError`` (JSON's and Unicode's decoding errors among them), ``TypeError``, ``OSError``
    (a missing, unreadable or unwritable path), safetensors' corrupt-file error, an unavailable
    kernel backend and :class:`CommandError`. Anything else is a bug and keeps its traceback.
    """
    from kernels_common.backend import BackendUnavailableError

    types: list[type[BaseException]] = [
        CommandError,
        ValueError,
        TypeError,
        OSError,
        BackendUnavailableError,
    ]
    with contextlib.suppress(ImportError):
        from safetensors import SafetensorError

        types.append(SafetensorError)
    return tuple(types)


def describe(error: BaseException) -> str:
    """One line that says what was wrong, without Python's ``[Errno N]`` decoration."""
    if isinstance(error, OSError) and error.strerror:
        reason = error.strerror[:1].lower() + error.strerror[1:]
        if error.filename is None:
            return _one_line(reason)
        target = f"{error.filename} -> {error.filename2}" if error.filename2 else error.filename
        return _one_line(f"{reason}: {target}")
    text = str(error).strip()
    if isinstance(error, KeyError | TypeError) and len(error.args) == 1:
        text = str(error.args[0])
    return _one_line(text or type(error).__name__)


def run(
    parser: argparse.ArgumentParser,
    handler: Callable[[argparse.Namespace], int | None],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse ``argv``, call ``handler(args)`` and return the exit code.

    A user error (see :func:`user_error_types`) prints ``<prog>: error: <message>`` on stderr and
    returns 2; ``--debug`` re-raises it with its traceback. Ctrl-C returns 130 without a traceback.
    """
    args = parser.parse_args(argv)
    debug = bool(getattr(args, "debug", False))
    try:
        with _terminate_as_exit():
            code = handler(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    except user_error_types() as error:
        if debug:
            raise
        print(f"{parser.prog}: error: {describe(error)}", file=sys.stderr)
        return 2
    return 0 if code is None else int(code)


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM (``timeout``, a batch scheduler's pre-emption) raises ``SystemExit(143)``, so
    ``finally`` blocks run and no temporary output is left behind, as on Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text.strip())


# --- argument types: each refuses a bad value at parse time, naming it ---------------------------


def _number(text: str, kind: type) -> float | int:
    try:
        return kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer ≥ 1."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(value)


def nonnegative_int(text: str) -> int:
    """An integer ≥ 0."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(value)


def finite_float(text: str) -> float:
    """Any finite number (no nan, no inf)."""
    value = _number(text, float)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return float(value)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number ≥ 0."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    value = finite_float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return value


def int_list(item: Callable[[str], int] = positive_int) -> Callable[[str], list[int]]:
    """A comma-separated list (``64,128,256``), every entry checked by ``item``."""

    def parse(text: str) -> list[int]:
        parts = [part.strip() for part in text.split(",")]
        if not text.strip() or any(not part for part in parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        try:
            return [item(part) for part in parts]
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"in {text!r}: {error}") from None

    parse.__name__ = "int_list"
    return parse


def _path_type(check: Callable[[str], Path]) -> Callable[[str], Path]:
    """``check``, with an ``OSError`` of the file system (a name too long, a folder that may not
    be listed) refused like any other bad path instead of escaping argparse as a traceback."""

    @functools.wraps(check)
    def checked(text: str) -> Path:
        try:
            return check(text)
        except OSError as error:
            raise argparse.ArgumentTypeError(f"{describe(error)} ({text[:80]})") from None

    return checked


@_path_type
def existing_file(text: str) -> Path:
    """A path to a file that exists and can be read."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"not a file: {text}")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text}")
    return path


@_path_type
def existing_folder(text: str) -> Path:
    """A path to a folder that exists."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such folder: {text}")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a folder: {text}")
    return path


def _writable_ancestor(path: Path, original: str) -> None:
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create {original}: {ancestor} is a file")
    try:  # a real write: permission bits say little to root or on read-only mounts
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as error:
        raise argparse.ArgumentTypeError(
            f"cannot write to {original}: {ancestor} refuses files ({error.strerror})"
        ) from None


@_path_type
def output_folder(text: str) -> Path:
    """A folder that exists and is writable, or can be created (checked now, created later)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a folder")
    _writable_ancestor(path, text)
    return path


@_path_type
def output_file(text: str) -> Path:
    """A file that can be written: not a folder, its folder writable or creatable."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, expected a file name")
    _writable_ancestor(path.parent, text)
    return path


_DEVICE = re.compile(r"^(cpu|cuda|cuda:\d+|mps)$")


def device(text: str) -> str:
    """``cpu``, ``cuda``, ``cuda:N`` or ``mps``, and available on this machine."""
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"unknown device {text!r} (cpu, cuda, cuda:N or mps)")
    import torch

    if text.startswith("cuda"):
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"device {text!r}: this torch has no usable CUDA")
        index = int(text.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"device {text!r}: only {torch.cuda.device_count()} CUDA device(s) here"
            )
    if text == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError("device 'mps': not available on this machine")
    return text


# --- reading files: a corrupt one is named, with what is wrong -----------------------------------


def read_json(path: str | os.PathLike[str], what: str = "JSON file") -> Any:
    """The parsed contents of ``path``; a missing, truncated or non-JSON file raises a
    ``ValueError`` / ``FileNotFoundError`` that names it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a {what} (not UTF-8 text)") from None
    except json.JSONDecodeError as error:
        # a string cut short is reported where it starts, not at the end of the file
        cut = error.pos >= len(error.doc.rstrip()) or error.msg.startswith("Unterminated")
        state = "truncated" if cut else "not valid JSON"
        raise ValueError(f"{path} is not a readable {what} ({state}: {error.msg}, "
                         f"line {error.lineno} column {error.colno})") from None  # fmt: skip


def read_safetensors(
    path: str | os.PathLike[str], what: str = "weights file", *, framework: str = "pt"
) -> dict[str, Any]:
    """Every tensor in a ``.safetensors`` file, as torch tensors (``framework="pt"``) or numpy
    arrays (``"numpy"``); a missing, truncated or foreign file raises a ``ValueError`` /
    ``FileNotFoundError`` that names it."""
    from safetensors import SafetensorError

    if framework == "pt":
        from safetensors.torch import load_file
    elif framework == "numpy":
        from safetensors.numpy import load_file
    else:
        raise ValueError(f"framework must be 'pt' or 'numpy', got {framework!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        return load_file(str(path))
    except SafetensorError as error:
        raise ValueError(f"{path} is not a readable {what} (truncated or not safetensors: "
                         f"{_one_line(str(error))})") from None  # fmt: skip


# --- writing outputs whole or not at all ---------------------------------------------------------


def _existing_ancestor(folder: Path) -> Path:
    """The nearest folder of ``folder``'s chain that exists: temporaries go there, on the same
    file system as the target, and nothing is created before the output is complete."""
    folder = folder.absolute()
    while not folder.exists():
        folder = folder.parent
    return folder


def _read_umask() -> int:
    umask = os.umask(0o022)  # read once, at import: os.umask can only be read by setting it
    os.umask(umask)
    return umask


_UMASK = _read_umask()


def _mode_of(path: Path) -> int:
    """The mode a file written at ``path`` gets: the replaced file's, else 0666 less the umask."""
    with contextlib.suppress(OSError):
        return path.stat().st_mode & 0o7777
    return 0o666 & ~_UMASK


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffix, so writers that look at it still
    work); on success it replaces ``path`` in one rename (missing folders are created only then),
    on failure it is removed."""
    path = Path(os.path.realpath(path))  # a symlinked output is written through its link
    handle, name = tempfile.mkstemp(
        dir=_existing_ancestor(path.parent), prefix=f".{path.name}.", suffix=path.suffix
    )
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        path.parent.mkdir(parents=True, exist_ok=True)
        # mkstemp makes a private (0600) file: give it the mode a plain open() would have
        os.chmod(temporary, _mode_of(path))
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary folder; on success its contents become ``path``'s.

    A ``path`` that does not exist appears in one rename (its parents created only then); the
    temporary sits beside it, on the same file system. Into an existing folder (a mount point, a
    symlink to another disk) the temporary is made inside it, and each file moves in by one
    rename, replacing a file of the same name and leaving the folder's other files alone. On
    failure the temporary is removed and ``path`` is left as it was. Should moving the finished
    files fail, the temporary is kept and the error names it: finished work is never deleted.
    """
    path = Path(os.path.realpath(path))
    into_existing = path.is_dir()
    parent = path if into_existing else _existing_ancestor(path.parent)
    temporary = Path(tempfile.mkdtemp(dir=parent, prefix=f".{path.name}."))
    try:
        yield temporary
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    try:
        os.chmod(temporary, 0o777 & ~_UMASK)  # mkdtemp makes it private (0700)
        if not path.exists():  # (re-checked: the body may have created it meanwhile)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.rename(temporary, path)
            return
        for item in sorted(temporary.rglob("*")):
            target = path / item.relative_to(temporary)
            if item.is_dir():
                target.mkdir(exist_ok=True)
            else:
                os.replace(item, target)
        shutil.rmtree(temporary)
    except OSError as error:
        raise OSError(
            error.errno, f"{error.strerror}; the finished files are kept in {temporary}", str(path)
        ) from error
