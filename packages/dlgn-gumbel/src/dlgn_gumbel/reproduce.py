"""``dlgn-gumbel reproduce``: softmax vs Gumbel logic gate networks on Fashion-MNIST.

The same network (thermometer-encoded pixels, unique connections, GroupSum) is trained with the
softmax relaxation and with Gumbel noise + straight-through for the same training time, measured
as this process's CPU time with torch on one thread, so other load on a shared machine does not
favour either run. Recorded next to the paper's claims: the discretization gap, unused neurons,
time to a target discretized accuracy, final discretized accuracy and compiled throughput.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dlgn_gumbel.bench import images_per_second
from dlgn_gumbel.compiled import compile_logic_net
from dlgn_gumbel.data import load_images
from dlgn_gumbel.metrics import gate_usage
from dlgn_gumbel.train import TrainConfig, TrainResult, train
from kernels_common import cli
from kernels_common.report import write_summary
from kernels_common.results import Claim, ReproduceResults

logger = logging.getLogger(__name__)

__all__ = ["ReproduceSettings", "run"]

# the paper's headline numbers (abstract of Yousefi et al. 2025)
PAPER_GAP_REDUCTION = 98.0  # %
PAPER_UNUSED_REDUCTION = 100.0  # %
PAPER_SPEEDUP = 4.5  # x wall-clock
DIFFLOGIC_THROUGHPUT = 1e6  # MNIST images/s on one CPU core (difflogic's compiled C)


@dataclass(frozen=True)
class ReproduceSettings:
    """Sizes of one reproduce run (``quick`` or full)."""

    train_subset: int | None
    test_subset: int | None
    layer_sizes: tuple[int, ...]
    budget_s: float  # training CPU time per relaxation
    eval_every: int
    num_thresholds: int = 3
    tau: float = 10.0
    batch_size: int = 128
    connections: str = "unique"
    target_fraction: float = 0.98


# The paper's recipe (its code, shakiryousefi/gumbel-lgn): N(0, 1) logits, Adam lr 0.01, batch 128,
# Gumbel temperature 1, grad_factor 1, "unique" connections, deep networks (5 to 12 layers). Scaled
# down here to difflogic's small-image setting (6 layers, GroupSum tau 10) at a CPU-sized width.
QUICK = ReproduceSettings(
    train_subset=20_000, test_subset=2_000, layer_sizes=(2000,) * 6, budget_s=110.0, eval_every=200
)
FULL = ReproduceSettings(
    train_subset=None, test_subset=None, layer_sizes=(8000,) * 6, budget_s=1800.0, eval_every=1000
)


def _time_to(history: list[dict[str, float]], target: float) -> float:
    """Training time of the first evaluation reaching ``target`` discretized accuracy (inf if
    none does)."""
    for row in history:
        if row["discrete_acc"] >= target:
            return row["train_time_s"]
    return float("inf")


def _reduction(before: float, after: float) -> float:
    """Relative reduction of a magnitude in % (100 = removed entirely, negative = grew); compares
    absolute values, so a gap of the other sign counts by its size."""
    before, after = abs(before), abs(after)
    if before == 0:
        return float("nan")
    return 100.0 * (before - after) / before


def run(
    out: Path,
    *,
    quick: bool = True,
    threads: int = 0,
    settings: ReproduceSettings | None = None,
) -> ReproduceResults:
    """Train both relaxations, write plots, ``results.json`` and ``summary.md`` into ``out``
    (all of them at the end, or none if the run fails).

    ``settings`` overrides the quick/full sizes (tests use a tiny run)."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads or 1)
    try:
        # everything is written into a temporary folder and moved into ``out`` (created only
        # then) at the end: a failed or interrupted run leaves no partial results behind
        with cli.atomic_folder(out) as staging:
            return _run(staging, quick, settings)
    finally:
        torch.set_num_threads(previous_threads)


