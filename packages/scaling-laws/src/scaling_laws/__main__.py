"""``scaling-laws`` command line: ``fit``, ``diloco`` and ``reproduce [--quick]``.

``fit`` reads training curves (CSV with columns ``lr`` and ``loss`` (empty where not measured),
one row per step; or JSON ``{"lrs": [...], "steps": [...], "losses": [...], "warmup_steps": 0}``),
fits the LR-annealing law, predicts every ``--predict`` schedule (same formats; a loss column is
optional and gives the prediction error) and writes ``law.json``, ``predictions.csv`` and
``fit.png`` into ``--out``. ``fit --law tau`` reads a Power Lines sweep CSV (columns ``params,
tokens, batch_size, lr, weight_decay, loss``) and fits τ_opt = c·(D/N)^m.

``diloco`` trains a tiny GPT on fortunes with M local gloo replicas (or under ``torchrun``).

Bad input (arguments, unreadable or malformed files, a checkpoint that cannot be resumed) is
refused with one line ``scaling-laws: error: ...`` and exit code 2 before any work; outputs
appear whole or not at all.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import logging
import math
import os
import sys
from pathlib import Path

import numpy as np

from kernels_common import cli

logger = logging.getLogger("scaling_laws")

SWEEP_COLUMNS = ("params", "tokens", "batch_size", "lr", "weight_decay", "loss")
GPT_HEADS = 4  # GPTConfig's default, used by the CLI's model


# --- reading input files: every refusal names the file, and the row and column ------------------


def _csv_rows(path: Path, what: str) -> tuple[list[str], list[tuple[int, int, dict[str, str]]]]:
    """``(header, [(row, line, {column: text})])`` of a CSV file.

    Blank lines are skipped; a row with fewer fields than the header reads the missing ones as
    empty, except the last row of a file that does not end with a newline: that file was cut
    off mid-row (truncated) and is refused, as is a row with more non-empty fields than columns.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a {what} (not UTF-8 text)") from None
    records = []
    header = None
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
        for fields in reader:
            if not any(field.strip() for field in fields):
                continue
            if header is None:
                header = [field.strip() for field in fields]
            else:
                records.append((reader.line_num, fields))
    except csv.Error as error:
        raise ValueError(f"{path} is not a readable {what} ({error})") from None
    if header is None:
        raise ValueError(f"{path} is empty: a {what} needs a header line, then one row per entry")
    rows = []
    for row, (line, fields) in enumerate(records, start=1):
        fields = [field.strip() for field in fields]
        if len(fields) < len(header) and row == len(records) and not text.endswith("\n"):
            raise ValueError(
                f"{path} is truncated: its last row (row {row}, line {line}) has {len(fields)} "
                f"of {len(header)} fields and no line end"
            )
        if any(fields[len(header) :]):
            raise ValueError(
                f"{path}: row {row} (line {line}) has {len(fields)} fields, the header has "
                f"{len(header)}"
            )
        fields += [""] * (len(header) - len(fields))
        rows.append((row, line, dict(zip(header, fields[: len(header)], strict=True))))
    return header, rows


def _cell(path: Path, row: int, line: int, column: str, text: str, *, positive: bool) -> float:
    """The number in one CSV cell: finite, and > 0 (``positive``) or >= 0."""
    where = f"{path}: row {row} (line {line}), column {column!r}"
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        kind = "a positive finite number" if positive else "a finite number >= 0"
        raise ValueError(f"{where}: expected {kind}, got {text!r}")
    return value


def _json_numbers(path: Path, data: dict, key: str) -> np.ndarray:
    values = data.get(key)
    if not isinstance(values, list) or not values:
        raise ValueError(f"{path}: {key!r} must be a non-empty list of numbers")
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{path}: {key}[{i}] is not a number: {value!r}")
    return np.asarray(values, dtype=np.float64)


