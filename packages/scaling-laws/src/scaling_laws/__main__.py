"""``scaling-laws`` command line: ``fit``, ``diloco`` and ``reproduce [--quick]``.

``fit`` reads training curves (CSV with columns ``lr`` and ``loss`` (empty where not measured),
one row per step; or JSON ``{"lrs": [...], "steps": [...], "losses": [...], "warmup_steps": 0}``),
fits the LR-annealing law, predicts every ``--predict`` schedule (same formats; a loss column is
optional and gives the prediction error) and writes ``law.json``, ``predictions.csv`` and
``fit.png`` into ``--out``. ``fit --law tau`` reads a Power Lines sweep CSV (columns ``params,
tokens, batch_size, lr, weight_decay, loss``) and fits τ_opt = c·(D/N)^m.

``diloco`` trains a tiny GPT on fortunes with M local gloo replicas (or under ``torchrun``).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np

logger = logging.getLogger("scaling_laws")


def read_schedule(path: str | Path, warmup_steps: int = 0):
    """``(lrs, curve, warmup_steps)`` from a CSV (``lr`` and optional ``loss`` per step) or JSON
    file; ``curve`` is an :class:`AnnealingCurve`, or None when the file holds no losses; a JSON
    file's own ``warmup_steps`` wins over the argument."""
    from scaling_laws.lr_annealing import AnnealingCurve

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"curve file not found: {path}")
    if path.suffix.lower() == ".json":
        data = json.loads(path.read_text())
        if "lrs" not in data:
            raise ValueError(f"{path}: a JSON curve needs 'lrs' (and 'steps', 'losses')")
        lrs, warmup = np.asarray(data["lrs"], float), data.get("warmup_steps", warmup_steps)
        if not data.get("losses"):
            return lrs, None, warmup
        return lrs, AnnealingCurve(lrs, data["steps"], data["losses"], warmup), warmup
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or "lr" not in rows[0]:
        raise ValueError(f"{path}: a CSV curve needs an 'lr' column (and 'loss'), one row a step")
    lrs = np.array([float(row["lr"]) for row in rows])
    observed = [(i + 1, float(row["loss"])) for i, row in enumerate(rows) if row.get("loss")]
    if not observed:
        return lrs, None, warmup_steps
    steps, losses = zip(*observed, strict=True)
    return lrs, AnnealingCurve(lrs, list(steps), list(losses), warmup_steps), warmup_steps