def _run(out: Path, quick: bool, settings: ReproduceSettings | None) -> ReproduceResults:
    from kernels_common.plotting import plot_curves

    started = time.perf_counter()
    if settings is None:
        settings = QUICK if quick else FULL
    full_data = load_images("fashion-mnist")
    data = full_data.subset(settings.train_subset, settings.test_subset)
    runs: dict[str, TrainResult] = {}
    for relaxation in ("softmax", "gumbel"):
        config = TrainConfig(
            layer_sizes=settings.layer_sizes,
            num_thresholds=settings.num_thresholds,
            tau=settings.tau,
            relaxation=relaxation,
            batch_size=settings.batch_size,
            connections=settings.connections,
            steps=10**9,
            time_budget_s=settings.budget_s,
            eval_every=settings.eval_every,
            clock="process",
        )
        runs[relaxation] = train(
            config, data.x_train, data.y_train, data.x_test, data.y_test, num_classes=10
        )
    soft, gumb = runs["softmax"], runs["gumbel"]

    def final(result: TrainResult, key: str) -> float:
        return result.history[-1][key]

    gaps = {k: final(r, "train_mode_acc") - final(r, "discrete_acc") for k, r in runs.items()}
    usage = {k: gate_usage(r.net) for k, r in runs.items()}
    best = {k: max(row["discrete_acc"] for row in r.history) for k, r in runs.items()}
    target = settings.target_fraction * min(best.values())
    t_target = {k: _time_to(r.history, target) for k, r in runs.items()}

    # compiled inference of the Gumbel net on all 10,000 test images, one core
    bits = soft.encoder(full_data.x_test) > 0.5
    compiled = compile_logic_net(gumb.net)
    torch_scores = gumb.net.eval()(bits.float())
    exact = bool(torch.equal(compiled.scores(bits), torch_scores))
    compiled_ips = images_per_second(lambda: compiled.predict(bits), bits.shape[0])
    with torch.no_grad():
        torch_ips = images_per_second(lambda: gumb.net(bits.float()), bits.shape[0], repeat=3)

    claims = (
        Claim(
            "discretization gap reduction",
            "Gumbel noise reduces the discretization gap by 98%",
            _reduction(gaps["softmax"], gaps["gumbel"]),
            "%",
            "at_least",
            0.8 * PAPER_GAP_REDUCTION,
            paper_value=PAPER_GAP_REDUCTION,
        ),
        Claim(
            "unused neuron reduction",
            "Gumbel noise reduces unused gates by 100%",
            _reduction(usage["softmax"].unused, usage["gumbel"].unused),
            "%",
            "at_least",
            0.8 * PAPER_UNUSED_REDUCTION,
            paper_value=PAPER_UNUSED_REDUCTION,
        ),
        Claim(
            "time-to-target speedup",
            "4.5x faster training (time to a discretized accuracy)",
            t_target["softmax"] / t_target["gumbel"],
            "x",
            "at_least",
            0.8 * PAPER_SPEEDUP,
            paper_value=PAPER_SPEEDUP,
        ),
        Claim(
            "discretized test accuracy (Gumbel)",
            "Fashion-MNIST discretized accuracy >= 85% (full run)",
            100 * final(gumb, "discrete_acc"),
            "%",
            "at_least",
            85.0,
        ),
        Claim(
            "compiled throughput",
            "difflogic's compiled C: > 1M MNIST images/s on one core",
            compiled_ips,
            "images/s",
            "at_least",
            DIFFLOGIC_THROUGHPUT,
            paper_value=DIFFLOGIC_THROUGHPUT,
        ),
        Claim(
            "compiled == torch eval (exact)",
            "the compiled Boolean program is exactly the discretized network",
            float(exact),
            "bool",
            "at_least",
            1.0,
        ),
    )

    figures = []
    for key, label in (("discrete_acc", "discretized"), ("train_mode_acc", "training mode")):
        curves = {
            name: (
                [row["train_time_s"] for row in r.history],
                [row[key] for row in r.history],
            )
            for name, r in runs.items()
        }
        path = plot_curves(
            curves,
            out / f"accuracy_{key}.png",
            title=f"Fashion-MNIST test accuracy, {label}",
            xlabel="training CPU time (s, one thread)",
            ylabel="accuracy",
        )
        figures.append(path.name)

    rows = {
        name: {
            "steps": r.steps,
            "train_time_s": r.train_time_s,
            "train_mode_acc": final(r, "train_mode_acc"),
            "discrete_acc": final(r, "discrete_acc"),
            "best_discrete_acc": best[name],
            "gap": gaps[name],
            "time_to_target_s": t_target[name] if t_target[name] < float("inf") else None,
            "unused": usage[name].unused,
            "pass_through_or_constant": usage[name].pass_through_or_constant,
            "dead": usage[name].dead,
            "neurons": usage[name].total,
            "history": r.history,
        }
        for name, r in runs.items()
    }
    summary = (
        f"Fashion-MNIST ({data.x_train.shape[0]} train / {data.x_test.shape[0]} test images), "
        f"{settings.num_thresholds} thermometer thresholds, logic layers "
        f"{'x'.join(map(str, settings.layer_sizes))} ({settings.connections} connections), "
        f"GroupSum tau {settings.tau}, Adam lr 0.01, "
        f"batch {settings.batch_size}; each relaxation trained for {settings.budget_s:.0f} s of "
        f"CPU time on one thread. Softmax: {rows['softmax']['steps']} steps, discretized "
        f"{rows['softmax']['discrete_acc']:.4f}, training mode "
        f"{rows['softmax']['train_mode_acc']:.4f}, unused {usage['softmax'].unused}/"
        f"{usage['softmax'].total}. Gumbel: {rows['gumbel']['steps']} steps, discretized "
        f"{rows['gumbel']['discrete_acc']:.4f}, training mode "
        f"{rows['gumbel']['train_mode_acc']:.4f}, unused {usage['gumbel'].unused}/"
        f"{usage['gumbel'].total}. Target accuracy {target:.4f} "
        f"({settings.target_fraction:.0%} of the lower best): softmax "
        f"{t_target['softmax']:.0f} s, Gumbel {t_target['gumbel']:.0f} s. Compiled Gumbel net "
        f"({compiled.num_gates} gates after pruning, {compiled.engine} engine): "
        f"{compiled_ips:,.0f} images/s vs torch eval {torch_ips:,.0f} images/s, one thread."
    )
    results = ReproduceResults(
        package="dlgn-gumbel",
        title="Gumbel vs softmax logic gate networks on Fashion-MNIST, equal training time",
        claims=claims,
        figures=tuple(figures),
        summary=summary,
        quick=quick,
        settings={
            **asdict(settings),
            "target_accuracy": target,
            "runs": rows,
            "torch_eval_images_per_s": torch_ips,
        },
        elapsed_s=time.perf_counter() - started,
    )
    results.save(out)
    write_summary(results, out)
    return results
