"""The PostNAS part of ``jet-nemotron reproduce``: the search that designs the hybrid, at CPU
scale on SmolLM2-135M-Instruct.

1. Train a once-for-all super-network (a JetBlock beside every layer's attention) on ShareGPT
   first exchanges: layer-wise, then with sampled paths.
2. Beam-search which 2 layers keep full attention, scored with the super-network's weights on
   three probes (held-out LM loss, passkey retrieval, few-shot addition); record each task's
   important layers.
3. At the chosen placement, train linear-attention candidates the same way and compare them.
4. Hardware-aware search: JetBlock shapes of one recurrent-state size, distilled alike, scored
   by quality and by decoding throughput measured here.
5. The hybrids of the learned and of a uniform placement (both with the super-network's
   JetBlocks) against the original: held-out loss, probes, decoding throughput.

The search sees one set of probes; the learned and uniform placements are compared on a second,
disjoint set (other held-out rows, other passkeys and sums) and on held-out rows neither used.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from torch import nn

from jet_nemotron.bench.generation import decode_sweep
from jet_nemotron.data import text_rows
from jet_nemotron.distill import DistillConfig, heldout_loss
from jet_nemotron.postnas.hardware import JetShape, search_hardware
from jet_nemotron.postnas.probes import default_probes, score_probe
from jet_nemotron.postnas.search import PlacementEvaluator, search_placement
from jet_nemotron.postnas.selection import select_block
from jet_nemotron.postnas.supernet import (
    SupernetTrainConfig,
    SuperNetwork,
    train_supernet,
    uniform_placement,
)

LOGGER = logging.getLogger(__name__)
TEST_SEED = 1000  # passkeys and sums of the evaluation probes, unlike the search's (seed 0)

# SmolLM2-135M's attention shape (9 heads x 64 x 64) and three others of its recurrent-state size
HW_SHAPES = ((9, 64, 64), (6, 64, 96), (3, 96, 128), (12, 48, 64))

QUICK: dict[str, Any] = {
    "seq_len": 128,
    "num_texts": 1500,
    "probe_examples": 2,
    "retrieval_context": 192,
    "supernet": SupernetTrainConfig(
        layerwise_steps=40, path_steps=12, batch_size=2, min_attention=0, max_attention=3
    ),
    "budget": 2,
    "beam_width": 1,
    "blocks": ("jet", "gla"),
    "block_training": SupernetTrainConfig(layerwise_steps=20, path_steps=2, batch_size=2),
    "hw_shapes": HW_SHAPES[:3],
    "hw_distill": DistillConfig(layerwise_steps=15, end_to_end_steps=0, batch_size=2),
    "hw_context": 4096,
    "eval_rows": 8,
    "decode_contexts": [4096, 16384],
    "new_tokens": 8,
}
FULL: dict[str, Any] = {
    **QUICK,
    "num_texts": 6000,
    "probe_examples": 8,
    "retrieval_context": 512,
    "supernet": SupernetTrainConfig(
        layerwise_steps=600, path_steps=300, batch_size=4, min_attention=0, max_attention=3
    ),
    "beam_width": 3,
    "blocks": ("jet", "gated_deltanet", "gla", "retnet", "mamba2"),
    "block_training": SupernetTrainConfig(layerwise_steps=300, path_steps=50, batch_size=4),
    "hw_shapes": HW_SHAPES,
    "hw_distill": DistillConfig(layerwise_steps=200, end_to_end_steps=0, batch_size=4),
    "eval_rows": 64,
    "decode_contexts": [4096, 16384, 65536],
    "new_tokens": 16,
}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def run_postnas(
    teacher: nn.Module, tokenizer: Any, filler: list[str], settings: dict[str, Any]
) -> dict[str, Any]:
    """Every PostNAS step with ``settings`` (:data:`QUICK` or :data:`FULL`); the measurements."""
    rows = text_rows(tokenizer, "sharegpt", seq_len=settings["seq_len"],
                     num_texts=settings["num_texts"])  # fmt: skip
    examples = settings["probe_examples"]
    probes = default_probes(tokenizer, rows.validation, filler, examples=examples,
                            retrieval_context=settings["retrieval_context"])  # fmt: skip
    test_probes = default_probes(tokenizer, rows.validation[examples:], filler, examples=examples,
                                 retrieval_context=settings["retrieval_context"],
                                 seed=TEST_SEED)  # fmt: skip
    heldout = rows.validation[2 * examples : 2 * examples + settings["eval_rows"]]
    n = teacher.config.num_hidden_layers
    budget = settings["budget"]

    LOGGER.info("PostNAS 1/5: super-network")
    supernet = SuperNetwork(teacher, "jet")
    history = train_supernet(supernet, rows.train, settings["supernet"])

    LOGGER.info("PostNAS 2/5: placement search, budget %d", budget)
    search = search_placement(supernet, probes, budget, beam_width=settings["beam_width"])
    learned, uniform = search.placement, uniform_placement(n, budget)
    evaluator = PlacementEvaluator(supernet, test_probes)
    combined = evaluator.objective("combined")
    placements = {"learned": learned, "uniform": uniform}
    supernet_gaps = {
        name: {"combined": combined(p),
               **{t: evaluator.gap(p, t) for t in evaluator.separating_tasks()}}
        for name, p in placements.items()
    }  # fmt: skip

    LOGGER.info("PostNAS 3/5: linear-block selection at %s", learned)
    original_scores, blocks = select_block(
        teacher, rows.train, learned, probes, settings["blocks"], settings["block_training"]
    )

    LOGGER.info("PostNAS 4/5: hardware-aware search")
    layer_types = ["attn" if i in learned else "jet" for i in range(n)]
    lm = probes[0]
    hardware = search_hardware(
        teacher, layer_types, [JetShape(*s) for s in settings["hw_shapes"]], rows.train,
        quality=lambda model: -score_probe(model, lm).loss,
        distill_config=settings["hw_distill"], context=settings["hw_context"],
        new_tokens=settings["new_tokens"],
    )  # fmt: skip

    LOGGER.info("PostNAS 5/5: the hybrids of the learned and the uniform placement")
    hybrids = {name: supernet.to_hybrid(p) for name, p in placements.items()}
    models = {"original": teacher, **hybrids}
    final = {
        name: {
            "heldout_loss": heldout_loss(model, heldout),
            "probes": {p.name: score_probe(model, p) for p in test_probes},
        }
        for name, model in models.items()
    }
    decoding = decode_sweep(models, settings["decode_contexts"], settings["new_tokens"])
    return _plain({
        "num_layers": n,
        "budget": budget,
        "supernet_history": history,
        "search": search,
        "placements": placements,
        "supernet_gaps": supernet_gaps,
        "block_selection": {"original": original_scores, "ranked": blocks},
        "hardware": {"search": hardware.to_json(), "front": hardware.pareto_front()},
        "final": final,
        "decoding": decoding,
    })  # fmt: skip
