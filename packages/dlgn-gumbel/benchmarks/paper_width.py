"""The paper's claims at the authors' width: softmax and Gumbel, each from N(0, 1) logits and
from the residual init, each trained for the same wall-clock time on a GPU.

The authors' setting (their code, shakiryousefi/gumbel-lgn): 31 thermometer thresholds laid out
threshold-major, difflogic's "unique" connections, GroupSum with k = 100 groups and tau = 100
(their code keeps k = 100 for 10-class data: the 100 scores go to the cross-entropy, labels 0-9),
Adam lr 0.01, batch 64, wide layers (256,000 neurons and up). Fashion-MNIST stands in for CIFAR.

A GPU machine may have no network: export the data here first, carry the file, point --data at it.

    python packages/dlgn-gumbel/benchmarks/paper_width.py --export-data shared/fmnist.npz
    python packages/dlgn-gumbel/benchmarks/paper_width.py --data shared/fmnist.npz \\
        --device cuda --budget-s 120 --out reports/gpu/paper-width

Reports, per arm: steps, final and best discretized and training-mode test accuracy, the
discretization gap, gate usage (uncollapsed and structurally unused neurons); then, each Gumbel
arm against the softmax arm of the same init, the three claims (4.5x faster to 98% of softmax's
best, gap -98%, unused -100%) next to the measurements. Four arms of the default 120 s train for
8 minutes, evaluation and start-up come on top; ``--arms`` picks a subset. ``--smoke`` runs a
tiny version on the CPU (the package's tests do).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from dlgn_gumbel.metrics import gate_usage
from dlgn_gumbel.train import TrainConfig, train

ARMS = {
    "softmax": ("softmax", "randn"),
    "gumbel": ("gumbel", "randn"),
    "softmax+residual": ("softmax", "residual"),
    "gumbel+residual": ("gumbel", "residual"),
}
# each Gumbel arm against the softmax arm of the same init
PAIRS = {"gumbel": "softmax", "gumbel+residual": "softmax+residual"}
PAPER = {"speedup_x": 4.5, "gap_reduction_pct": 98.0, "unused_reduction_pct": 100.0}


def _load(path: str | None) -> dict[str, np.ndarray]:
    if path is not None:
        with np.load(path) as data:
            return {key: data[key] for key in ("x_train", "y_train", "x_test", "y_test")}
    import benchdata

    train_set, test_set = benchdata.fashion_mnist("train"), benchdata.fashion_mnist("test")
    return {
        "x_train": train_set.images.reshape(len(train_set.labels), -1),
        "y_train": np.asarray(train_set.labels),
        "x_test": test_set.images.reshape(len(test_set.labels), -1),
        "y_test": np.asarray(test_set.labels),
    }


def _reduction(before: float, after: float) -> float | None:
    before, after = abs(before), abs(after)
    return None if before == 0 else 100.0 * (before - after) / before


def _time_to(history: list[dict], target: float) -> float | None:
    return next((row["train_time_s"] for row in history if row["discrete_acc"] >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export-data", default=None, help="write Fashion-MNIST as .npz, exit")
    parser.add_argument("--data", default=None, help=".npz from --export-data (else benchdata)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--width", type=int, default=256_000)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--thresholds", type=int, default=31)
    parser.add_argument("--groups", type=int, default=100, help="GroupSum k (the authors': 100)")
    parser.add_argument("--tau", type=float, default=100.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--budget-s", type=float, default=120.0, help="wall-clock s per arm")
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--test-subset", type=int, default=None)
    parser.add_argument("--target-fraction", type=float, default=0.98)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"subset of {','.join(ARMS)}")
    parser.add_argument("--out", default="reports/gpu/paper-width")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run (tests)")
    args = parser.parse_args()

    if args.export_data:
        data = _load(None)
        Path(args.export_data).parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(args.export_data, **data)
        print(f"wrote {args.export_data}")
        return
    if args.smoke:
        args.device, args.width, args.depth, args.thresholds = "cpu", 1200, 2, 3
        args.budget_s, args.eval_every, args.test_subset = 1.0, 5, 200
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {sorted(ARMS)}")
    data = {key: torch.from_numpy(value) for key, value in _load(args.data).items()}
    if args.smoke:
        data = {key: value[:2000] for key, value in data.items()}
    x_train = data["x_train"].float() / 255
    x_test = data["x_test"].float() / 255
    y_train, y_test = data["y_train"].long(), data["y_test"].long()
    if args.test_subset:
        x_test, y_test = x_test[: args.test_subset], y_test[: args.test_subset]
    backend = "reference" if args.device == "cpu" else None

    runs = {}
    for arm in arms:
        relaxation, init = ARMS[arm]
        config = TrainConfig(
            layer_sizes=(args.width,) * args.depth,
            num_thresholds=args.thresholds,
            thermometer_layout="threshold",
            connections="difflogic",
            tau=args.tau,
            relaxation=relaxation,
            init=init,
            batch_size=args.batch_size,
            steps=10**9,
            time_budget_s=args.budget_s,
            eval_every=args.eval_every,
        )
        started = time.perf_counter()
        result = train(config, x_train, y_train, x_test, y_test, num_classes=args.groups,
                       backend=backend, device=args.device, progress=False)  # fmt: skip
        usage = gate_usage(result.net)
        last = result.history[-1]
        runs[arm] = {
            "steps": result.steps,
            "train_time_s": result.train_time_s,
            "wall_s": time.perf_counter() - started,
            "discrete_acc": last["discrete_acc"],
            "train_mode_acc": last["train_mode_acc"],
            "gap": last["train_mode_acc"] - last["discrete_acc"],
            "best_discrete_acc": max(row["discrete_acc"] for row in result.history),
            "uncollapsed": usage.uncollapsed,
            "unused": usage.unused,
            "pass_through": usage.pass_through,
            "negation": usage.negation,
            "constant": usage.constant,
            "dead": usage.dead,
            "neurons": usage.total,
            "history": result.history,
        }
        print(f"{arm}: {json.dumps({k: v for k, v in runs[arm].items() if k != 'history'})}")
        del result
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()

    claims = {}
    for gumbel_arm, soft_arm in PAIRS.items():
        if gumbel_arm in runs and soft_arm in runs:
            soft, gumb = runs[soft_arm], runs[gumbel_arm]
            # the softmax arm's accuracy is the bar; a Gumbel arm that never reaches it: None
            target = args.target_fraction * soft["best_discrete_acc"]
            t_soft, t_gumb = _time_to(soft["history"], target), _time_to(gumb["history"], target)
            claims[f"{soft_arm} vs {gumbel_arm}"] = {
                "target_acc": target,
                "time_to_target_s": {soft_arm: t_soft, gumbel_arm: t_gumb},
                "speedup_x": None if not (t_soft and t_gumb) else t_soft / t_gumb,
                "gap_reduction_pct": _reduction(soft["gap"], gumb["gap"]),
                "uncollapsed_reduction_pct": _reduction(soft["uncollapsed"], gumb["uncollapsed"]),
                "unused_reduction_pct": _reduction(soft["unused"], gumb["unused"]),
            }
    device_name = (
        torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor()
    )
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device_name,
        "torch": torch.__version__,
        "settings": {k: v for k, v in vars(args).items() if k != "export_data"},
        "paper": PAPER,
        "runs": runs,
        "claims": claims,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "paper_width.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Paper width: {args.depth} x {args.width}, {args.thresholds} thresholds, k = "
        f"{args.groups}, tau = {args.tau}, {args.budget_s:.0f} s per arm on {device_name}",
        "",
        "| arm | steps | discretized | training mode | gap | uncollapsed | unused |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {arm} | {r['steps']} | {r['discrete_acc']:.4f} | {r['train_mode_acc']:.4f} | "
        f"{r['gap']:+.4f} | {r['uncollapsed']} | {r['unused']} |"
        for arm, r in runs.items()
    ]
    for pair, claim in claims.items():
        lines.append(f"\n{pair}: {json.dumps(claim)} (paper: {json.dumps(PAPER)})")
    (out / "paper_width.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