def _warmup(path: Path, value, n_steps: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{path}: warmup_steps must be an integer >= 0, got {value!r}")
    if value >= n_steps:
        raise ValueError(
            f"{path}: warmup_steps {value} must be below the schedule's {n_steps} steps"
        )
    return value


def read_schedule(path: str | Path, warmup_steps: int = 0):
    """``(lrs, curve, warmup_steps)`` from a CSV (``lr`` and optional ``loss`` per step) or JSON
    file; ``curve`` is an :class:`AnnealingCurve`, or None when the file holds no losses; a JSON
    file's own ``warmup_steps`` wins over the argument.

    Raises ``FileNotFoundError`` / ``ValueError`` naming the file (and the row and column of a
    bad CSV value): missing, empty, truncated, not JSON, a non-number, a NaN or negative lr, a
    loss that is not positive and finite.
    """
    from scaling_laws.lr_annealing import AnnealingCurve

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"curve file not found: {path}")
    if path.suffix.lower() == ".json":
        data = cli.read_json(path, "curve file")
        if not isinstance(data, dict) or "lrs" not in data:
            raise ValueError(
                f"{path}: a JSON curve is an object with 'lrs' (and 'steps', 'losses')"
            )
        lrs = _json_numbers(path, data, "lrs")
        warmup = _warmup(path, data.get("warmup_steps", warmup_steps), len(lrs))
        if not data.get("losses"):
            steps = losses = None
        else:
            steps, losses = _json_numbers(path, data, "steps"), _json_numbers(path, data, "losses")
            if len(steps) != len(losses):
                raise ValueError(
                    f"{path}: 'steps' has {len(steps)} entries, 'losses' {len(losses)}"
                )
    else:
        header, rows = _csv_rows(path, "CSV curve")
        if "lr" not in header:
            raise ValueError(
                f"{path}: a CSV curve needs an 'lr' column (and 'loss'), one row a step; "
                f"found columns {header}"
            )
        if not rows:
            raise ValueError(f"{path}: the CSV curve has a header but no rows (one row a step)")
        lrs = np.array([_cell(path, r, n, "lr", v["lr"], positive=False) for r, n, v in rows])
        observed = [
            (r, _cell(path, r, n, "loss", v["loss"], positive=True))
            for r, n, v in rows
            if v.get("loss")
        ]
        warmup = _warmup(path, warmup_steps, len(lrs))
        steps, losses = zip(*observed, strict=True) if observed else (None, None)
    if steps is None:
        return lrs, None, warmup
    try:
        curve = AnnealingCurve(lrs, list(steps), list(losses), warmup)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: {error}") from None
    return lrs, curve, warmup