def _fit_annealing(args: argparse.Namespace, out: Path) -> dict:
    from kernels_common.plotting import plot_curves
    from scaling_laws.lr_annealing import fit, relative_error

    fitted = {Path(p).stem: read_schedule(p, args.warmup_steps) for p in args.curves}
    for name, (_, curve, _) in fitted.items():
        if curve is None:
            raise ValueError(f"curve {name!r} has no losses to fit")
    law = fit(
        [curve for _, curve, _ in fitted.values()], decay=args.decay, n_bootstrap=args.bootstrap
    )
    targets = {
        **fitted,
        **{Path(p).stem: read_schedule(p, args.warmup_steps) for p in args.predict},
    }
    rows, plot, errors = [], {}, {}
    for name, (lrs, curve, warmup) in targets.items():
        predicted = law.predict(lrs, warmup_steps=warmup)
        rows += [
            (name, i + 1, float(lr), float(v))
            for i, (lr, v) in enumerate(zip(lrs, predicted, strict=False))
        ]
        plot[f"{name} law"] = (list(range(1, len(predicted) + 1)), predicted.tolist())
        if curve is not None:
            plot[f"{name} measured"] = (curve.steps.tolist(), curve.losses.tolist())
            errors[name] = relative_error(law, curve)
    with (out / "predictions.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["curve", "step", "lr", "predicted_loss"])
        writer.writerows(rows)
    plot_curves(plot, out / "fit.png", title="LR-annealing law", xlabel="step", ylabel="loss")
    return {"law": law.to_dict(), "mean_relative_error": errors}


def _fit_tau(args: argparse.Namespace, out: Path) -> dict:
    from scaling_laws.power_lines import fit_tau_law, tau_opt_per_setting

    records = []
    for path in args.curves:
        with Path(path).open(newline="") as handle:
            records += list(csv.DictReader(handle))
    law = fit_tau_law(records, n_bootstrap=max(args.bootstrap, 0))
    return {"law": law.to_dict(), "tau_opt": tau_opt_per_setting(records)}


def _diloco(args: argparse.Namespace) -> dict:
    from scaling_laws.diloco import DiLoCoConfig, init_from_env, launch_local
    from scaling_laws.diloco.jobs import JobSpec, train_job
    from scaling_laws.models import GPTConfig

    config = DiLoCoConfig(
        algorithm=args.algorithm,
        total_steps=args.steps,
        inner_steps=args.inner_steps,
        inner_lr=args.inner_lr,
        warmup_steps=args.warmup_steps,
        outer_lr=args.outer_lr,
        seed=args.seed,
    )
    spec = JobSpec(
        config,
        gpt=GPTConfig(seq_len=args.seq_len, width=args.width, depth=args.depth),
        batch_size=args.batch_size,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
    )
    if "RANK" in os.environ:  # under torchrun
        rank, world = init_from_env(args.backend)
        results = [train_job(rank, world, spec)]
    elif args.replicas == 1:
        results = [train_job(0, 1, spec)]
    else:
        results = launch_local(train_job, args.replicas, (spec,), backend=args.backend or "gloo")
    head = results[0]
    return {
        "config": config.to_dict(),
        "replicas": head["world_size"],
        "val_loss": head["val_loss"],
        "communicated_bytes_per_replica": head["communicated_bytes"],
        "outer_steps": head["outer_steps"],
        "final_train_loss": float(np.mean([r["losses"][-1] for r in results if len(r["losses"])])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scaling-laws", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fit = commands.add_parser("fit", help="fit a law to curves / sweep results and predict")
    fit.add_argument("curves", nargs="+", help="CSV/JSON curves (or sweep CSVs for --law tau)")
    fit.add_argument("--law", choices=["lr-annealing", "tau"], default="lr-annealing")
    fit.add_argument("--predict", nargs="*", default=[], help="schedules/curves to predict")
    fit.add_argument("--decay", type=float, default=0.999, help="λ of the annealing momentum")
    fit.add_argument("--warmup-steps", type=int, default=0)
    fit.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples")
    fit.add_argument("--out", default="scaling-laws-fit", help="output folder")
    dl = commands.add_parser("diloco", help="train a tiny GPT on fortunes with DiLoCo / DP")
    dl.add_argument("--replicas", type=int, default=2, help="M local processes (gloo)")
    dl.add_argument("--algorithm", choices=["diloco", "data_parallel"], default="diloco")
    dl.add_argument("--steps", type=int, default=300)
    dl.add_argument("--inner-steps", type=int, default=10)
    dl.add_argument("--inner-lr", type=float, default=3e-3)
    dl.add_argument("--outer-lr", type=float, default=0.7)
    dl.add_argument("--warmup-steps", type=int, default=15)
    dl.add_argument("--batch-size", type=int, default=8, help="sequences per replica")
    dl.add_argument("--width", type=int, default=64)
    dl.add_argument("--depth", type=int, default=2)
    dl.add_argument("--seq-len", type=int, default=64)
    dl.add_argument("--seed", type=int, default=0)
    dl.add_argument("--backend", choices=["gloo", "nccl"], default=None)
    dl.add_argument("--checkpoint-dir", default=None)
    dl.add_argument("--checkpoint-every", type=int, default=None)
    dl.add_argument("--out", default=None, help="JSON file for the summary")
    rep = commands.add_parser("reproduce", help="the papers' experiments at small scale")
    rep.add_argument("--quick", action="store_true", help="the few-minute CPU run")
    rep.add_argument("--out", default="reports/scaling-laws", help="results folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    if args.command == "reproduce":
        from scaling_laws.reproduce import run

        results = run(args.out, quick=args.quick)
        logger.info("results in %s (all claims pass: %s)", args.out, results.passed)
        return 0
    if args.command == "diloco":
        summary = _diloco(args)
        if args.out and int(os.environ.get("RANK", 0)) == 0:
            Path(args.out).write_text(json.dumps(summary, indent=1))
        sys.stdout.write(json.dumps(summary, indent=1) + "\n")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = _fit_tau(args, out) if args.law == "tau" else _fit_annealing(args, out)
    (out / "law.json").write_text(json.dumps(summary, indent=1))
    sys.stdout.write(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
