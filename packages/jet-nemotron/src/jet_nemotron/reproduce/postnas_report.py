"""Claims, plots and summary of the PostNAS part of ``jet-nemotron reproduce``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jet_nemotron.postnas.hardware import HardwareSearch, plot_pareto
from kernels_common.plotting import plot_curves
from kernels_common.results import Claim

DEFAULT_SHAPE = (9, 64, 64)  # SmolLM2-135M's attention shape


def _speed(measured: dict[str, Any], name: str) -> dict[int, float]:
    return {int(p["context"]): p["tokens_per_s"] for p in measured["decoding"][name]}


def postnas_claims(measured: dict[str, Any]) -> tuple[Claim, ...]:
    gaps = measured["supernet_gaps"]
    single = measured["search"]["single_layer"]
    records = {(r["num_heads"], r["head_dim"], r["head_v_dim"]): r
               for r in measured["hardware"]["search"]["records"]}  # fmt: skip
    if DEFAULT_SHAPE not in records:
        raise ValueError(f"the hardware search must include the default shape {DEFAULT_SHAPE}")
    default = records.pop(DEFAULT_SHAPE)
    speeds = [r["tokens_per_s"] for r in (default, *records.values())]
    speed = {n: _speed(measured, n) for n in ("original", "learned")}
    longest = max(speed["learned"])
    claims = [
        Claim(
            name="learned placement beats uniform",
            paper="PostNAS's learned placement of full-attention layers beats uniform placement "
            "at the same number of attention layers",
            measured=gaps["uniform"]["combined"] - gaps["learned"]["combined"],
            unit="mean normalised gap on held-out probes the search did not see, uniform - "
            "learned (super-network weights)",
            direction="at_least",
            threshold=0.0,
        ),
        Claim(
            name="hardware-aware shape beats the default",
            paper="at a fixed KV-cache (state) size, the searched key/value dims and heads give "
            "higher accuracy than the original design",
            measured=max(r["quality"] for r in records.values()) - default["quality"],
            unit=f"best other shape's quality - the {DEFAULT_SHAPE} shape's (nats/token of the "
            "LM probe)",
            direction="at_least",
            threshold=0.0,
        ),
        Claim(
            name="throughput is set by the state size",
            paper="generation throughput is bound by the KV cache / state size more than by "
            "parameter count, so shapes of equal state size decode at similar speed",
            measured=min(speeds) / max(speeds),
            unit="slowest / fastest shape's tokens/s at equal state size",
            direction="at_least",
            threshold=0.8,
        ),
        Claim(
            name="hybrid decodes faster",
            paper="the hybrid generates faster than its full-attention source at long context",
            measured=speed["learned"][longest] / speed["original"][longest],
            unit=f"learned-placement hybrid / original tokens/s at {longest} tokens",
            direction="at_least",
            threshold=1.0,
        ),
    ]
    if "retrieval" in single:
        claims.insert(1, Claim(
            name="retrieval depends on few layers",
            paper="only a few attention layers are critical for retrieval",
            measured=1.0 - min(single["retrieval"]),
            unit="share of the retrieval gap recovered by the best single attention layer",
            direction="at_least",
            threshold=0.5,
        ))  # fmt: skip
    return tuple(claims)


def postnas_plots(out: Path, measured: dict[str, Any]) -> tuple[str, ...]:
    single = measured["search"]["single_layer"]
    layers = list(range(measured["num_layers"]))
    plot_curves(
        {task: (layers, [1.0 - g for g in gaps]) for task, gaps in single.items()},
        out / "postnas_importance.png",
        title="gap recovered when one layer alone keeps attention (super-network)",
        xlabel="layer", ylabel="share of the task's gap recovered", markers=True,
    )  # fmt: skip
    history = measured["supernet_history"]
    first = len(history["layerwise"])
    curves = {name: (list(range(offset + 1, offset + len(v) + 1)), v)
              for name, v, offset in (("layer-wise", history["layerwise"], 0),
                                      ("sampled paths", history["paths"], first)) if v}  # fmt: skip
    plot_curves(curves, out / "postnas_supernet.png", title="super-network training",
                xlabel="step", ylabel="loss", logy=True)  # fmt: skip
    plot_pareto(HardwareSearch.from_json(measured["hardware"]["search"]),
                out / "postnas_pareto.png")  # fmt: skip
    return ("postnas_importance.png", "postnas_supernet.png", "postnas_pareto.png")


def postnas_summary(measured: dict[str, Any]) -> str:
    search, final = measured["search"], measured["final"]
    lines = [
        "### PostNAS",
        "",
        f"Placement search (budget {measured['budget']}): learned "
        f"{measured['placements']['learned']}, uniform {measured['placements']['uniform']}. "
        "Probes without a gap between all and no attention (left out of the search): "
        f"{search['unseparated'] or 'none'}.",
        "",
        "| task | most important layers (alone) |",
        "|---|---|",
    ]
    lines += [f"| {t} | {order[:3]} |" for t, order in search["important_layers"].items()]
    tasks = list(final["original"]["probes"])
    lines += ["", "Held-out probes the search did not see:", "",
              "| model | held-out loss | " + " | ".join(f"{t} loss / acc" for t in tasks) + " |",
              "|---|---:|" + "---:|" * len(tasks)]  # fmt: skip
    for name, result in final.items():
        cells = [f"{result['probes'][t]['loss']:.3f} / {result['probes'][t]['accuracy']:.2f}"
                 for t in tasks]  # fmt: skip
        lines.append(f"| {name} | {result['heldout_loss']:.3f} | " + " | ".join(cells) + " |")
    selection = measured["block_selection"]
    lines += ["", "| block (at the learned placement) | excess loss (nats) | params / layer | "
              "state floats / layer |", "|---|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {r['block']} | {r['excess_loss']:+.3f} | {r['parameters']:,} | "
              f"{r['state_numel']:,} |" for r in selection["ranked"]]  # fmt: skip
    lines += ["", "| JetBlock shape (H x Dk x Dv) | quality (-LM loss) | tokens/s | params |",
              "|---|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {r['num_heads']}x{r['head_dim']}x{r['head_v_dim']} | {r['quality']:.3f} | "
              f"{r['tokens_per_s']:.1f} | {r['jet_params']:,} |"
              for r in measured["hardware"]["search"]["records"]]  # fmt: skip
    return "\n".join(lines)
