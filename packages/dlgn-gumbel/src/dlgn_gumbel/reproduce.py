"""``dlgn-gumbel reproduce``: softmax vs Gumbel logic gate networks on Fashion-MNIST.

Four arms on the same network (thermometer-encoded pixels, unique connections, GroupSum): the
softmax relaxation and Gumbel noise + straight-through, each from the published N(0, 1) logits and
from the authors' later residual init (logit ``init_sigma`` on the pass-through gate A). Each arm
trains for the same training time, measured as this process's CPU time with torch on one thread,
so other load on a shared machine favours none; equal-step numbers are read from the same runs.
Beside them: the gradient-agreement diagnostic at initialisation (why a deep Gumbel network from
N(0, 1) logits does not learn), and a depth x width sweep at equal steps mapping where each arm
learns. Recorded next to the paper's claims: the discretization gap, unused neurons, time to a
target discretized accuracy, final discretized accuracy and compiled throughput.
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
from dlgn_gumbel.diagnose import gradient_agreement
from dlgn_gumbel.layers import LogicNet
from dlgn_gumbel.metrics import GateUsage, gate_usage
from dlgn_gumbel.train import TrainConfig, TrainResult, batch_indices, train
from kernels_common import cli
from kernels_common.report import write_summary
from kernels_common.results import Claim, ReproduceResults

logger = logging.getLogger(__name__)

__all__ = ["ARMS", "ReproduceSettings", "run"]

# the paper's headline numbers (abstract of Yousefi et al. 2025)
PAPER_GAP_REDUCTION = 98.0  # %
PAPER_UNUSED_REDUCTION = 100.0  # %
PAPER_SPEEDUP = 4.5  # x wall-clock
DIFFLOGIC_THROUGHPUT = 1e6  # MNIST images/s on one CPU core (difflogic's compiled C)

# arm name -> (relaxation, init)
ARMS: dict[str, tuple[str, str]] = {
    "softmax": ("softmax", "randn"),
    "gumbel": ("gumbel", "randn"),
    "softmax+residual": ("softmax", "residual"),
    "gumbel+residual": ("gumbel", "residual"),
}
# the softmax / Gumbel pairs the paper's claims are checked on: (label, softmax arm, Gumbel arm)
PAIRS = (("N(0, 1) init", "softmax", "gumbel"), ("residual init", "softmax+residual",
         "gumbel+residual"))  # fmt: skip
SWEEP_ARMS = ("softmax", "gumbel", "gumbel+residual")
# the two readings of the paper's "unused gates": (claim name, GateUsage field, definition)
UNUSED_DEFINITIONS = (
    ("uncollapsed", "uncollapsed", "gate distributions that have not collapsed onto one gate"),
    ("structurally unused", "unused",
     "pass-through, negation, constant or dead neurons of the discretized network"),
)  # fmt: skip


@dataclass(frozen=True)
class ReproduceSettings:
    """Sizes of one reproduce run (``quick`` or full)."""

    train_subset: int | None
    test_subset: int | None
    layer_sizes: tuple[int, ...]
    budget_s: float  # training CPU time per arm
    eval_every: int
    sweep_depths: tuple[int, ...] = (2, 4, 6)
    sweep_widths: tuple[int, ...] = (1200, 2400)
    sweep_steps: int = 800
    diagnose_draws: int = 32
    num_thresholds: int = 3
    tau: float = 10.0
    batch_size: int = 128
    connections: str = "unique"
    init_sigma: float = 5.0
    target_fraction: float = 0.98

    def __post_init__(self) -> None:
        # refused before any training: unique connections read every input of a layer
        if self.connections != "random":
            in_bits = 784 * self.num_thresholds  # Fashion-MNIST pixels x thresholds
            first = min(self.layer_sizes[0], *self.sweep_widths)
            if 2 * first < in_bits:
                raise ValueError(
                    f"connections={self.connections!r} needs every first layer at least "
                    f"{(in_bits + 1) // 2} wide for {in_bits} input bits; got {first}"
                )


# The paper's recipe (its code, shakiryousefi/gumbel-lgn): N(0, 1) logits, Adam lr 0.01, Gumbel
# temperature 1, grad_factor 1, deep networks (5 to 12 layers). Scaled down here to difflogic's
# small-image setting (6 layers, GroupSum tau 10, batch 128) at a CPU-sized width, with this
# package's "unique" connections and feature-major bits (the authors' are options; see
# benchmarks/paper_width.py).
QUICK = ReproduceSettings(
    train_subset=20_000, test_subset=2_000, layer_sizes=(2000,) * 6, budget_s=55.0, eval_every=200
)
FULL = ReproduceSettings(
    train_subset=None,
    test_subset=None,
    layer_sizes=(8000,) * 6,
    budget_s=1800.0,
    eval_every=1000,
    sweep_depths=(2, 4, 6, 8, 10),
    sweep_widths=(2000, 8000),
    sweep_steps=3000,
    diagnose_draws=64,
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
    """Train the four arms and the sweep, write plots, ``results.json`` and ``summary.md`` into
    ``out``
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


