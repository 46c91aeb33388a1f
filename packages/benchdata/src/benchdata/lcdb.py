"""Learning curves over training-set size from LCDB (Mohr et al. 2022), PyPI `lcdb` 0.1.0.

The `lcdb` sdist carries `database-<metric>.csv` files with the columns
`openmlid,learner,size_train,size_test,outer_seed,inner_seed,traintime,score_train,score_valid,
score_test`: 20 scikit-learn learners on 248 OpenML datasets, each trained at training-set-size
anchors 16, 23, 32, 45, ... (powers of sqrt 2) up to the dataset's size, over several outer and
inner seeds. `import lcdb` needs undeclared dependencies (openml, func_timeout, ...), so it is never
imported: the CSV is found in the installed package folder and read directly.

Reading the 150 MB CSV takes seconds, so the first call parses it once into
`$BENCHDATA_CACHE/lcdb/<csv name>-<sha256 prefix>/`: one `.npz` per dataset with the mean over
seeds of each (learner, anchor) cell, and a sha256 manifest that every later call verifies.

One dataset becomes one `LearningCurves` table: configurations are the learners (one categorical
hyperparameter "learner"), steps are the anchors (fidelity "train_size"), values the mean
`score_valid`, test values the mean `score_test`, and costs the mean `traintime` at that anchor (a
model at an anchor is trained from scratch, so that is the cost of the step itself). Learners
missing any anchor of their dataset (QDA fails on the smallest anchors, others time out on the
largest) are dropped, never filled in: 70 of the 248 datasets lose at least one learner, and every
dataset keeps at least 4.
"""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

import numpy as np

from benchdata._files import cache_dir, cached_folder, file_digest, package_dir, require
from benchdata.curves import LearningCurves

logger = logging.getLogger(__name__)

# LCDB's metrics in [0, 1], higher is better (its `logloss` file is neither)
LCDB_METRICS = ("accuracy", "auc", "f1")
LCDB_COLUMNS = (
    "openmlid",
    "learner",
    "size_train",
    "size_test",
    "outer_seed",
    "inner_seed",
    "traintime",
    "score_train",
    "score_valid",
    "score_test",
)
# what the parse writes; a cached folder of an older parse is parsed again
PARSE_FORMAT = 1


def lcdb_csv(metric: str = "accuracy", path: str | Path | None = None) -> Path:
    """The LCDB CSV: `path`, or `database-<metric>.csv` in the installed `lcdb` package."""
    if metric not in LCDB_METRICS:
        raise ValueError(
            f"metric must be one of {LCDB_METRICS} (scores in [0, 1], higher is better), "
            f"got {metric!r}"
        )
    if path is None:
        path = package_dir("lcdb", "LCDB", "lcdb") / f"database-{metric}.csv"
    return require(Path(path), f"LCDB {metric} curves", "lcdb")


def _aggregate(csv_path: Path) -> dict[tuple[int, str, int], list[float]]:
    """(openmlid, learner, size_train) -> [sum valid, sum test, sum traintime, seeds]."""
    cells: dict[tuple[int, str, int], list[float]] = {}
    with csv_path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, [])
        missing = [c for c in LCDB_COLUMNS if c not in header]
        if missing:
            raise ValueError(
                f"{csv_path} is not an LCDB table: its header lacks {missing} "
                f"(expected {','.join(LCDB_COLUMNS)})"
            )
        i_id, i_learner, i_size, i_time, i_valid, i_test = (
            header.index(c)
            for c in ("openmlid", "learner", "size_train", "traintime", "score_valid", "score_test")
        )
        for line, row in enumerate(reader, start=2):
            try:
                key = (int(row[i_id]), row[i_learner], int(row[i_size]))
                valid, test, seconds = float(row[i_valid]), float(row[i_test]), float(row[i_time])
            except (ValueError, IndexError):
                raise ValueError(f"{csv_path}, line {line}: cannot read {row!r}") from None
            if not (math.isfinite(valid) and math.isfinite(test) and math.isfinite(seconds)):
                continue  # a failed run: the cell counts the seeds that have a score
            cell = cells.get(key)
            if cell is None:
                cells[key] = [valid, test, seconds, 1]
            else:
                cell[0] += valid
                cell[1] += test
                cell[2] += seconds
                cell[3] += 1
    if not cells:
        raise ValueError(f"{csv_path} holds no learning-curve rows")
    return cells


