"""``tfla-mlstm reproduce``: the paper's claims at CPU scale, written as ``results.json``, PNG plots
and a Markdown summary."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from kernels_common.plotting import plot_curves
from kernels_common.report import write_summary
from kernels_common.results import Claim, ReproduceResults
from tfla_mlstm.reproduce.language_model import LMSettings, train_all
from tfla_mlstm.reproduce.scaling import log_log_slope, run_scaling

LOGGER = logging.getLogger(__name__)

QUICK = {
    "scaling_seq_lens": [256, 512, 1024, 2048],
    "scaling_repeat": 3,
    "lm": LMSettings(d_model=64, num_layers=2, num_heads=4, seq_len=128, batch_size=16,
                     steps=300, eval_every=50, eval_batches=8),
}  # fmt: skip
FULL = {
    "scaling_seq_lens": [256, 512, 1024, 2048, 4096, 8192],
    "scaling_repeat": 5,
    "lm": LMSettings(d_model=128, num_layers=4, num_heads=4, seq_len=256, batch_size=16,
                     steps=2000, eval_every=100, eval_batches=16),
}  # fmt: skip
SIG_TOLERANCE_NATS = 0.05


def _load_corpus():
    try:
        from benchdata import fortunes_corpus, lm_batch
    except ImportError as error:
        raise ImportError(
            "reproduce needs benchdata's fortunes corpus: pip install 'tfla-mlstm[reproduce]'"
        ) from error
    corpus = fortunes_corpus()
    return corpus.byte_tokens("train"), corpus.byte_tokens("validation"), lm_batch


def reproduce(out: Path, *, quick: bool = True) -> ReproduceResults:
    """Run both experiments into ``out`` and return the saved results."""
    start = time.perf_counter()
    settings = QUICK if quick else FULL
    out.mkdir(parents=True, exist_ok=True)
    train_tokens, validation_tokens, lm_batch = _load_corpus()

    LOGGER.info("scaling: fwd+bwd time and memory vs sequence length")
    scaling = run_scaling(out, settings["scaling_seq_lens"], settings["scaling_repeat"])
    slope = {name: log_log_slope(c["S"], c["MiB"]) for name, c in scaling.items()}

    LOGGER.info("language modelling on fortunes")
    lm = settings["lm"]
    curves = train_all(lm, train_tokens, validation_tokens, lm_batch)
    plot_curves(
        {name: (c["tokens"], c["val_loss"]) for name, c in curves.items()},
        out / "lm_validation_loss.png",
        title="fortunes, byte-level: validation loss",
        xlabel="training tokens",
        ylabel="cross-entropy (nats/byte)",
    )
    final = {name: c["val_loss"][-1] for name, c in curves.items()}
    gap = final["xLSTM (mLSTMsig)"] - final["xLSTM (mLSTM)"]
    claims = (
        Claim(
            name="mLSTMsig matches mLSTM",
            paper="the sigmoid-input-gate mLSTM reaches equal language-modelling quality",
            measured=gap,
            unit="nats/byte (mLSTMsig - mLSTM validation loss)",
            direction="within",
            threshold=0.0,
            tolerance=SIG_TOLERANCE_NATS,
        ),
        Claim(
            name="chunkwise memory is linear in S",
            paper="chunkwise kernels need memory linear in the sequence length",
            measured=slope["chunkwise (L=64)"],
            unit="log-log slope of peak memory vs S",
            direction="at_most",
            threshold=1.2,
            paper_value=1.0,
        ),
    )
    lines = ["| model | parameters | final validation loss |", "|---|---:|---:|"]
    lines += [f"| {n} | {c['params']:,} | {c['val_loss'][-1]:.4f} |" for n, c in curves.items()]
    lines += [
        "",
        "| implementation | "
        + " | ".join(f"S={s}" for s in settings["scaling_seq_lens"])
        + " | memory slope |",
        "|---|" + "---:|" * (len(settings["scaling_seq_lens"]) + 1),
    ]
    for name, c in scaling.items():
        cells = " | ".join(
            f"{ms:.0f} ms, {mib:.0f} MiB" for ms, mib in zip(c["ms"], c["MiB"], strict=True)
        )
        lines.append(f"| {name} | {cells} | {slope[name]:.2f} |")
    results = ReproduceResults(
        package="tfla-mlstm",
        title="TFLA mLSTM: linear-memory chunkwise kernels; mLSTMsig vs mLSTM language modelling",
        claims=claims,
        figures=("scaling_time.png", "scaling_memory.png", "lm_validation_loss.png"),
        summary="\n".join(lines),
        quick=quick,
        settings={
            "scaling_seq_lens": settings["scaling_seq_lens"],
            "lm": dict(vars(lm)),
            "lm_curves": curves,
            "scaling": scaling,
        },
        elapsed_s=time.perf_counter() - start,
    )
    results.save(out)
    write_summary(results, out)
    return results
