"""``gc4nc reproduce``: the GC4NC findings at small scale, on real graphs, on a CPU.

Graphs: the Debian package graph (benchdata; MiniLM features, or in `quick` its hashed
bag-of-words features, which need no encoder pass over 60k descriptions on the first run, and a
seeded 8,000-node induced subgraph for the accuracy table; the scaling sweep goes to 16,000
nodes, 32,000 in the full run) and a 10-NN graph over 5,000 real Fashion-MNIST images
(Planetoid-style split: 20 training nodes per class). Every method runs at three reduction rates
per graph with the short schedules of `QUICK_HPARAMS` (the anchor's schedules are far longer: see
the README's defaults table), evaluated by the GraphSlim GCN with a short schedule. Then:

1. performance: the accuracy table with the whole-graph reference (claim: trajectory matching is
   the most accurate family);
2. efficiency: condensation time per method (claim: trajectory matching is the costliest) and a
   scaling sweep over Debian subgraphs of growing size (claim: structure-free methods scale best);
3. privacy: membership-inference accuracy of models trained on condensed vs original graphs
   (claim: condensation moves it toward 0.5);
4. denoising: random edge addition (rate 0.5) to the original graph before condensation (the
   paper: condensation can filter such noise; it depends on the method and setting).

Writes ``results.json`` (claims), ``benchmark.json`` / ``benchmark.md`` (the accuracy table),
heatmaps, ``scaling.png`` and ``summary.md``. Needs the ``reproduce`` extra.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gc4nc.evaluation.performance import EvalConfig
from gc4nc.methods.trajectory import QUICK as TRAJECTORY_QUICK

logger = logging.getLogger(__name__)

TRAJECTORY = ("sfgc", "geom")
STRUCTURE_FREE = ("gcondx", "doscondx", "gcdm", "sfgc", "geom", "averaging")

# Short CPU schedules (the anchor's cora configs run 600-1000 epochs with 20 outer x 15 inner
# steps, and trajectory methods train 20 experts for thousands of epochs). With a few dozen epochs
# the cora learning rates (10⁻⁴) barely move the synthetic features, so the short runs take the
# larger rates of the anchor's ogbn-arxiv configs (10⁻² for gradient matching) and 10⁻³ for the
# trajectory students; the trajectory schedules are `gc4nc.methods.trajectory.QUICK`. GEOM's
# soft labels start from its last expert's predictions on the isolated synthetic nodes; two
# 100-epoch experts give nearly flat ones, which a model then learns (measured on debian-bow,
# r = 0.005: 20.2% with soft labels, 50.2% with hard), so the short run keeps hard labels.
_GRADIENT_QUICK = {"epochs": 20, "outer_loop": 5, "inner_loop": 3, "lr_feat": 0.01}
QUICK_HPARAMS: dict[str, dict[str, Any]] = {
    "herding": {"epochs": 30},
    "kcenter": {"epochs": 30},
    "vng": {"epochs": 50},
    "gcond": {**_GRADIENT_QUICK, "lr_adj": 0.01},
    "gcondx": dict(_GRADIENT_QUICK),
    "doscond": {"epochs": 20, "outer_loop": 5, "lr_feat": 0.01, "lr_adj": 0.01},
    "doscondx": {"epochs": 20, "outer_loop": 5, "lr_feat": 0.01},
    "gcdm": {"epochs": 60, "lr_feat": 0.01},
    "sgdd": {**_GRADIENT_QUICK, "lr_adj": 0.01},
    "sfgc": {**TRAJECTORY_QUICK["sfgc"], "lr_feat": 1e-3, "epochs": 40},
    "geom": {**TRAJECTORY_QUICK["geom"], "lr_feat": 1e-3, "soft_label": False, "epochs": 40},
}
# the scaling sweep compares structure learning with none on the same condensation model (SGC,
# precomputed propagation), so that the difference is the structure's cost alone
SCALING_HPARAMS: dict[str, dict[str, Any]] = {
    "gcond": {**QUICK_HPARAMS["gcond"], "condense_model": "sgc"},
    "gcondx": {**QUICK_HPARAMS["gcondx"], "condense_model": "sgc"},
}


@dataclass(frozen=True)
class Settings:
    datasets: tuple[str, ...] = ("debian-bow", "fashion-knn")
    subsample: dict[str, int | None] = field(default_factory=lambda: {"debian-bow": 8000})
    methods: tuple[str, ...] = (
        "random",
        "herding",
        "kcenter",
        "degree",
        "pagerank",
        "averaging",
        "vng",
        "gcond",
        "gcondx",
        "doscond",
        "gcdm",
        "sgdd",
        "sfgc",
        "geom",
    )
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(runs=1, epochs=100, val_every=5))
    hparams: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(QUICK_HPARAMS))
    privacy_dataset: str = "fashion-knn"
    privacy_methods: tuple[str, ...] = ("random", "averaging", "gcond", "geom")
    denoise_dataset: str = "fashion-knn"
    denoise_methods: tuple[str, ...] = ("random", "gcond", "geom")
    denoise_attack: str = "random_adj"
    denoise_rate: float = 0.5
    scaling_sizes: tuple[int, ...] = (2000, 4000, 8000, 16000)
    scaling_methods: tuple[str, ...] = ("gcondx", "gcond")
    scaling_rate: float = 0.01
    scaling_hparams: dict[str, dict[str, Any]] = field(
        default_factory=lambda: dict(SCALING_HPARAMS)
    )
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


QUICK = Settings()
FULL = Settings(
    datasets=("debian", "fashion-knn"),
    subsample={},
    eval=EvalConfig(runs=5),
    hparams={},
    privacy_methods=("random", "averaging", "gcond", "gcondx", "sfgc", "geom"),
    denoise_methods=("random", "kcenter", "gcondx", "gcond", "geom"),
    scaling_sizes=(2000, 4000, 8000, 16000, 32000),
    scaling_methods=("gcondx", "gcond", "sfgc"),
    scaling_hparams={"gcond": {"condense_model": "sgc"}, "gcondx": {"condense_model": "sgc"}},
)


def run(out: str | Path, *, quick: bool = True, settings: Settings | None = None):
    """Run every part and write the report into `out`; returns the `ReproduceResults`."""
    import torch

    from gc4nc import benchmark
    from gc4nc.condense import condense
    from gc4nc.datasets import default_rates, load_dataset
    from gc4nc.evaluation.denoising import robustness
    from gc4nc.evaluation.performance import condensed_accuracy, whole_graph_accuracy
    from gc4nc.evaluation.privacy import membership_inference
    from kernels_common import ReproduceResults
    from kernels_common.report import write_summary

    started = time.perf_counter()
    s = settings or (QUICK if quick else FULL)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # small graphs: a second thread mostly spins
    sweep = benchmark.Sweep(settings=s.to_dict())
    middle: dict[str, dict[str, Any]] = {}  # dataset -> method -> condensed at the middle rate
    graphs = {}
    for name in s.datasets:
        graph = load_dataset(name, seed=s.seed, num_nodes=s.subsample.get(name))
        graphs[name] = graph
        sweep.graphs[name] = {
            "nodes": graph.num_nodes,
            "edges": graph.edge_index.shape[1] // 2,
            "features": graph.x.shape[1],
            "classes": int(graph.y.max()) + 1,
            "train": int(graph.train_mask.sum()),
        }
        whole = whole_graph_accuracy(graph, s.eval, seed=s.seed)
        sweep.whole_graph[name] = {"accuracy": whole.mean, "std": whole.std}
        rates = default_rates(name)
        middle[name] = {}
        for rate in rates:
            for method in s.methods:
                cell = benchmark.Cell(name, method, rate)
                try:
                    c = condense(graph, method, rate, seed=s.seed, **s.hparams.get(method, {}))
                    accuracy = condensed_accuracy(c, graph, s.eval, seed=s.seed)
                except Exception as error:
                    logger.warning("%s on %s at %g failed: %s", method, name, rate, error)
                    cell.error = f"{type(error).__name__}: {error}"
                else:
                    cell.accuracy, cell.std = accuracy.mean, accuracy.std
                    cell.seconds = c.metadata["seconds"]
                    cell.peak_memory_bytes = c.metadata["peak_memory_bytes"]
                    cell.num_synthetic = c.num_nodes
                    if rate == rates[len(rates) // 2]:
                        middle[name][method] = c
                logger.info(
                    "%s %s r=%g: %s (%.1f s)",
                    name,
                    method,
                    rate,
                    cell.error or f"{100 * cell.accuracy:.1f}%",
                    cell.seconds or 0.0,
                )
                sweep.cells.append(cell)
    figures = benchmark.write(sweep, out)
    figures = [f for f in figures if f.endswith(".png")]

    privacy = {}
    graph = graphs[s.privacy_dataset]
    reference = None  # the attack on whole-graph models: the same for every method
    for method in s.privacy_methods:
        if method in middle[s.privacy_dataset]:
            mia = membership_inference(
                middle[s.privacy_dataset][method],
                graph,
                s.eval,
                seed=s.seed,
                original=reference is None,
            )
            reference = reference or mia["original"]
            mia["original"] = reference
            privacy[method] = {k: asdict(v) for k, v in mia.items()}
            logger.info(
                "privacy %s: condensed %.3f, original %.3f",
                method,
                mia["condensed"].mean,
                mia["original"].mean,
            )

    name = s.denoise_dataset
    rate = default_rates(name)[len(default_rates(name)) // 2]
    denoise = robustness(
        graphs[name],
        {m: s.hparams.get(m, {}) for m in s.denoise_methods},
        s.denoise_attack,
        s.denoise_rate,
        reduction_rate=rate,
        config=s.eval,
        seed=s.seed,
        clean={m: c for m, c in middle[name].items() if m in s.denoise_methods},
    )
    denoise_json = _plain(denoise)

    scaling = _scaling(s, out)
    figures.append("scaling.png")

    claims = _claims(sweep, privacy, denoise_json, scaling, s)
    tables = benchmark.markdown(sweep)
    results = ReproduceResults(
        package="gc4nc",
        title="Graph condensation for node classification: accuracy, cost, privacy, denoising",
        claims=tuple(claims),
        figures=tuple(figures),
        summary=_summary(s, sweep, privacy, denoise_json, scaling),
        quick=quick,
        settings={
            "settings": _plain(s.to_dict()),
            "benchmark": _plain(sweep.to_dict()),
            "privacy": privacy,
            "denoising": denoise_json,
            "scaling": scaling,
        },
        elapsed_s=time.perf_counter() - started,
    )
    results.save(out)
    write_summary(
        results,
        out,
        extra="### Accuracy (%, mean ± std) and condensation time\n\n"
        + tables
        + "\n"
        + _privacy_table(privacy)
        + _denoise_table(denoise_json),
    )
    return results


def _plain(value: Any) -> Any:
    """JSON-ready copy: dataclasses to dicts, NaN to None."""
    import dataclasses
    import math

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _scaling(s: Settings, out: Path) -> dict[str, Any]:
    from gc4nc.datasets import load_dataset
    from gc4nc.evaluation.efficiency import scaling_sweep
    from kernels_common.plotting import new_figure, save_figure

    debian = next(name for name in s.datasets if name.startswith("debian"))

    def make(n: int):
        return load_dataset(debian, seed=s.seed, num_nodes=n)

    sizes = list(s.scaling_sizes)
    result = {}
    for method in s.scaling_methods:
        hparams = {**s.hparams.get(method, {}), **s.scaling_hparams.get(method, {})}
        result[method] = scaling_sweep(make, sizes, method, s.scaling_rate, seed=s.seed, **hparams)
        logger.info("scaling %s: slope %.2f", method, result[method]["slope"])
    fig = new_figure(5.5, 4.0)
    ax = fig.add_subplot(111)
    for method, r in result.items():
        ax.loglog(r["sizes"], r["seconds"], "o-", label=f"{method} (slope {r['slope']:.2f})")
    ax.set_xlabel("graph nodes (Debian package subgraphs)")
    ax.set_ylabel("condensation time (s)")
    ax.set_title(f"condensation time vs graph size, r = {s.scaling_rate:g}")
    ax.legend()
    save_figure(fig, out / "scaling.png")
    return _plain(result)


def _family_mean(sweep, methods, key="accuracy") -> float:
    values = [getattr(c, key) for c in sweep.cells if c.method in methods and c.error is None]
    return float(np.mean(values)) if values else float("nan")


def _claims(sweep, privacy, denoise, scaling, s: Settings) -> list:
    from kernels_common import Claim

    others = [m for m in s.methods if m not in TRAJECTORY]
    claims = []
    # 1. accuracy: best trajectory method vs best other method, per (dataset, rate), averaged
    gaps = []
    for name in sweep.graphs:
        for rate in sorted({c.rate for c in sweep.cells if c.dataset == name}):
            here = [c for c in sweep.cells if c.dataset == name and c.rate == rate and not c.error]
            traj = [c.accuracy for c in here if c.method in TRAJECTORY]
            rest = [c.accuracy for c in here if c.method in others]
            if traj and rest:
                gaps.append(max(traj) - max(rest))
    claims.append(
        Claim(
            name="best trajectory-matching accuracy − best other method's (points, cell mean)",
            paper="trajectory matching (SFGC, GEOM) gives the best accuracy",
            measured=100 * float(np.mean(gaps)) if gaps else float("nan"),
            unit="points",
            direction="at_least",
            threshold=0.0,
        )
    )
    # 2. cost: trajectory matching's median condensation time over the others'
    traj_time = np.median(
        [c.seconds for c in sweep.cells if c.method in TRAJECTORY and c.seconds is not None]
        or [np.nan]
    )
    rest_time = np.median(
        [c.seconds for c in sweep.cells if c.method in others and c.seconds is not None] or [np.nan]
    )
    claims.append(
        Claim(
            name="trajectory-matching condensation time / other methods' (median ratio)",
            paper="trajectory matching is costly",
            measured=float(traj_time / rest_time),
            unit="ratio",
            direction="at_least",
            threshold=1.0,
        )
    )
    # 3. scaling: the structure-free method's time at the largest graph vs structure learning's
    if "gcondx" in scaling and "gcond" in scaling:
        free, learned = scaling["gcondx"], scaling["gcond"]
        claims.append(
            Claim(
                name="GCondX / GCond condensation time at the largest Debian subgraph (same model)",
                paper="structure-free methods scale best",
                measured=float(free["seconds"][-1] / learned["seconds"][-1]),
                unit="ratio",
                direction="at_most",
                threshold=1.0,
            )
        )
    # 4. privacy: |MIA − 0.5| after condensation minus before, mean over methods
    if privacy:
        deltas = [
            abs(p["condensed"]["mean"] - 0.5) - abs(p["original"]["mean"] - 0.5)
            for p in privacy.values()
        ]
        claims.append(
            Claim(
                name="|MIA accuracy − 0.5|: condensed − original (mean over methods, points)",
                paper="condensation moves membership-inference accuracy toward 0.5 (chance)",
                measured=100 * float(np.mean(deltas)),
                unit="points",
                direction="at_most",
                threshold=0.0,
            )
        )
    # 5. denoising: accuracy lost to the attack, condensed (mean over methods) − whole graph
    whole_drop = denoise["whole"]["clean"]["mean"] - denoise["whole"]["attacked"]["mean"]
    drops = [m["clean"]["mean"] - m["attacked"]["mean"] for m in denoise["methods"].values()]
    claims.append(
        Claim(
            name=f"accuracy lost to {s.denoise_attack} {s.denoise_rate:g}: condensed − whole graph "
            "(points)",
            paper="condensation can denoise: condensed graphs lose less to noise (it depends)",
            measured=100 * (float(np.mean(drops)) - whole_drop),
            unit="points",
            direction="at_most",
            threshold=0.0,
        )
    )
    return claims


def _privacy_table(privacy: dict) -> str:
    if not privacy:
        return ""
    rows = [
        "### Membership inference (attack accuracy, 0.5 = chance)",
        "",
        "| method | trained on condensed | trained on original |",
        "|---|---|---|",
    ]
    for method, p in privacy.items():
        rows.append(
            f"| {method} | {p['condensed']['mean']:.3f} ± {p['condensed']['std']:.3f} | "
            f"{p['original']['mean']:.3f} ± {p['original']['std']:.3f} |"
        )
    return "\n".join(rows) + "\n\n"


def _denoise_table(d: dict) -> str:
    rows = [
        f"### Denoising ({d['attack']} at {d['rate']:g}, test accuracy %)",
        "",
        "| trained on | clean | attacked |",
        "|---|---|---|",
        f"| whole graph | {100 * d['whole']['clean']['mean']:.1f} | "
        f"{100 * d['whole']['attacked']['mean']:.1f} |",
    ]
    for method, m in d["methods"].items():
        rows.append(
            f"| {method} | {100 * m['clean']['mean']:.1f} | {100 * m['attacked']['mean']:.1f} |"
        )
    return "\n".join(rows) + "\n"


def _summary(s: Settings, sweep, privacy, denoise, scaling) -> str:
    graphs = ", ".join(
        f"{n} ({g['nodes']:,} nodes, {g['train']:,} training)" for n, g in sweep.graphs.items()
    )
    return (
        f"Graphs: {graphs}. Methods: {', '.join(s.methods)}, short CPU schedules "
        f"(`gc4nc.reproduce.QUICK_HPARAMS`); evaluation GCN {s.eval.epochs} epochs × "
        f"{s.eval.runs} runs. Privacy on {s.privacy_dataset}, denoising ({s.denoise_attack} "
        f"{s.denoise_rate:g}) on {s.denoise_dataset}, scaling on Debian subgraphs of "
        f"{', '.join(str(n) for n in s.scaling_sizes)} nodes at r = {s.scaling_rate:g}."
    )