def read_sweep(path: str | Path) -> list[dict[str, float]]:
    """Power Lines sweep rows (``params, tokens, batch_size, lr, weight_decay, loss``, all
    positive) from a CSV; other columns are ignored. Refusals name the file, row and column."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sweep file not found: {path}")
    header, rows = _csv_rows(path, "sweep CSV")
    missing = [c for c in SWEEP_COLUMNS if c not in header]
    if missing:
        raise ValueError(
            f"{path}: a sweep CSV needs the columns {', '.join(SWEEP_COLUMNS)}; missing "
            f"{', '.join(missing)}"
        )
    if not rows:
        raise ValueError(f"{path}: the sweep CSV has a header but no rows (one row a run)")
    return [
        {c: _cell(path, r, n, c, values[c], positive=True) for c in SWEEP_COLUMNS}
        for r, n, values in rows
    ]


# --- fit -----------------------------------------------------------------------------------------


def _stems(paths) -> str:
    return ", ".join(str(p) for p in paths)


def _fit_annealing(args: argparse.Namespace) -> tuple[dict, dict]:
    """``(summary, outputs)``: ``outputs`` maps file names to writers ``fn(path)``."""
    from scaling_laws.lr_annealing import fit, relative_error

    if importlib.util.find_spec("matplotlib") is None:
        raise cli.CommandError(
            "fit writes fit.png and needs matplotlib: pip install 'scaling-laws[plot]'"
        )
    # read every input before fitting: a bad --predict file is refused before any work
    inputs = {path: read_schedule(path, args.warmup_steps) for path in args.curves}
    for path, (_, curve, _) in inputs.items():
        if curve is None:
            raise ValueError(f"{path} has no losses to fit (its 'loss' entries are all empty)")
    curves = [curve for _, curve, _ in inputs.values()]
    inputs.update({path: read_schedule(path, args.warmup_steps) for path in args.predict})
    try:
        law = fit(curves, decay=args.decay, n_bootstrap=args.bootstrap)
    except ValueError as error:
        raise ValueError(
            f"cannot fit the LR-annealing law to {_stems(args.curves)}: {error}"
        ) from None
    files = {Path(path).stem: path for path in inputs}  # a later file of the same name wins
    targets = {Path(path).stem: schedule for path, schedule in inputs.items()}
    rows, plot, errors = [], {}, {}
    for name, (lrs, curve, warmup) in targets.items():
        try:
            predicted = law.predict(lrs, warmup_steps=warmup)
        except ValueError as error:
            raise ValueError(f"cannot predict {files[name]}: {error}") from None
        rows += [
            (name, i + 1, float(lr), float(v))
            for i, (lr, v) in enumerate(zip(lrs, predicted, strict=False))
        ]
        plot[f"{name} law"] = (list(range(1, len(predicted) + 1)), predicted.tolist())
        if curve is not None:
            plot[f"{name} measured"] = (curve.steps.tolist(), curve.losses.tolist())
            errors[name] = relative_error(law, curve)

    def write_predictions(path: Path) -> None:
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["curve", "step", "lr", "predicted_loss"])
            writer.writerows(rows)

    def write_plot(path: Path) -> None:
        from kernels_common.plotting import plot_curves

        plot_curves(plot, path, title="LR-annealing law", xlabel="step", ylabel="loss")

    summary = {"law": law.to_dict(), "mean_relative_error": errors}
    return summary, {"predictions.csv": write_predictions, "fit.png": write_plot}


def _fit_tau(args: argparse.Namespace) -> tuple[dict, dict]:
    from scaling_laws.power_lines import fit_tau_law, tau_opt_per_setting

    records = [record for path in args.curves for record in read_sweep(path)]
    try:
        law = fit_tau_law(records, n_bootstrap=args.bootstrap)
    except ValueError as error:
        raise ValueError(f"cannot fit the τ law to {_stems(args.curves)}: {error}") from None
    return {"law": law.to_dict(), "tau_opt": tau_opt_per_setting(records)}, {}


def _run_fit(args: argparse.Namespace) -> int:
    if args.law == "tau" and args.predict:
        raise cli.CommandError("--predict applies to --law lr-annealing only")
    summary, outputs = _fit_tau(args) if args.law == "tau" else _fit_annealing(args)
    text = json.dumps(summary, indent=1)
    # everything is computed: write it whole (a failed write leaves no folder and no file)
    with cli.atomic_folder(args.out) as staging:
        for name, write in outputs.items():
            write(staging / name)
        (staging / "law.json").write_text(text)
    sys.stdout.write(text + "\n")
    return 0


# --- diloco --------------------------------------------------------------------------------------


def _check_diloco(args: argparse.Namespace) -> int:
    """Refuse a bad combination before any work; returns the world size."""
    if args.warmup_steps >= args.steps:
        raise cli.CommandError(
            f"--warmup-steps {args.warmup_steps} must be below --steps {args.steps}"
        )
    if args.width % GPT_HEADS:
        raise cli.CommandError(
            f"--width {args.width} must be a multiple of {GPT_HEADS} (the attention heads)"
        )
    if args.checkpoint_every is not None and args.checkpoint_dir is None:
        raise cli.CommandError("--checkpoint-every needs --checkpoint-dir")
    import torch

    if args.backend == "nccl" and not torch.cuda.is_available():
        raise cli.CommandError("--backend nccl needs CUDA devices; use gloo on CPU")
    if importlib.util.find_spec("benchdata") is None:
        raise cli.CommandError(
            "diloco trains on the fortunes corpus: pip install 'scaling-laws[reproduce]'"
        )
    from benchdata.text import FORTUNES_DIR

    if not FORTUNES_DIR.exists():  # the error benchdata raises says how to install it
        from benchdata import fortunes_corpus

        fortunes_corpus()
    if "RANK" in os.environ:
        if "WORLD_SIZE" not in os.environ:
            raise cli.CommandError("RANK is set but WORLD_SIZE is not: start with torchrun")
        return int(os.environ["WORLD_SIZE"])
    return args.replicas


def _diloco(args: argparse.Namespace) -> dict:
    from scaling_laws.diloco import DiLoCoConfig, launch_local, resumable_checkpoint
    from scaling_laws.diloco.jobs import JobSpec, train_job
    from scaling_laws.models import GPTConfig

    world_size = _check_diloco(args)
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
        gpt=GPTConfig(seq_len=args.seq_len, width=args.width, depth=args.depth, heads=GPT_HEADS),
        batch_size=args.batch_size,
        checkpoint_dir=None if args.checkpoint_dir is None else str(args.checkpoint_dir),
        checkpoint_every=args.checkpoint_every,
    )
    if args.checkpoint_dir is not None:
        # a corrupt latest checkpoint is refused here, by every process alike, not in a replica
        # whose peers would then wait in a collective
        start = resumable_checkpoint(args.checkpoint_dir, config=config, world_size=world_size)
        if start is not None:
            logger.info("resuming from %s", start)
    if "RANK" in os.environ:  # under torchrun
        results = [_torchrun_job(args.backend, spec)]
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


def _torchrun_job(backend: str | None, spec) -> dict:
    """One replica under torchrun, with the process group torn down before returning.

    Left to interpreter exit, gloo's process group is destroyed during finalisation while its
    worker threads may still hold completed work objects (and their tensors); releasing those
    then needs the GIL of an interpreter being torn down, which can abort the process
    ("terminate called without an active exception") after a successful run. So: every rank
    waits for the others (no peer still inside a collective), then the group is destroyed here.
    """
    import torch.distributed as dist

    from scaling_laws.diloco import init_from_env
    from scaling_laws.diloco.jobs import train_job

    rank, world = init_from_env(backend)
    try:
        result = train_job(rank, world, spec)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return result


def _run_diloco(args: argparse.Namespace) -> int:
    summary = _diloco(args)
    text = json.dumps(summary, indent=1)
    if args.out and int(os.environ.get("RANK", 0)) == 0:
        with cli.atomic_file(args.out) as temporary:
            temporary.write_text(text)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return 0


def _run_reproduce(args: argparse.Namespace) -> int:
    from scaling_laws.reproduce import run

    with cli.atomic_folder(args.out) as staging:  # the results appear whole, or not at all
        results = run(staging, quick=args.quick)
    logger.info("results in %s (all claims pass: %s)", args.out, results.passed)
    return 0


def _decay(text: str) -> float:
    value = cli.finite_float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="scaling-laws", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fit = commands.add_parser("fit", help="fit a law to curves / sweep results and predict")
    fit.add_argument(
        "curves",
        nargs="+",
        type=cli.existing_file,
        help="CSV/JSON curves (or sweep CSVs for --law tau)",
    )
    fit.add_argument("--law", choices=["lr-annealing", "tau"], default="lr-annealing")
    fit.add_argument(
        "--predict", nargs="*", type=cli.existing_file, default=[], help="schedules to predict"
    )
    fit.add_argument("--decay", type=_decay, default=0.999, help="λ of the annealing momentum")
    fit.add_argument("--warmup-steps", type=cli.nonnegative_int, default=0)
    fit.add_argument("--bootstrap", type=cli.nonnegative_int, default=100, help="resamples")
    fit.add_argument(
        "--out", type=cli.output_folder, default="scaling-laws-fit", help="output folder"
    )
    fit.set_defaults(func=_run_fit)
    dl = commands.add_parser("diloco", help="train a tiny GPT on fortunes with DiLoCo / DP")
    dl.add_argument("--replicas", type=cli.positive_int, default=2, help="M local processes")
    dl.add_argument("--algorithm", choices=["diloco", "data_parallel"], default="diloco")
    dl.add_argument("--steps", type=cli.positive_int, default=300)
    dl.add_argument("--inner-steps", type=cli.positive_int, default=10)
    dl.add_argument("--inner-lr", type=cli.positive_float, default=3e-3)
    dl.add_argument("--outer-lr", type=cli.positive_float, default=0.7)
    dl.add_argument("--warmup-steps", type=cli.nonnegative_int, default=15)
    dl.add_argument("--batch-size", type=cli.positive_int, default=8, help="sequences per replica")
    dl.add_argument("--width", type=cli.positive_int, default=64)
    dl.add_argument("--depth", type=cli.positive_int, default=2)
    dl.add_argument("--seq-len", type=cli.positive_int, default=64)
    dl.add_argument("--seed", type=int, default=0)
    dl.add_argument("--backend", choices=["gloo", "nccl"], default=None)
    dl.add_argument("--checkpoint-dir", type=cli.output_folder, default=None)
    dl.add_argument("--checkpoint-every", type=cli.positive_int, default=None)
    dl.add_argument("--out", type=cli.output_file, default=None, help="JSON file for the summary")
    dl.set_defaults(func=_run_diloco)
    rep = commands.add_parser("reproduce", help="the papers' experiments at small scale")
    rep.add_argument("--quick", action="store_true", help="the few-minute CPU run")
    rep.add_argument(
        "--out", type=cli.output_folder, default="reports/scaling-laws", help="results folder"
    )
    rep.set_defaults(func=_run_reproduce)

    def dispatch(args: argparse.Namespace) -> int:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        return args.func(args)

    return cli.run(parser, dispatch, argv)


if __name__ == "__main__":
    raise SystemExit(main())
