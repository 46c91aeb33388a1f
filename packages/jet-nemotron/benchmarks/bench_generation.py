"""Decoding throughput and cache size vs context: a SmolLM2-135M hybrid vs SmolLM2-135M.

    python packages/jet-nemotron/benchmarks/bench_generation.py --attention-layers 0 1 24 \
        --seq-lens 1024 4096 16384 65536 --out DIR

The same as ``jet-nemotron bench generation``: contexts are caches filled with random content
(see ``jet_nemotron.bench.generation``); a JSON table goes to ``--out``.
"""

from __future__ import annotations

import sys

from jet_nemotron.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", "generation", *sys.argv[1:]]))
