"""Decoding throughput and cache size vs context: a SmolLM2-135M hybrid vs SmolLM2-135M.

    python packages/jet-nemotron/benchmarks/bench_generation.py --attention-layers 0 1 24 \
        --seq-lens 1024 4096 16384 65536 --out DIR

The same as ``jet-nemotron bench generation``: contexts are caches filled with random content
(see ``jet_nemotron.bench.generation``); a JSON table goes to ``--out``. Without a layer choice
the hybrid keeps full attention in layers 0, 1 and 24, those ``reproduce`` keeps (the ones whose
attention matters most for SmolLM2's held-out loss); for speed only their number matters.
"""

from __future__ import annotations

import sys

from jet_nemotron.__main__ import main

REPRODUCE_ATTENTION_LAYERS = ["0", "1", "24"]

if __name__ == "__main__":
    arguments = sys.argv[1:]
    if not {"--attention-layers", "--layer-types"} & set(arguments):
        arguments += ["--attention-layers", *REPRODUCE_ATTENTION_LAYERS]
    raise SystemExit(main(["bench", "generation", *arguments]))
