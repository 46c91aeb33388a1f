"""The shared command-line helper: one-line refusals, parse-time checks, atomic outputs."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from kernels_common import cli
from kernels_common.__main__ import main as kernels_common_main
from kernels_common.backend import BackendUnavailableError


def _parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="tool")
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("go")
    go.add_argument("--steps", type=cli.positive_int, default=1)
    return parser


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ValueError("budget must be positive,\n  got -1"),
         "tool: error: budget must be positive, got -1"),
        (FileNotFoundError(2, "No such file or directory", "ck/a.json"),
         "tool: error: no such file or directory: ck/a.json"),
        (TypeError("expected a tensor"), "tool: error: expected a tensor"),
        (BackendUnavailableError("triton needs a GPU"), "tool: error: triton needs a GPU"),
        (cli.CommandError("no C compiler"), "tool: error: no C compiler"),
        (json.JSONDecodeError("Expecting value", "{", 1), "tool: error: Expecting value"),
    ],
)  # fmt: skip
def test_library_errors_become_one_line(capsys, error, expected):
    def handler(args):
        raise error

    assert cli.run(_parser(), handler, ["go"]) == 2
    assert _error_line(capsys).startswith(expected)


def test_a_bug_keeps_its_traceback():
    # a RuntimeError / IndexError is not a refusal of the user's input: it must not be hidden
    def handler(args):
        raise IndexError("off by one")

    with pytest.raises(IndexError, match="off by one"):
        cli.run(_parser(), handler, ["go"])


@pytest.mark.parametrize("argv", [["--debug", "go"], ["go", "--debug"]])
def test_debug_shows_the_traceback_before_or_after_the_subcommand(argv):
    def handler(args):
        raise ValueError("shown with its traceback")

    with pytest.raises(ValueError, match="shown with"):
        cli.run(_parser(), handler, argv)


def test_exit_codes_pass_through_and_none_is_success():
    assert cli.run(_parser(), lambda args: 1, ["go"]) == 1
    assert cli.run(_parser(), lambda args: None, ["go"]) == 0


def test_interrupt_is_one_line(capsys):
    def handler(args):
        raise KeyboardInterrupt

    assert cli.run(_parser(), handler, ["go"]) == 130
    assert _error_line(capsys) == "tool: interrupted"


def test_parser_errors_are_one_line_with_exit_code_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.run(_parser(), lambda args: 0, ["go", "--steps", "-5"])  # a negative count
    assert exit_info.value.code == 2
    line = _error_line(capsys)
    assert line.startswith("tool go: error: argument --steps:")
    assert "'-5'" in line


def _refuses(kind, text: str, fragment: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=fragment):
        kind(text)


def test_numeric_types_accept_and_refuse():
    assert cli.positive_int("3") == 3
    assert cli.nonnegative_int("0") == 0
    assert cli.finite_float("-1.5") == -1.5
    assert cli.positive_float("1e-3") == 1e-3
    assert cli.nonnegative_float("0") == 0.0
    assert cli.fraction("1") == 1.0
    _refuses(cli.positive_int, "0", "positive integer, got '0'")
    _refuses(cli.positive_int, "2.5", "an integer, got '2.5'")
    _refuses(cli.nonnegative_int, "-1", ">= 0, got '-1'")
    for text in ("nan", "inf", "-inf"):
        _refuses(cli.finite_float, text, f"finite number, got '{text}'")
    _refuses(cli.positive_float, "0", "positive number")
    _refuses(cli.positive_float, "abc", "a number, got 'abc'")
    _refuses(cli.nonnegative_float, "-0.1", ">= 0")
    _refuses(cli.fraction, "0", r"\(0, 1\]")
    _refuses(cli.fraction, "1.01", r"\(0, 1\]")


def test_int_list():
    parse = cli.int_list()
    assert parse("64, 128,256") == [64, 128, 256]
    _refuses(parse, "64,-64", "in '64,-64': expected a positive integer, got '-64'")
    _refuses(parse, "64,,128", "comma-separated list")
    _refuses(parse, "", "comma-separated list")
    assert cli.int_list(cli.nonnegative_int)("0,1") == [0, 1]


def test_path_types(tmp_path):
    file = tmp_path / "a.txt"
    file.write_text("x")
    assert cli.existing_file(str(file)) == file
    _refuses(cli.existing_file, str(tmp_path / "missing.txt"), "no such file")
    _refuses(cli.existing_file, str(tmp_path), "not a file")
    assert cli.existing_folder(str(tmp_path)) == tmp_path
    _refuses(cli.existing_folder, str(file), "not a folder")
    _refuses(cli.existing_folder, str(tmp_path / "nope"), "no such folder")
    # an output folder may be created later (nothing is created now), but never under a file
    assert cli.output_folder(str(tmp_path / "new" / "deeper")) == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()
    _refuses(cli.output_folder, str(file), "exists and is not a folder")
    _refuses(cli.output_folder, str(file / "sub"), "is a file")
    assert cli.output_file(str(tmp_path / "out.json")) == tmp_path / "out.json"
    _refuses(cli.output_file, str(tmp_path), "is a folder")
    _refuses(cli.output_file, str(file / "out.json"), "is a file")


def test_output_folder_refuses_a_location_that_refuses_files(tmp_path, monkeypatch):
    # the check writes a real temporary file (permission bits say little to root); here the
    # file system refuses it, as a read-only mount would
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(cli.tempfile, "TemporaryFile", refuse)
    _refuses(cli.output_folder, str(tmp_path / "out"), "refuses files \\(Read-only file system")


def test_device_type():
    assert cli.device("cpu") == "cpu"
    _refuses(cli.device, "nosuch", "unknown device 'nosuch'")
    _refuses(cli.device, "cuda:x", "unknown device")
    if not torch.cuda.is_available():
        _refuses(cli.device, "cuda", "no usable CUDA")
    else:
        _refuses(cli.device, f"cuda:{torch.cuda.device_count()}", "CUDA device")


def test_read_json_names_a_truncated_or_foreign_file(tmp_path):
    good = tmp_path / "good.json"
    good.write_text('{"a": [1, 2]}')
    assert cli.read_json(good) == {"a": [1, 2]}
    truncated = tmp_path / "config.json"
    truncated.write_text('{"a": [1, ')
    with pytest.raises(ValueError, match=r"config\.json is not a readable checkpoint config \(tr"):
        cli.read_json(truncated, "checkpoint config")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("hello world")
    with pytest.raises(ValueError, match=r"garbage\.json .*not valid JSON"):
        cli.read_json(garbage)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        cli.read_json(binary)
    with pytest.raises(FileNotFoundError, match=r"missing\.json"):
        cli.read_json(tmp_path / "missing.json")


def test_read_safetensors_names_a_truncated_or_foreign_file(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.arange(6.0)}, str(path))
    assert torch.equal(cli.read_safetensors(path)["w"], torch.arange(6.0))
    as_numpy = cli.read_safetensors(path, framework="numpy")["w"]
    assert type(as_numpy).__module__ == "numpy"
    assert as_numpy.tolist() == list(range(6))
    with pytest.raises(ValueError, match="framework must be"):
        cli.read_safetensors(path, framework="jax")
    whole = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(whole[: len(whole) - 5])
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    for name in ("cut.safetensors", "junk.safetensors"):
        with pytest.raises(ValueError, match=rf"{name} is not a readable weights file"):
            cli.read_safetensors(tmp_path / name)
    with pytest.raises(FileNotFoundError, match=r"none\.safetensors"):
        cli.read_safetensors(tmp_path / "none.safetensors")


def _fail_while_writing(context, write) -> None:
    """Enter ``context``, ``write(temporary)`` and fail, as an interrupted run would."""

    def interrupted() -> None:
        with context as temporary:
            write(temporary)
            raise RuntimeError("interrupted mid-write")

    with pytest.raises(RuntimeError, match="interrupted"):
        interrupted()


def test_atomic_file_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "new" / "out.json"
    seen = []
    _fail_while_writing(cli.atomic_file(target), lambda t: (seen.append(t), t.write_text("{")))
    assert seen[0].suffix == ".json"  # writers that pick a format by suffix still work
    assert not target.exists()
    assert not (tmp_path / "new").exists()
    assert list(tmp_path.iterdir()) == []  # the temporary is gone too

    target.parent.mkdir()
    target.write_text("old")
    _fail_while_writing(cli.atomic_file(target), lambda t: t.write_text("partial"))
    assert target.read_text() == "old"  # the previous complete file survives a failed rewrite
    with cli.atomic_file(target) as temporary:
        temporary.write_text("new")
    assert target.read_text() == "new"
    assert [p.name for p in target.parent.iterdir()] == ["out.json"]


def test_atomic_folder_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "a" / "checkpoint"
    _fail_while_writing(
        cli.atomic_folder(target), lambda t: (t / "model.safetensors").write_bytes(b"123")
    )
    assert list(tmp_path.iterdir()) == []  # no empty folder, no temporary left

    with cli.atomic_folder(target) as temporary:
        (temporary / "model.safetensors").write_bytes(b"123")
        (temporary / "sub").mkdir()
        (temporary / "sub" / "config.json").write_text("{}")
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == [
        "model.safetensors", "sub", "sub/config.json",
    ]  # fmt: skip
    assert [p.name for p in target.parent.iterdir()] == ["checkpoint"]


def test_kernels_common_report_refuses_a_file(tmp_path, capsys):
    # `report` writes DIR/index.md: a file where the folder should be is refused before writing
    file = tmp_path / "reports"
    file.write_text("not a folder")
    with pytest.raises(SystemExit) as exit_info:
        kernels_common_main(["report", str(file)])
    assert exit_info.value.code == 2
    assert "exists and is not a folder" in _error_line(capsys)
    assert file.read_text() == "not a folder"


def test_kernels_common_report_names_an_unreadable_results_file(tmp_path, capsys):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "results.json").write_text('{"schema_version": 1, ')
    assert kernels_common_main(["report", str(tmp_path)]) == 1
    assert "unreadable results: pkg" in capsys.readouterr().err
    assert (tmp_path / "index.md").exists()
    assert Path(tmp_path / "index.md").read_text().count("malformed results") == 1


def test_atomic_file_gets_the_mode_a_plain_write_would(tmp_path):
    # mkstemp files are private (0600); an output must be as readable as one open() creates
    umask = os.umask(0o022)
    try:
        with cli.atomic_file(tmp_path / "new.json") as temporary:
            temporary.write_text("{}")
        assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o644
        shared = tmp_path / "shared.json"
        shared.write_text("old")
        shared.chmod(0o664)  # a replaced file keeps its own mode
        with cli.atomic_file(shared) as temporary:
            temporary.write_text("new")
        assert shared.stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(umask)


def test_atomic_folder_into_an_existing_folder_stages_inside_it(tmp_path, monkeypatch):
    # an existing --out may be a mount point or a symlink to another disk: the temporary must
    # sit inside it (same file system), and the folder's other files stay
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("earlier run")
    link = tmp_path / "link"
    link.symlink_to(out)
    with cli.atomic_folder(link) as temporary:
        assert temporary.parent == out
        (temporary / "law.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", "law.json"]
    assert link.is_symlink()


def test_atomic_folder_keeps_finished_files_when_the_move_fails(tmp_path, monkeypatch):
    def refuse(*args):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(cli.os, "rename", refuse)
    with pytest.raises(OSError, match="finished files are kept in") as error_info:  # noqa: SIM117
        with cli.atomic_folder(tmp_path / "new") as temporary:
            (temporary / "weights.bin").write_bytes(b"hours of training")
    assert (temporary / "weights.bin").read_bytes() == b"hours of training"
    assert str(temporary) in str(error_info.value)


def test_atomic_folder_gets_the_mode_a_plain_mkdir_would(tmp_path, monkeypatch):
    # mkdtemp folders are private (0700); a new output folder must not be
    monkeypatch.setattr(cli, "_UMASK", 0o022)
    with cli.atomic_folder(tmp_path / "out") as temporary:
        (temporary / "a.txt").write_text("x")
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755


def test_atomic_file_writes_through_a_symlink(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with cli.atomic_file(link) as temporary:
        temporary.write_text("new")
    assert link.is_symlink()
    assert real.read_text() == "new"


def test_sigterm_cleans_up_like_ctrl_c(tmp_path):
    # `timeout` and batch schedulers send SIGTERM: the temporaries must not stay behind
    script = (
        "import os, signal, time\n"
        "from kernels_common import cli\n"
        "def handler(args):\n"
        "    with cli.atomic_folder('out') as t:\n"
        "        open(os.path.join(t, 'big.bin'), 'wb').write(b'x')\n"
        "        print('ready', flush=True)\n"
        "        time.sleep(60)\n"
        "raise SystemExit(cli.run(cli.ArgumentParser(prog='t'), handler, []))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1])}
    with subprocess.Popen(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        start = time.perf_counter()
        assert process.wait(timeout=30) == 128 + signal.SIGTERM
        assert time.perf_counter() - start < 30  # the 60 s sleep was cut short
    assert list(tmp_path.iterdir()) == []  # no hidden temporary, no output folder


def test_path_types_refuse_what_the_file_system_refuses():
    # a name longer than the file system allows raises OSError inside Path.exists()
    too_long = "a" * 300
    for kind in (cli.existing_file, cli.existing_folder, cli.output_folder, cli.output_file):
        _refuses(kind, f"{too_long}/x", "name too long")


def test_describe_drops_the_errno_decoration():
    assert cli.describe(OSError(28, "No space left on device")) == "no space left on device"
    assert cli.describe(OSError(13, "Permission denied", "/x")) == "permission denied: /x"


def test_assert_refused_fails_unless_the_refusal_is_one_clean_line(tmp_path, capsys):
    from kernels_common.testing import assert_refused

    def tool(argv):
        return cli.run(_parser(), lambda args: None, argv)

    line = assert_refused(tool, ["go", "--steps", "0"], capsys, "tool", "'0'", unchanged=tmp_path)
    assert line.startswith("tool go: error:")

    def accepts(argv):  # exit 0: not a refusal
        return 0

    def two_lines(argv):
        print("tool: error: one\nmore", file=sys.stderr)
        return 2

    def writes(argv):
        (tmp_path / "half.json").write_text("{")
        print("tool: error: late", file=sys.stderr)
        return 2

    for main, argv in ((accepts, []), (two_lines, []), (writes, [])):
        with pytest.raises(AssertionError):
            assert_refused(main, argv, capsys, "tool", unchanged=tmp_path)
    with pytest.raises(AssertionError):  # the line does not name the bad value
        assert_refused(tool, ["go", "--steps", "0"], capsys, "tool", "'-5'")
