"""The SmolLM2 cache's bookkeeping, with the conversion itself replaced by a fast stand-in."""

import threading
import time
from types import SimpleNamespace

import pytest

import benchdata.models
from benchdata import CACHE_ENV, smollm2_135m
from benchdata._files import file_digest, write_manifest
from benchdata.models import CONVERSION, _hub_offline, converted_folder_name


@pytest.fixture
def fake_conversion(tmp_path, monkeypatch):
    """A GGUF stand-in, a cache, a conversion that records its calls, a model loader stub."""
    from huggingface_hub import constants

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    # threads entering the offline switch at once may leave it on: restore it afterwards
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", constants.HF_HUB_OFFLINE)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    calls = []

    def convert(source, folder):
        calls.append(folder)
        time.sleep(0.2)  # long enough for every other thread to arrive meanwhile
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").write_bytes(b"weights")
        write_manifest(folder, {"source_sha256": file_digest(source), "conversion": CONVERSION})

    class Auto:
        @staticmethod
        def from_pretrained(folder, **kwargs):
            return SimpleNamespace(eval=lambda: folder)

    transformers = SimpleNamespace(AutoModelForCausalLM=Auto, AutoTokenizer=Auto)
    monkeypatch.setattr(benchdata.models, "convert_gguf", convert)
    monkeypatch.setattr(benchdata.models, "optional_import", lambda *args: transformers)
    return gguf, calls


def test_concurrent_first_loads_convert_once(fake_conversion):
    gguf, calls = fake_conversion
    folders = []
    threads = [
        threading.Thread(target=lambda: folders.append(smollm2_135m(gguf).model)) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len(folders) == 4
    assert len(set(folders)) == 1


def test_cache_made_from_another_gguf_is_converted_again(fake_conversion):
    gguf, calls = fake_conversion
    folder = smollm2_135m(gguf).model
    smollm2_135m(gguf)
    assert len(calls) == 1  # verified: used as is
    write_manifest(folder, {"source_sha256": "0" * 64})  # consistent files, another source
    assert smollm2_135m(gguf).model == folder
    assert len(calls) == 2
    # the same source, converted by an older version of the conversion
    write_manifest(folder, {"source_sha256": file_digest(gguf), "conversion": CONVERSION - 1})
    assert smollm2_135m(gguf).model == folder
    assert len(calls) == 3


def test_each_major_version_of_transformers_converts_into_its_own_folder(
    fake_conversion, monkeypatch
):
    # a folder saved by transformers 5 may not load in 4.x (and the cache is shared)
    gguf, calls = fake_conversion
    monkeypatch.setattr(benchdata.models, "_transformers_major", lambda: "4")
    four = smollm2_135m(gguf).model
    monkeypatch.setattr(benchdata.models, "_transformers_major", lambda: "5")
    five = smollm2_135m(gguf).model
    assert four != five
    assert (four.name, five.name) == (
        f"{file_digest(gguf)[:16]}-transformers4",
        f"{file_digest(gguf)[:16]}-transformers5",
    )
    assert len(calls) == 2
    monkeypatch.setattr(benchdata.models, "_transformers_major", lambda: "4")
    assert smollm2_135m(gguf).model == four  # verified: used as is
    assert len(calls) == 2


def test_staging_folders_of_a_dead_conversion_are_removed(fake_conversion, tmp_path):
    gguf, calls = fake_conversion
    root = tmp_path / "cache" / "smollm2-135m-instruct"
    stale = root / f"{converted_folder_name(file_digest(gguf))}.partial-999999"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half a file")
    other = root / "0123456789abcdef.partial-1"  # another GGUF's: not ours to touch
    other.mkdir()
    smollm2_135m(gguf)
    assert len(calls) == 1
    assert not stale.exists()
    assert other.exists()


def test_hub_is_offline_even_when_huggingface_hub_was_imported_online(monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    # huggingface_hub >= 1.0 asks is_offline_mode(); before, the constant is what it reads
    is_offline_mode = getattr(huggingface_hub, "is_offline_mode", lambda: constants.HF_HUB_OFFLINE)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # what an online import read
    with _hub_offline():
        assert is_offline_mode()
    assert not is_offline_mode()
