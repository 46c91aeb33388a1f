"""Claims, plots and the Markdown summary of ``jet-nemotron reproduce``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jet_nemotron.reproduce.postnas_report import postnas_claims, postnas_plots, postnas_summary
from kernels_common.plotting import plot_curves
from kernels_common.report import write_summary
from kernels_common.results import Claim, ReproduceResults

ORIGINAL, HYBRID = "SmolLM2-135M (all attention)", "hybrid"


def _by_context(points: list[dict[str, float]], key: str) -> dict[int, float]:
    return {int(p["context"]): p[key] for p in points}


def _jetblock_claims(measured: dict[str, Any]) -> tuple[Claim, ...]:
    losses = measured["heldout_loss"]
    gap_before = losses["hybrid, initialised"] - losses["original"]
    gap_after = losses["hybrid, distilled"] - losses["original"]
    speed = {n: _by_context(p, "tokens_per_s") for n, p in measured["decoding"].items()}
    size = {n: _by_context(p, "cache_bytes") for n, p in measured["decoding"].items()}
    common = sorted(set(speed[ORIGINAL]) & set(speed[HYBRID]))
    speedup = {c: speed[HYBRID][c] / speed[ORIGINAL][c] for c in common}
    passkey = measured["passkey"]
    passkey_gap = sum(passkey[HYBRID]) / len(passkey[HYBRID]) - sum(passkey[ORIGINAL]) / len(
        passkey[ORIGINAL]
    )
    return (
        Claim(
            name="distillation closes the loss gap",
            paper="training the new blocks against the original model recovers its quality",
            measured=gap_after - gap_before,
            unit="nats/token (gap after - gap before distillation)",
            direction="at_most",
            threshold=0.0,
        ),
        Claim(
            name="decoding speed-up grows with context",
            paper="the hybrid's generation speed-up grows with context length (53.6x at 256K "
            "tokens for Jet-Nemotron-2B on an H100)",
            measured=speedup[common[-1]] / speedup[common[0]],
            unit=f"speed-up at {common[-1]} / speed-up at {common[0]} tokens",
            direction="at_least",
            threshold=1.0,
        ),
        Claim(
            name="cache is smaller",
            paper="replacing attention by JetBlocks shrinks the KV cache that bounds decoding",
            measured=size[HYBRID][common[-1]] / size[ORIGINAL][common[-1]],
            unit=f"hybrid / original cache bytes at {common[-1]} tokens",
            direction="at_most",
            threshold=1.0,
        ),
        Claim(
            name="passkey retrieval kept",
            paper="Jet-Nemotron matches full-attention models on retrieval tasks",
            measured=passkey_gap,
            unit="hybrid - original passkey accuracy (mean over contexts)",
            direction="at_least",
            threshold=0.0,
        ),
    )


def _jetblock_plots(
    out: Path, measured: dict[str, Any], settings: dict[str, Any]
) -> tuple[str, ...]:
    decoding = measured["decoding"]
    contexts = {n: [p["context"] for p in ps] for n, ps in decoding.items()}
    plot_curves(
        {n: (contexts[n], [p["tokens_per_s"] for p in ps]) for n, ps in decoding.items()},
        out / "decode_throughput.png", title="greedy decoding after a filled cache (batch 1, CPU)",
        xlabel="context (tokens)", ylabel="tokens / s", logx=True, logy=True, markers=True,
    )  # fmt: skip
    plot_curves(
        {n: (contexts[n], [p["cache_bytes"] / 2**20 for p in ps]) for n, ps in decoding.items()},
        out / "cache_size.png", title="cache held while decoding", xlabel="context (tokens)",
        ylabel="MiB", logx=True, logy=True, markers=True,
    )  # fmt: skip
    history = measured["distill_history"]
    curves = {
        name: (list(range(1, len(losses) + 1)), losses)
        for name, losses in (
            ("layer-wise (relative MSE)", history["layerwise"]),
            ("end-to-end (KL + hidden)", history["end_to_end"]),
        )
        if losses
    }
    plot_curves(curves, out / "distillation.png", title="distillation losses", xlabel="step",
                ylabel="loss", logy=True)  # fmt: skip
    contexts = settings["passkey_contexts"]
    plot_curves(
        {n: (contexts, acc) for n, acc in measured["passkey"].items()}, out / "passkey.png",
        title="passkey retrieval", xlabel="context (tokens)", ylabel="accuracy", markers=True,
    )  # fmt: skip
    return ("decode_throughput.png", "cache_size.png", "distillation.png", "passkey.png")


def _jetblock_summary(measured: dict[str, Any], settings: dict[str, Any]) -> str:
    losses = measured["heldout_loss"]
    lines = [
        f"Full attention kept in layers {measured['kept_attention_layers']} of "
        f"{len(measured['layer_types'])}; the others are JetBlocks initialised from their "
        "attention, distilled on ShareGPT first exchanges.",
        "",
        "| model | held-out loss (nats/token) | gap to original |",
        "|---|---:|---:|",
    ]
    lines += [f"| {n} | {v:.3f} | {v - losses['original']:+.3f} |" for n, v in losses.items()]
    contexts = settings["passkey_contexts"]
    lines += ["", "| passkey accuracy | " + " | ".join(f"{c} tokens" for c in contexts) + " |",
              "|---|" + "---:|" * len(contexts)]  # fmt: skip
    lines += [f"| {n} | " + " | ".join(f"{a:.2f}" for a in acc) + " |"
              for n, acc in measured["passkey"].items()]  # fmt: skip
    decoding = measured["decoding"]
    all_contexts = sorted({int(p["context"]) for ps in decoding.values() for p in ps})
    lines += ["", "| decoding | " + " | ".join(f"{c} tokens" for c in all_contexts) + " |",
              "|---|" + "---:|" * len(all_contexts)]  # fmt: skip
    for name, points in decoding.items():
        speed, size = _by_context(points, "tokens_per_s"), _by_context(points, "cache_bytes")
        cells = [
            f"{speed[c]:.1f} tok/s, {size[c] / 2**20:.0f} MiB" if c in speed else "skipped"
            for c in all_contexts
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(
    out: Path,
    measured: dict[str, dict[str, Any]],
    settings: dict[str, dict[str, Any]],
    quick: bool,
    elapsed: float,
) -> ReproduceResults:
    """Save ``results.json``, the plots and ``summary.md`` of the parts run (``measured`` and
    ``settings`` keyed by part) into ``out``."""
    claims: list[Claim] = []
    figures: list[str] = []
    summary: list[str] = []
    if "jetblock" in measured:
        claims += _jetblock_claims(measured["jetblock"])
        figures += _jetblock_plots(out, measured["jetblock"], settings["jetblock"])
        summary.append(_jetblock_summary(measured["jetblock"], settings["jetblock"]))
    if "postnas" in measured:
        claims += postnas_claims(measured["postnas"])
        figures += postnas_plots(out, measured["postnas"])
        summary.append(postnas_summary(measured["postnas"]))
    results = ReproduceResults(
        package="jet-nemotron",
        title="SmolLM2-135M hybrids: JetBlock distillation, retrieval, decoding speed, PostNAS",
        claims=tuple(claims),
        figures=tuple(figures),
        summary="\n\n".join(summary),
        quick=quick,
        settings={part: {**settings[part], "measured": measured[part]} for part in measured},
        elapsed_s=elapsed,
    )
    results.save(out)
    write_summary(results, out)
    return results
