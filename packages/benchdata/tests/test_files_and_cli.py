import pytest

import benchdata
from benchdata import CACHE_ENV, DataNotFoundError, cache_dir
from benchdata.__main__ import main
from benchdata._files import MANIFEST, file_digest, verify_manifest, write_manifest
from kernels_common.testing import import_footprint


def test_cache_dir_respects_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_dir("models") == tmp_path / "mine" / "models"
    assert (tmp_path / "mine" / "models").is_dir()
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "benchdata"


def test_manifest_detects_changed_missing_and_incomplete_files(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"abc")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("b")
    assert verify_manifest(tmp_path) is None  # no manifest yet: an unfinished folder
    write_manifest(tmp_path, {"source": "test"})
    manifest = verify_manifest(tmp_path)
    # sha256("abc"), the FIPS 180-2 test vector
    assert manifest["files"]["a.bin"] == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    assert manifest["source"] == "test"
    assert file_digest(tmp_path / "sub" / "b.txt") == manifest["files"]["sub/b.txt"]
    (tmp_path / "a.bin").write_bytes(b"abd")
    assert verify_manifest(tmp_path) is None
    (tmp_path / "a.bin").unlink()
    assert verify_manifest(tmp_path) is None


def test_manifest_rejects_unlisted_files_and_an_unreadable_manifest(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    write_manifest(tmp_path, {})
    assert verify_manifest(tmp_path) is not None
    # a loader would pick up a weights file the manifest never saw
    (tmp_path / "pytorch_model.bin").write_bytes(b"other weights")
    assert verify_manifest(tmp_path) is None
    (tmp_path / "pytorch_model.bin").unlink()
    assert verify_manifest(tmp_path) is not None
    manifest = tmp_path / MANIFEST
    for broken in ('{"files": {"model.saf', "[]", '{"source": "x"}'):
        manifest.write_text(broken)
        assert verify_manifest(tmp_path) is None, broken


def test_not_found_error_is_a_file_not_found_error_with_the_command():
    error = DataNotFoundError("Fashion-MNIST", "/nowhere", "fashion")
    assert isinstance(error, FileNotFoundError)
    assert "apt-get install dataset-fashion-mnist" in str(error)
    assert "/nowhere" in str(error)


def test_importing_benchdata_loads_no_heavy_optional_library():
    heavy = (
        "transformers",
        "skimage",
        "sklearn",
        "tiktoken",
        "sentence_transformers",
        "mlxtend",
        "pyarrow",
    )
    footprint = import_footprint("import benchdata", watch=heavy)
    assert [m for m in heavy if footprint[m]] == []


def test_cli_info_lists_every_source(capsys):
    assert main(["info"]) == 0  # the test environment installs every source
    out = capsys.readouterr().out
    for source in benchdata.INSTALL:
        if source != "graphs":
            assert f"{source} " in out
    with pytest.raises(SystemExit):
        main(["prepare", "gpt5"])


def test_cli_names_a_cache_that_is_a_file(tmp_path, monkeypatch, capsys):
    # BENCHDATA_CACHE points at a file: one line naming the variable, not a FileExistsError
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    monkeypatch.setenv(benchdata.CACHE_ENV, str(cache))
    assert main(["info"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"benchdata: error: the benchdata cache ${benchdata.CACHE_ENV}={cache}")
    assert "Traceback" not in err