def _config(
    settings: ReproduceSettings, arm: str, layer_sizes: tuple[int, ...], **kwargs
) -> TrainConfig:
    relaxation, init = ARMS[arm]
    return TrainConfig(
        layer_sizes=layer_sizes,
        num_thresholds=settings.num_thresholds,
        tau=settings.tau,
        relaxation=relaxation,
        init=init,
        init_sigma=settings.init_sigma,
        batch_size=settings.batch_size,
        connections=settings.connections,
        clock="process",
        **kwargs,
    )


def _row_at(history: list[dict[str, float]], step: int) -> dict[str, float]:
    return next(row for row in history if row["step"] == step)


def _usage_row(usage: GateUsage) -> dict[str, float]:
    return {
        "neurons": usage.total,
        "constant": usage.constant,
        "pass_through": usage.pass_through,
        "negation": usage.negation,
        "dead": usage.dead,
        "unused": usage.unused,
        "uncollapsed": usage.uncollapsed,
        "mean_entropy_bits": usage.mean_entropy_bits,
    }


def _cosine_range(rows, key: str, layers: slice) -> str:
    values = [getattr(row, key) for row in rows[layers]]
    return f"{min(values):.3f} to {max(values):.3f}"


def _run(out: Path, quick: bool, settings: ReproduceSettings | None) -> ReproduceResults:
    from kernels_common.plotting import plot_curves

    started = time.perf_counter()
    if settings is None:
        settings = QUICK if quick else FULL
    full_data = load_images("fashion-mnist")
    data = full_data.subset(settings.train_subset, settings.test_subset)
    train_args = (data.x_train, data.y_train, data.x_test, data.y_test)
    pixels, classes = data.x_train.shape[1], data.num_classes

    # 1. at initialisation: noisy vs softmax logit gradients on one training batch
    idx = batch_indices(data.x_train.shape[0], settings.batch_size, 0, 0)
    probe = _config(settings, "gumbel", settings.layer_sizes)
    x_probe, y_probe = probe.encoder()(data.x_train[idx]), data.y_train[idx]
    diagnosis = {}
    for init in ("randn", "residual"):
        for noise in ("shared", "per_example"):
            config = _config(settings, "gumbel" if init == "randn" else "gumbel+residual",
                             settings.layer_sizes, noise=noise)  # fmt: skip
            net = LogicNet.from_config(config.net_config(pixels, classes))
            diagnosis[f"{init}, {noise} noise"] = gradient_agreement(
                net, x_probe, y_probe, draws=settings.diagnose_draws, noise=noise
            )

    # 2. the four arms, equal training time
    runs: dict[str, TrainResult] = {}
    for arm in ARMS:
        config = _config(
            settings,
            arm,
            settings.layer_sizes,
            steps=10**9,
            time_budget_s=settings.budget_s,
            eval_every=settings.eval_every,
        )
        runs[arm] = train(config, *train_args, num_classes=classes)

    # 3. depth x width at equal steps
    sweep = []
    for width in settings.sweep_widths:
        for depth in settings.sweep_depths:
            for arm in SWEEP_ARMS:
                config = _config(settings, arm, (width,) * depth, steps=settings.sweep_steps,
                                 eval_every=settings.sweep_steps)  # fmt: skip
                result = train(config, *train_args, num_classes=classes, progress=False)
                last = result.history[-1]
                sweep.append({"arm": arm, "width": width, "depth": depth,
                              "discrete_acc": last["discrete_acc"],
                              "train_mode_acc": last["train_mode_acc"],
                              "train_time_s": result.train_time_s})  # fmt: skip

    def final(result: TrainResult, key: str) -> float:
        return result.history[-1][key]

    gaps = {k: final(r, "train_mode_acc") - final(r, "discrete_acc") for k, r in runs.items()}
    usage = {k: gate_usage(r.net) for k, r in runs.items()}
    best = {k: max(row["discrete_acc"] for row in r.history) for k, r in runs.items()}
    # equal steps: the last evaluation every arm reached (none if an arm stopped before its first)
    shared_steps = set.intersection(*({row["step"] for row in r.history} for r in runs.values()))
    common_step = max(shared_steps, default=None)
    equal_steps = {
        k: _row_at(r.history, common_step) for k, r in runs.items() if common_step is not None
    }
    targets, t_target = {}, {}
    for label, soft_arm, gumbel_arm in PAIRS:
        # the softmax arm's accuracy is the bar: a Gumbel arm that never reaches it is not faster
        targets[label] = settings.target_fraction * best[soft_arm]
        for arm in (soft_arm, gumbel_arm):
            t_target[(label, arm)] = _time_to(runs[arm].history, targets[label])

    # compiled inference of the residual Gumbel net on all 10,000 test images, one core
    encoder = probe.encoder()
    bits = encoder(full_data.x_test) > 0.5
    deployed = runs["gumbel+residual"].net
    compiled = compile_logic_net(deployed)
    exact = bool(torch.equal(compiled.scores(bits), deployed.eval()(bits.float())))
    compiled_ips = images_per_second(lambda: compiled.predict(bits), bits.shape[0])

    claims = []
    for label, soft_arm, gumbel_arm in PAIRS:
        claims += [
            Claim(
                f"discretization gap reduction ({label})",
                "Gumbel noise reduces the discretization gap by 98%",
                _reduction(gaps[soft_arm], gaps[gumbel_arm]),
                "%",
                "at_least",
                0.8 * PAPER_GAP_REDUCTION,
                paper_value=PAPER_GAP_REDUCTION,
            ),
            *(
                Claim(
                    f"{name} neuron reduction ({label})",
                    f"Gumbel noise reduces unused gates by 100% ({definition})",
                    _reduction(getattr(usage[soft_arm], key), getattr(usage[gumbel_arm], key)),
                    "%",
                    "at_least",
                    0.8 * PAPER_UNUSED_REDUCTION,
                    paper_value=PAPER_UNUSED_REDUCTION,
                )
                for name, key, definition in UNUSED_DEFINITIONS
            ),
            Claim(
                f"time-to-target speedup ({label})",
                "4.5x faster training (time to 98% of the softmax network's best discretized "
                "accuracy; 0 if the Gumbel network never reaches it)",
                t_target[(label, soft_arm)] / t_target[(label, gumbel_arm)],
                "x",
                "at_least",
                0.8 * PAPER_SPEEDUP,
                paper_value=PAPER_SPEEDUP,
            ),
        ]
    claims += [
        Claim(
            "discretized test accuracy (Gumbel, residual init)",
            "Fashion-MNIST discretized accuracy >= 85% (full run)",
            100 * final(runs["gumbel+residual"], "discrete_acc"),
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
    ]

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
    sweep_curves = {
        f"{arm}, width {width}": (
            [row["depth"] for row in sweep if row["arm"] == arm and row["width"] == width],
            [row["discrete_acc"] for row in sweep if row["arm"] == arm and row["width"] == width],
        )
        for arm in SWEEP_ARMS
        for width in settings.sweep_widths
    }
    path = plot_curves(
        sweep_curves,
        out / "sweep_depth.png",
        title=f"discretized test accuracy after {settings.sweep_steps} steps",
        xlabel="logic layers",
        ylabel="accuracy",
        markers=True,
    )
    figures.append(path.name)

    rows = {
        name: {
            "relaxation": ARMS[name][0],
            "init": ARMS[name][1],
            "steps": r.steps,
            "train_time_s": r.train_time_s,
            "train_mode_acc": final(r, "train_mode_acc"),
            "discrete_acc": final(r, "discrete_acc"),
            "best_discrete_acc": best[name],
            "gap": gaps[name],
            "equal_steps": equal_steps.get(name),
            **_usage_row(usage[name]),
            "history": r.history,
        }
        for name, r in runs.items()
    }
    layers_below_top = slice(0, max(len(settings.layer_sizes) - 1, 1))
    plain, resid = diagnosis["randn, shared noise"], diagnosis["residual, shared noise"]
    per_example = diagnosis["randn, per_example noise"]
    arms_text = "; ".join(
        f"{name}: {rows[name]['steps']} steps, discretized {rows[name]['discrete_acc']:.4f}, "
        f"training mode {rows[name]['train_mode_acc']:.4f}, uncollapsed "
        f"{rows[name]['uncollapsed']}/{rows[name]['neurons']}, structurally unused "
        f"{rows[name]['unused']}"
        for name in ARMS
    )
    summary = (
        f"Fashion-MNIST ({data.x_train.shape[0]} train / {data.x_test.shape[0]} test images), "
        f"{settings.num_thresholds} thermometer thresholds, logic layers "
        f"{'x'.join(map(str, settings.layer_sizes))} ({settings.connections} connections), "
        f"GroupSum tau {settings.tau}, Adam lr 0.01, batch {settings.batch_size}; each arm "
        f"trained for {settings.budget_s:.0f} s of CPU time on one thread. {arms_text}. "
        f"Discretized accuracy at equal steps ({common_step}): "
        + ", ".join(f"{k} {v['discrete_acc']:.4f}" for k, v in equal_steps.items())
        + ". Gradient agreement at initialisation ("
        f"{settings.diagnose_draws} draws, one batch): with N(0, 1) logits cos(one Gumbel draw, "
        f"softmax gradient) is {_cosine_range(plain.layers, 'cos_draw_softmax', layers_below_top)}"
        f" below the top layer and cos(draw, mean of draws) "
        f"{_cosine_range(plain.layers, 'cos_draw_mean', layers_below_top)} (pure noise: "
        f"{plain.pure_noise_reference:.3f}); per-example noise: "
        f"{_cosine_range(per_example.layers, 'cos_draw_softmax', layers_below_top)}; residual "
        f"init: {_cosine_range(resid.layers, 'cos_draw_softmax', layers_below_top)}. Compiled "
        f"Gumbel + residual net ({compiled.num_gates} gates after pruning, {compiled.engine} "
        f"engine): {compiled_ips:,.0f} images/s, one thread."
    )
    results = ReproduceResults(
        package="dlgn-gumbel",
        title="Gumbel vs softmax logic gate networks on Fashion-MNIST: N(0, 1) and residual "
        "init, equal training time",
        claims=tuple(claims),
        figures=tuple(figures),
        summary=summary,
        quick=quick,
        settings={
            **asdict(settings),
            "arms": {name: list(value) for name, value in ARMS.items()},
            "equal_step": common_step,
            "target_accuracy": targets,
            "time_to_target_s": {
                f"{label}: {arm}": (t if t < float("inf") else None)
                for (label, arm), t in t_target.items()
            },
            "runs": rows,
            "sweep": sweep,
            "gradient_agreement": {
                key: [asdict(row) for row in value.layers] for key, value in diagnosis.items()
            },
        },
        elapsed_s=time.perf_counter() - started,
    )
    results.save(out)
    write_summary(results, out)
    return results