def _write_datasets(cells: dict[tuple[int, str, int], list[float]], folder: Path) -> list[int]:
    """One `<openmlid>.npz` per dataset: learners, anchors, (learners, anchors) means and seeds."""
    by_dataset: dict[int, dict[tuple[str, int], list[float]]] = {}
    for (openml_id, learner, size), cell in cells.items():
        by_dataset.setdefault(openml_id, {})[learner, size] = cell
    for openml_id, dataset in by_dataset.items():
        learners = sorted({learner for learner, _ in dataset})
        anchors = sorted({size for _, size in dataset})
        sums = np.full((4, len(learners), len(anchors)), np.nan)
        sums[3] = 0
        row, column = {n: i for i, n in enumerate(learners)}, {a: j for j, a in enumerate(anchors)}
        for (learner, size), cell in dataset.items():
            sums[:, row[learner], column[size]] = cell
        seeds = sums[3].astype(np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = sums[:3] / sums[3]  # NaN where a learner never reached the anchor
        np.savez(
            folder / f"{openml_id}.npz",
            learners=np.array(learners),
            anchors=np.array(anchors, dtype=np.int64),
            score_valid=means[0],
            score_test=means[1],
            traintime=means[2],
            seeds=seeds,
        )
    return sorted(by_dataset)


def parsed_lcdb(csv_path: Path) -> tuple[Path, dict]:
    """The verified cache folder of `csv_path` and its manifest, parsed first if need be.

    The folder is trusted only if its manifest checks out and names this CSV's sha256; the check
    and the parse run under a lock file, so concurrent processes parse once.
    """
    digest = file_digest(csv_path)
    folder = cache_dir("lcdb") / f"{csv_path.stem}-{digest[:16]}"

    def parse(staging: Path) -> dict:
        logger.info("parsing %s once into %s (seconds)", csv_path, folder)
        return {
            "source": csv_path.name,
            "openml_ids": _write_datasets(_aggregate(csv_path), staging),
        }

    manifest = cached_folder(folder, {"source_sha256": digest, "format": PARSE_FORMAT}, parse)
    return folder, manifest


def lcdb_datasets(path: str | Path | None = None, *, metric: str = "accuracy") -> list[int]:
    """The OpenML ids of LCDB's datasets (248 in `lcdb` 0.1.0), ascending.

    Args:
        path: an LCDB CSV; default `database-<metric>.csv` of the installed `lcdb` package.
        metric: "accuracy", "auc" or "f1".
    """
    _, manifest = parsed_lcdb(lcdb_csv(metric, path))
    return list(manifest["openml_ids"])


def lcdb_curves(
    openml_id: int, *, metric: str = "accuracy", path: str | Path | None = None
) -> LearningCurves:
    """The learning curves of LCDB's learners on one OpenML dataset, over training-set size.

    Args:
        openml_id: the dataset's OpenML id (`lcdb_datasets()` lists them), e.g. 3 (kr-vs-kp).
        metric: "accuracy", "auc" or "f1" (LCDB's `database-<metric>.csv`).
        path: an LCDB CSV of your own; default the installed `lcdb` package's.
    Returns:
        `LearningCurves` named `lcdb-<id>` with fidelity "train_size": configurations
        `{"learner": name}` for the learners that reached every anchor, steps the anchors
        (sizes), values / test values the mean validation / test score over seeds, costs the mean
        training seconds at each anchor, no `initial_value`.

    Example:
        >>> curves = lcdb_curves(3)
        >>> curves.values.shape, curves.steps[:3]
        ((18, 16), array([16., 23., 32.]))
    """
    if isinstance(openml_id, bool) or not isinstance(openml_id, int | np.integer):
        raise TypeError(f"openml_id must be an int, got {openml_id!r}")
    csv_path = lcdb_csv(metric, path)
    folder, manifest = parsed_lcdb(csv_path)
    known = manifest["openml_ids"]
    if int(openml_id) not in known:
        raise ValueError(
            f"no dataset with OpenML id {openml_id} in {csv_path}; lcdb_datasets() lists its "
            f"{len(known)} ids: {', '.join(map(str, known[:12]))}, ..."
        )
    with np.load(folder / f"{int(openml_id)}.npz", allow_pickle=False) as data:
        table = {key: data[key] for key in data.files}
    complete = (table["seeds"] > 0).all(axis=1)
    learners = [str(name) for name in table["learners"][complete]]
    if not learners:
        raise ValueError(f"LCDB dataset {openml_id}: no learner reached every anchor")
    dropped = [str(name) for name in table["learners"][~complete]]
    if dropped:
        logger.info("LCDB %s: dropped learners missing an anchor: %s", openml_id, dropped)
    return LearningCurves(
        name=f"lcdb-{int(openml_id)}",
        fidelity="train_size",
        configs=tuple({"learner": name} for name in learners),
        space={"learner": {"type": "categorical", "choices": learners}},
        values=table["score_valid"][complete],
        costs=table["traintime"][complete],
        test_values=table["score_test"][complete],
        steps=table["anchors"],
    )
