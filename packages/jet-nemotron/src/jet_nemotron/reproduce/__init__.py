"""``jet-nemotron reproduce``: a SmolLM2-135M hybrid at CPU scale, written as ``results.json``,
PNG plots and a Markdown summary.

1. Load SmolLM2-135M-Instruct (benchdata) and real text (ShareGPT first exchanges).
2. Keep full attention in the few layers whose attention matters most for the held-out loss
   (each layer's attention ablated in turn), turn every other layer into a JetBlock initialised
   from its attention.
3. Distil the JetBlocks, layer-wise then end-to-end (everything else stays the original's), and
   measure the held-out loss gap to the original before and after.
4. Passkey retrieval at growing contexts, original vs hybrid.
5. Decoding throughput and cache size at 1k-64k tokens of context, original vs hybrid.

These are the ``"jetblock"`` part; the ``"postnas"`` part (:mod:`jet_nemotron.reproduce.postnas`)
runs the search that designs the hybrid. ``results.json`` holds the claims of the parts run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch

from jet_nemotron.bench.generation import decode_sweep
from jet_nemotron.data import text_rows
from jet_nemotron.distill import DistillConfig, distill, heldout_loss
from jet_nemotron.models.convert import from_pretrained_llama
from jet_nemotron.probe import passkey_accuracy
from jet_nemotron.reproduce.importance import attention_importance
from jet_nemotron.reproduce.postnas import FULL as POSTNAS_FULL
from jet_nemotron.reproduce.postnas import QUICK as POSTNAS_QUICK
from jet_nemotron.reproduce.postnas import run_postnas
from jet_nemotron.reproduce.report import write_results

LOGGER = logging.getLogger(__name__)
PARTS = ("jetblock", "postnas")

QUICK = {
    "seq_len": 128,
    "num_texts": 1500,
    "keep_attention": 3,
    "importance_rows": 2,
    "eval_rows": 16,
    "distill": DistillConfig(layerwise_steps=120, end_to_end_steps=10, batch_size=2, lr=1e-3),
    "passkey_contexts": [256, 512, 1024],
    "passkey_trials": 5,
    "decode_contexts": [1024, 4096, 16384, 65536],
    "new_tokens": 8,
}
FULL = {
    **QUICK,
    "num_texts": 6000,
    "seq_len": 256,
    "importance_rows": 8,
    "eval_rows": 64,
    "distill": DistillConfig(layerwise_steps=1000, end_to_end_steps=200, batch_size=4, lr=1e-3),
    "passkey_contexts": [256, 512, 1024, 2048],
    "passkey_trials": 20,
    "new_tokens": 16,
}


def _load():
    try:
        import benchdata
    except ImportError as error:
        raise ImportError(
            "reproduce needs benchdata's SmolLM2, ShareGPT and fortunes: "
            "pip install 'jet-nemotron[reproduce]'"
        ) from error
    lm = benchdata.smollm2_135m()
    return lm.model.eval(), lm.tokenizer, benchdata.fortunes_corpus().validation


def run_jetblock(
    teacher: Any, tokenizer: Any, filler: list[str], settings: dict[str, Any]
) -> dict[str, Any]:
    """Steps 2-5 of the module docstring with ``settings``; the measurements."""
    rows = text_rows(tokenizer, "sharegpt", seq_len=settings["seq_len"],
                     num_texts=settings["num_texts"])  # fmt: skip
    heldout = rows.validation[: settings["eval_rows"]]

    LOGGER.info("attention importance of each of the %d layers", teacher.config.num_hidden_layers)
    importance = attention_importance(teacher, rows.train[: settings["importance_rows"]])
    keep = sorted(
        sorted(importance, key=importance.get, reverse=True)[: settings["keep_attention"]]
    )
    layer_types = ["attn" if i in keep else "jet" for i in range(len(importance))]
    hybrid = from_pretrained_llama(teacher, layer_types)

    LOGGER.info("held-out losses before distillation")
    losses = {
        "original": heldout_loss(teacher, heldout),
        "hybrid, initialised": heldout_loss(hybrid, heldout),
    }
    history = distill(hybrid, teacher, rows.train, settings["distill"])
    losses["hybrid, distilled"] = heldout_loss(hybrid, heldout)
    LOGGER.info("held-out losses: %s", losses)

    LOGGER.info("passkey retrieval")
    models = {"SmolLM2-135M (all attention)": teacher, "hybrid": hybrid.eval()}
    passkey = {
        name: [passkey_accuracy(model, tokenizer, filler, context, settings["passkey_trials"])
               for context in settings["passkey_contexts"]]
        for name, model in models.items()
    }  # fmt: skip

    LOGGER.info("decoding throughput and cache size")
    decoding = decode_sweep(models, settings["decode_contexts"], settings["new_tokens"])
    return {
        "layer_types": layer_types,
        "kept_attention_layers": keep,
        "importance": importance,
        "heldout_loss": losses,
        "distill_history": asdict(history),
        "passkey": passkey,
        "decoding": decoding,
    }


def _plain(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: (asdict(v) if is_dataclass(v) else v) for k, v in settings.items()}


def reproduce(out: Path, *, quick: bool = True, parts: Sequence[str] = PARTS) -> object:
    """Run the ``parts`` (``"jetblock"``, ``"postnas"``) into ``out`` and return the saved
    :class:`ReproduceResults`."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise ValueError(f"parts must be a non-empty selection of {PARTS}, got {list(parts)}")
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    teacher, tokenizer, filler = _load()
    measured, settings = {}, {}
    for part in PARTS:
        if part in parts:
            torch.manual_seed(0)
            chosen = (QUICK if quick else FULL) if part == "jetblock" else (
                POSTNAS_QUICK if quick else POSTNAS_FULL)  # fmt: skip
            run = run_jetblock if part == "jetblock" else run_postnas
            measured[part] = run(teacher, tokenizer, filler, chosen)
            settings[part] = _plain(chosen)
    return write_results(out, measured, settings, quick, time.perf_counter() - start)
