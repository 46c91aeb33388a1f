"""Learning-curve tables: the shipped Fashion-MNIST sweep, LCDB, and the published LCBench /
TaskSet / PD1 formats, each read from a tiny file written here in its exact layout."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import benchdata
from benchdata import (
    DataNotFoundError,
    LearningCurves,
    fashion_mnist_curves,
    lcbench_curves,
    lcdb_curves,
    lcdb_datasets,
    pd1_curves,
    taskset_curves,
)
from benchdata.__main__ import main
from benchdata.curves import TEST_TAG, VALUE_TAG
from benchdata.hpo_tables import LCBENCH_SPACE, TASKSET_SPACE

SHARED_CACHE = os.environ.get(benchdata.CACHE_ENV)  # the run's own, before the fixture below


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(benchdata.CACHE_ENV, str(tmp_path / "cache"))


def authors_pfn_normalize(lb, ub, soft_lb, soft_ub, minimize):
    """The CFBO authors' `benchmark/utils.py::pfn_normalize` (LC-PFN's), in torch: the oracle."""
    lb, ub = torch.tensor(lb, dtype=torch.float64), torch.tensor(ub, dtype=torch.float64)

    def cinv(x):
        return 1 - x if minimize else x

    def lin_soft(x):
        return 2 / (soft_ub - soft_lb) * (x - soft_lb) - 1

    if torch.isinf(ub):
        a = 1 / (1 - 1 / (1 + torch.exp(-lin_soft(lb))))
        b = 1 - a
        return lambda x: cinv(a / (1 + torch.exp(-lin_soft(x))) + b)
    a = (
        1
        + torch.exp(-lin_soft(ub))
        + torch.exp(-lin_soft(lb))
        + torch.exp(-lin_soft(ub) - lin_soft(lb))
    ) / (torch.exp(-lin_soft(lb)) - torch.exp(-lin_soft(ub)))
    b = -a / (1 + torch.exp(-lin_soft(lb)))
    return lambda x: cinv(a / (1 + torch.exp(-lin_soft(x))) + b)


# ------------------------------------------------------------------ LearningCurves itself

SPACE = {
    "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    "width": {"type": "int", "low": 16, "high": 256, "log": True},
    "depth": {"type": "int", "low": 1, "high": 3, "log": False},
    "optimizer": {"type": "categorical", "choices": ["sgd", "adam"]},
}
CONFIGS = (
    {"lr": 1e-3, "width": 64, "depth": 2, "optimizer": "adam"},
    {"lr": 1e-4, "width": 256, "depth": 1, "optimizer": "sgd"},
    {"lr": 1e-1, "width": 16, "depth": 3, "optimizer": "adam"},
)


def make_curves(**changes) -> LearningCurves:
    fields = {
        "name": "toy",
        "fidelity": "epoch",
        "configs": CONFIGS,
        "space": SPACE,
        "values": [[0.2, 0.5, 0.7, 0.75], [0.1, 0.1, 0.15, 0.2], [0.5, 0.8, 0.85, 0.8]],
        "costs": [[1.5, 1.25, 1.0, 1.0], [0.1, 0.2, 0.3, 0.4], [2.0, 2.0, 2.0, 2.0]],
        "test_values": [[0.2, 0.4, 0.6, 0.7], [0.1, 0.1, 0.1, 0.2], [0.4, 0.7, 0.8, 0.8]],
        "steps": [1, 2, 3, 4],
        "initial_value": 0.1,
    }
    fields.update(changes)
    return LearningCurves(**fields)


def test_encode_matches_a_hand_computation():
    encoded = make_curves().encode()
    # lr: log10 position in [-4, -1]; width: log2 position in [4, 8]; depth: (d - 1) / 2;
    # optimizer: one-hot over ["sgd", "adam"]
    expected = [
        [1 / 3, 2 / 4, 1 / 2, 0, 1],
        [0, 1, 0, 1, 0],
        [1, 0, 1, 0, 1],
    ]
    np.testing.assert_allclose(encoded, expected, atol=1e-12)


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_save_load_round_trip_in_the_lcbench_layout(tmp_path, suffix):
    curves = make_curves()
    path = tmp_path / f"toy{suffix}"
    curves.save(path)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == (suffix == ".json.gz")
    loaded = LearningCurves.load(path)
    assert loaded.name == "toy"
    assert loaded.fidelity == "epoch"
    assert loaded.configs == CONFIGS
    assert loaded.space == SPACE
    np.testing.assert_array_equal(loaded.values, curves.values)
    np.testing.assert_array_equal(loaded.test_values, curves.test_values)
    np.testing.assert_array_equal(loaded.steps, curves.steps)
    np.testing.assert_allclose(loaded.costs, curves.costs, rtol=1e-12)
    assert loaded.initial_value == 0.1
    # what the CFBO authors' reader sees: y_0 first, then the curve; `time` is cumulative
    raw = path.read_bytes()
    document = json.loads(gzip.decompress(raw) if suffix.endswith(".gz") else raw)
    record = document["toy"]["1"]
    assert record["config"] == CONFIGS[1]
    assert record["log"][VALUE_TAG] == [0.1, 0.1, 0.1, 0.15, 0.2]
    np.testing.assert_allclose(record["log"]["time"], [0, 0.1, 0.3, 0.6, 1.0])
    # one reader serves both: lcbench_curves reads a saved table with its own space
    same = lcbench_curves(path, normalize=False)
    assert same.configs == CONFIGS
    np.testing.assert_array_equal(same.values, curves.values)


def test_save_writes_null_for_an_unknown_initial_value(tmp_path):
    make_curves(initial_value=None, test_values=None).save(tmp_path / "t.json")
    loaded = LearningCurves.load(tmp_path / "t.json")
    assert loaded.initial_value is None
    assert loaded.test_values is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"values": [[0.2, math.nan, 0.7, 0.75], [0.1] * 4, [0.5] * 4]}, "NaN"),
        ({"costs": [[1.0] * 3] * 3}, r"costs must have shape \(3, 4\)"),
        ({"test_values": [[0.5] * 4] * 2}, r"test_values must have shape \(3, 4\)"),
        ({"values": [[0.2, 1.5, 0.7, 0.75], [0.1] * 4, [0.5] * 4]}, r"values must be \[0.0, 1.0\]"),
        ({"costs": [[-1.0] * 4, [1.0] * 4, [1.0] * 4]}, "costs must be >= 0"),
        ({"steps": [1, 3, 2, 4]}, "strictly increasing"),
        ({"fidelity": "iterations"}, "fidelity must be one of"),
        ({"configs": ()}, "configs is empty"),
        ({"configs": (*CONFIGS[:2], {**CONFIGS[2], "lr": 0.5})}, r"outside \[0.0001, 0.1\]"),
        ({"configs": (*CONFIGS[:2], {"lr": 0.01})}, "missing"),
        ({"configs": (*CONFIGS[:2], {**CONFIGS[2], "optimizer": "rmsprop"})}, "not one of"),
        ({"configs": (*CONFIGS[:2], {**CONFIGS[2], "depth": 1.5})}, "not a whole number"),
        (
            {"space": {**SPACE, "lr": {"type": "float", "low": 0, "high": 1, "log": True}}},
            "low > 0",
        ),
        ({"space": {**SPACE, "lr": {"type": "bool"}}}, "expected"),
        ({"initial_value": 1.5}, "initial_value"),
    ],
)
def test_bad_tables_are_refused_with_a_clear_message(changes, message):
    with pytest.raises(ValueError, match=message):
        make_curves(**changes)


def test_arrays_are_read_only_copies():
    values = np.full((3, 4), 0.5)
    curves = make_curves(values=values)
    values[0, 0] = 0.9
    assert curves.values[0, 0] == 0.5
    with pytest.raises(ValueError, match="read-only"):
        curves.values[0, 0] = 0.1


def test_cfbo_normalized_is_the_authors_map():
    curves = make_curves()
    normalized = curves.cfbo_normalized()
    # soft bounds: min and max over the values and y_0 = 0.1 -> [0.1, 0.85]
    oracle = authors_pfn_normalize(0.0, 1.0, 0.1, 0.85, minimize=False)
    expected = oracle(torch.tensor(curves.values, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(normalized.values, expected, atol=1e-9)
    assert normalized.initial_value == pytest.approx(float(oracle(torch.tensor(0.1))), abs=1e-6)
    np.testing.assert_array_equal(normalized.costs, curves.costs)
    order = np.argsort(curves.values, axis=None, kind="stable")
    assert (np.diff(normalized.values.ravel()[order]) >= 0).all()  # order is kept


# ------------------------------------------------------------------ LCBench and TaskSet files

LCBENCH_CONSTANTS = {"imputation_strategy": "mean", "network": "shapedmlpnet", "loss": "CE"}


def lcbench_config(i: int) -> dict:
    return {
        "batch_size": [16, 71, 512][i],
        "learning_rate": [1e-4, 0.003, 0.1][i],
        "momentum": [0.1, 0.5, 0.99][i],
        "weight_decay": [1e-5, 0.05, 0.1][i],
        "num_layers": [1, 3, 5][i],
        "max_units": [64, 246, 1024][i],
        "max_dropout": [0.0, 0.25, 1.0][i],
        **LCBENCH_CONSTANTS,
    }


def write_lcbench(path: Path, datasets=("segment", "kc1")) -> dict:
    val = [[0.1, 0.5, 0.6, 0.7], [0.12, 0.3, 0.3, 0.35], [0.09, 0.6, 0.8, 0.75]]
    test = [[0.1, 0.45, 0.55, 0.65], [0.1, 0.3, 0.3, 0.3], [0.1, 0.6, 0.7, 0.7]]
    time = [[0.5, 2.0, 3.5, 5.5], [0.2, 1.0, 1.5, 2.5], [1.0, 4.0, 8.0, 9.0]]
    document = {
        name: {
            str(i): {
                "config": lcbench_config(i),
                "log": {
                    VALUE_TAG: val[i],
                    TEST_TAG: test[i],
                    "Train/val_accuracy": [100 * v for v in val[i]],  # LCBench's percentages
                    "time": time[i],
                    "epoch": [1, 2, 3, 4],
                },
                "results": {"OpenML_task_id": 146822},
            }
            for i in (2, 0, 1)  # ids are strings, in no particular order
        }
        for name in datasets
    }
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as handle:
        json.dump(document, handle)
    return {"val": np.array(val), "test": np.array(test), "time": np.array(time)}


@pytest.mark.parametrize("name", ["data_2k.json", "data_2k.json.gz"])
def test_lcbench_reads_the_published_layout(tmp_path, name):
    raw = write_lcbench(tmp_path / name)
    curves = lcbench_curves(tmp_path / name, "kc1", normalize=False)
    assert curves.name == "kc1"
    assert curves.fidelity == "epoch"
    np.testing.assert_array_equal(curves.values, raw["val"][:, 1:])
    np.testing.assert_array_equal(curves.test_values, raw["test"][:, 1:])
    np.testing.assert_array_equal(curves.steps, [1, 2, 3])
    # step 1 costs the whole time until its result; later steps the differences
    np.testing.assert_allclose(curves.costs, [[2.0, 1.5, 2.0], [1.0, 0.5, 1.0], [4.0, 4.0, 1.0]])
    assert curves.initial_value == pytest.approx((0.1 + 0.12 + 0.09) / 3)
    assert curves.space == LCBENCH_SPACE
    assert curves.configs[1] == {k: lcbench_config(1)[k] for k in LCBENCH_SPACE}
    assert isinstance(curves.configs[1]["batch_size"], int)
    np.testing.assert_allclose(curves.encode()[0], [0, 0, 0, 0, 0, 0, 0], atol=1e-12)
    np.testing.assert_allclose(curves.encode()[2], [1, 1, 1, 1, 1, 1, 1], atol=1e-12)


def test_lcbench_normalized_as_the_authors(tmp_path):
    raw = write_lcbench(tmp_path / "data_2k.json")
    curves = lcbench_curves(tmp_path / "data_2k.json", "segment")
    init = raw["val"][:, 0].mean()
    data = raw["val"][:, 1:]
    oracle = authors_pfn_normalize(
        0.0, 1.0, min(data.min(), init), max(data.max(), init), minimize=False
    )
    np.testing.assert_allclose(
        curves.values, oracle(torch.tensor(data, dtype=torch.float64)).numpy(), atol=1e-9
    )
    assert curves.initial_value == pytest.approx(float(oracle(torch.tensor(init))), abs=1e-6)


def test_lcbench_errors_name_the_file_and_the_datasets(tmp_path):
    write_lcbench(tmp_path / "data_2k.json")
    with pytest.raises(ValueError, match=r"'higgs' is not in .*data_2k.json.*kc1.*segment"):
        lcbench_curves(tmp_path / "data_2k.json", "higgs")
    with pytest.raises(ValueError, match="holds 2 datasets"):
        lcbench_curves(tmp_path / "data_2k.json")
    with pytest.raises(FileNotFoundError, match=r"nowhere\.json"):
        lcbench_curves(tmp_path / "nowhere.json", "kc1")
    # a published file has no search space recorded: `load` says which reader to use
    with pytest.raises(ValueError, match="lcbench_curves"):
        LearningCurves.load(tmp_path / "data_2k.json", "kc1")


def test_lcbench_refuses_nan_and_ragged_curves(tmp_path):
    write_lcbench(tmp_path / "data_2k.json", datasets=("kc1",))
    document = json.loads((tmp_path / "data_2k.json").read_text())
    document["kc1"]["1"]["log"][VALUE_TAG][2] = math.nan
    (tmp_path / "nan.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"nan.json \[kc1\]: values must be finite.*\(1, 1\)"):
        lcbench_curves(tmp_path / "nan.json", normalize=False)
    document["kc1"]["1"]["log"][VALUE_TAG] = [0.1, 0.2]
    (tmp_path / "ragged.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match="differ in length"):
        lcbench_curves(tmp_path / "ragged.json")


def write_taskset(path: Path) -> np.ndarray:
    rng = np.random.default_rng(0)
    losses = np.array(
        [[4.0, 3.0, 2.0, 1.0], [4.0, 4.5, 6.0, math.nan], [3.0, 1.5, 0.5, 0.25]]
    )  # entry 0 before training; a diverged run ends in NaN
    configs = [
        {
            name: float(np.exp(rng.uniform(np.log(e["low"]), np.log(e["high"]))))
            if e["log"]
            else float(rng.uniform(e["low"], e["high"]))
            for name, e in TASKSET_SPACE.items()
        }
        for _ in range(3)
    ]
    document = {
        "rnn_text_classification_family_seed8": {
            str(i): {"config": configs[i], "log": {VALUE_TAG: losses[i].tolist()}, "results": {}}
            for i in range(3)
        }
    }
    path.write_text(json.dumps(document))  # NaN is written as the token NaN, as Python does
    return losses


def test_taskset_losses_become_higher_is_better_as_the_authors_map_them(tmp_path):
    losses = write_taskset(tmp_path / "taskset_chosen.json")
    curves = taskset_curves(tmp_path / "taskset_chosen.json")
    y_0 = losses[:, 0].mean()  # 11/3
    oracle = authors_pfn_normalize(0.0, math.inf, 0.0, y_0, minimize=True)
    expected = oracle(torch.tensor(losses[:, 1:], dtype=torch.float64)).numpy()
    expected[1, 2] = 0.0  # the diverged run scores the worst value
    np.testing.assert_allclose(curves.values, expected, atol=1e-9)
    assert curves.initial_value == pytest.approx(float(oracle(torch.tensor(y_0))), abs=1e-6)
    # closed form at L = 0 is 1; the map is decreasing in the loss
    assert float(oracle(torch.tensor(0.0))) == pytest.approx(1.0)
    assert curves.values[0, 0] > curves.values[1, 0]
    np.testing.assert_array_equal(curves.costs, np.ones((3, 3)))  # no time: one unit per step
    assert curves.test_values is None
    assert curves.space == TASKSET_SPACE


# ------------------------------------------------------------------ PD1 (syne-tune blackbox)

PD1_TASK = "fashion_mnist_max_pooling_cnn_tanh_batch_size_256"


def write_pd1(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    objectives = ["metric_valid_error_rate", "metric_valid_ce_loss", "metric_elapsed_time"]
    error = np.array(
        [
            [0.9, 0.5, 0.4, 0.3, 0.25, 0.2],
            [0.9, 0.9, 0.9, 0.8, 0.8, 0.8],
            [0.8, 0.6, 0.5, math.nan, math.nan, math.nan],  # a shorter curve, NaN-padded
            [0.9, 0.3, 0.2, 0.15, 0.1, 0.1],
        ]
    )
    elapsed = np.cumsum(np.array([[1.0, 2, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1]] * 2), axis=1)
    evaluations = np.stack([error, 2 * error, elapsed], axis=-1)[:, None]  # one seed
    np.save(folder / f"{PD1_TASK}-objectives_evaluations.npy", evaluations.astype(np.float32))
    np.save(folder / f"{PD1_TASK}-fidelity_values.npy", np.arange(1, 7))
    (folder / f"{PD1_TASK}-fidelity_space.json").write_text("{}")
    hyperparameters = {
        "lr_initial_value": [1e-5, 0.01, 1.0, 10.0],
        "lr_power": [0.1, 0.5, 1.0, 2.0],
        "lr_decay_steps_factor": [0.01, 0.2, 0.5, 0.99],
        "one_minus_momentum": [1e-3, 0.01, 0.1, 1.0],
    }
    pq.write_table(
        pa.table(hyperparameters),
        folder / f"{PD1_TASK}-hyperparameters.parquet",
        compression="gzip",
    )
    metadata = {"objectives_names": objectives, "task_names": [PD1_TASK, "other_task"]}
    (folder / "metadata.json").write_text(json.dumps(metadata))
    return error.astype(np.float32).astype(np.float64), elapsed


def test_pd1_reads_syne_tunes_blackbox_folder(tmp_path):
    pytest.importorskip("pyarrow", reason="pd1_curves reads parquet through pyarrow")
    error, elapsed = write_pd1(tmp_path / "pd1")
    curves = pd1_curves(tmp_path / "pd1", PD1_TASK, normalize=False, num_steps=10)
    kept = [0, 1, 3]  # the NaN-padded curve is dropped
    accuracy = 1 - error[kept]
    assert curves.n_configs == 3
    assert curves.configs[2]["lr_initial_value"] == 10.0
    # 11 points over 6 evaluations: every half evaluation; point 0 is y_0
    np.testing.assert_allclose(curves.values[:, 1::2], accuracy[:, 1:], atol=1e-12)
    np.testing.assert_allclose(
        curves.values[:, 0::2], (accuracy[:, :-1] + accuracy[:, 1:]) / 2, atol=1e-12
    )
    assert curves.initial_value == pytest.approx(accuracy[:, 0].mean())
    np.testing.assert_allclose(curves.costs.sum(axis=1), elapsed[kept, -1])
    np.testing.assert_allclose(curves.costs[:, 0], (elapsed[kept, 0] + elapsed[kept, 1]) / 2)
    np.testing.assert_array_equal(curves.steps, np.arange(1, 11))
    assert curves.test_values is None
    # the authors' list of rows, and their squashing
    chosen = pd1_curves(tmp_path / "pd1", PD1_TASK, num_steps=10, indices=[3, 0])
    assert [c["lr_power"] for c in chosen.configs] == [2.0, 0.1]
    values = np.interp(np.linspace(0, 5, 11), np.arange(6), 1 - error[3])
    init = np.mean([1 - error[3, 0], 1 - error[0, 0]])
    raw = pd1_curves(tmp_path / "pd1", PD1_TASK, num_steps=10, indices=[3, 0], normalize=False)
    oracle = authors_pfn_normalize(
        0.0, 1.0, min(raw.values.min(), init), max(raw.values.max(), init), minimize=False
    )
    np.testing.assert_allclose(
        chosen.values[0], oracle(torch.tensor(values[1:], dtype=torch.float64)).numpy(), atol=1e-9
    )


def test_pd1_errors(tmp_path):
    pytest.importorskip("pyarrow", reason="pd1_curves reads parquet through pyarrow")
    write_pd1(tmp_path / "pd1")
    with pytest.raises(FileNotFoundError, match="no-pd1"):
        pd1_curves(tmp_path / "no-pd1", PD1_TASK)
    with pytest.raises(ValueError, match="'imagenet' is not in"):
        pd1_curves(tmp_path / "pd1", "imagenet")
    with pytest.raises(ValueError, match=r"rows \[2\] are incomplete"):
        pd1_curves(tmp_path / "pd1", PD1_TASK, indices=[0, 2])


# ------------------------------------------------------------------ LCDB

LCDB_HEADER = (
    "openmlid,learner,size_train,size_test,outer_seed,inner_seed,traintime,score_train,"
    "score_valid,score_test"
)
LCDB_ROWS = [
    # dataset 11: learner A at 3 anchors, two seeds each; B misses anchor 32
    "11,A,16,100,0,0,0.010,1.0,0.50,0.40",
    "11,A,16,100,0,1,0.030,1.0,0.60,0.50",
    "11,A,23,100,0,0,0.020,1.0,0.70,0.60",
    "11,A,23,100,0,1,0.040,1.0,0.80,0.64",
    "11,A,32,100,0,0,0.050,1.0,0.90,0.80",
    "11,A,32,100,1,0,0.070,1.0,0.85,0.90",
    "11,B,16,100,0,0,0.100,1.0,0.30,0.30",
    "11,B,23,100,0,0,0.200,1.0,0.35,0.30",
    "11,C,16,100,0,0,0.001,1.0,0.20,0.20",
    "11,C,23,100,0,0,0.002,1.0,0.30,0.30",
    "11,C,32,100,0,0,0.004,1.0,0.40,0.50",
    "12,A,16,50,0,0,0.010,1.0,0.50,0.50",
]


def write_lcdb(path: Path, rows=LCDB_ROWS) -> Path:
    path.write_text("\n".join([LCDB_HEADER, *rows]) + "\n")
    return path


def test_lcdb_averages_seeds_and_drops_learners_missing_an_anchor(tmp_path):
    csv_path = write_lcdb(tmp_path / "database-accuracy.csv")
    assert lcdb_datasets(csv_path) == [11, 12]
    curves = lcdb_curves(11, path=csv_path)
    assert curves.name == "lcdb-11"
    assert curves.fidelity == "train_size"
    assert curves.configs == ({"learner": "A"}, {"learner": "C"})  # B lacks anchor 32
    assert curves.space == {"learner": {"type": "categorical", "choices": ["A", "C"]}}
    np.testing.assert_array_equal(curves.steps, [16, 23, 32])
    np.testing.assert_allclose(curves.values, [[0.55, 0.75, 0.875], [0.2, 0.3, 0.4]])
    np.testing.assert_allclose(curves.test_values, [[0.45, 0.62, 0.85], [0.2, 0.3, 0.5]])
    np.testing.assert_allclose(curves.costs, [[0.02, 0.03, 0.06], [0.001, 0.002, 0.004]])
    assert curves.initial_value is None
    np.testing.assert_array_equal(curves.encode(), np.eye(2))


def test_lcdb_parses_once_and_trusts_only_a_verified_cache(tmp_path, monkeypatch):
    csv_path = write_lcdb(tmp_path / "database-accuracy.csv")
    first = lcdb_curves(11, path=csv_path)
    (folder,) = [p for p in (tmp_path / "cache" / "lcdb").iterdir() if p.is_dir()]
    calls = []
    original = benchdata.lcdb._aggregate
    monkeypatch.setattr(benchdata.lcdb, "_aggregate", lambda p: calls.append(p) or original(p))
    again = lcdb_curves(11, path=csv_path)
    assert calls == []
    np.testing.assert_array_equal(again.values, first.values)
    (folder / "11.npz").write_bytes(b"tampered")
    lcdb_curves(11, path=csv_path)
    assert calls == [csv_path]  # parsed again
    # a changed CSV is a different cache entry
    write_lcdb(csv_path, [*LCDB_ROWS, "13,A,16,50,0,0,0.010,1.0,0.5,0.5"])
    assert lcdb_datasets(csv_path) == [11, 12, 13]


def test_lcdb_errors_name_the_problem(tmp_path):
    csv_path = write_lcdb(tmp_path / "database-accuracy.csv")
    with pytest.raises(ValueError, match=r"no dataset with OpenML id 99 .* 2 ids: 11, 12"):
        lcdb_curves(99, path=csv_path)
    with pytest.raises(ValueError, match="metric must be one of"):
        lcdb_curves(11, metric="logloss", path=csv_path)
    with pytest.raises(TypeError, match="openml_id must be an int"):
        lcdb_curves("kr-vs-kp", path=csv_path)
    missing = tmp_path / "gone.csv"
    with pytest.raises(DataNotFoundError, match=r"pip install --no-deps lcdb==0\.1\.0") as error:
        lcdb_curves(11, path=missing)
    assert str(missing) in str(error.value)
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not an LCDB table"):
        lcdb_datasets(tmp_path / "other.csv")
    write_lcdb(tmp_path / "bad.csv", [*LCDB_ROWS, "11,A,sixteen,100,0,0,0.1,1.0,0.5,0.5"])
    with pytest.raises(ValueError, match="line 14"):
        lcdb_datasets(tmp_path / "bad.csv")


@pytest.mark.skipif(importlib.util.find_spec("lcdb") is None, reason="lcdb is not installed")
def test_lcdb_real_database(monkeypatch):
    # the run's shared cache, so that the 150 MB CSV is parsed once, not once per test run
    if SHARED_CACHE is None:
        monkeypatch.delenv(benchdata.CACHE_ENV)
    else:
        monkeypatch.setenv(benchdata.CACHE_ENV, SHARED_CACHE)
    csv_path = benchdata.lcdb.lcdb_csv()
    assert len(lcdb_datasets()) == 248
    curves = lcdb_curves(44)  # spambase: the CSV's first block of rows is the oracle
    cells: dict[tuple[str, int], list[dict]] = {}
    with csv_path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["openmlid"] != "44":
                break
            cells.setdefault((row["learner"], int(row["size_train"])), []).append(row)
    anchors = sorted({anchor for _, anchor in cells})
    learners = sorted({learner for learner, _ in cells})
    np.testing.assert_array_equal(curves.steps, anchors)
    complete = [name for name in learners if all((name, a) in cells for a in anchors)]
    assert [c["learner"] for c in curves.configs] == complete
    for i, name in enumerate(complete):
        for j, anchor in enumerate(anchors):
            cell = cells[name, anchor]
            mean_valid = sum(float(r["score_valid"]) for r in cell) / len(cell)
            mean_time = sum(float(r["traintime"]) for r in cell) / len(cell)
            assert curves.values[i, j] == pytest.approx(mean_valid)
            assert curves.costs[i, j] == pytest.approx(mean_time)


# ------------------------------------------------------------------ the shipped Fashion-MNIST table


def test_shipped_fashion_mnist_table_is_real_and_diverse():
    curves = fashion_mnist_curves()
    assert curves.name == "fashion_mnist_mlp"
    assert curves.fidelity == "epoch"
    assert curves.values.shape == curves.test_values.shape == curves.costs.shape == (200, 30)
    np.testing.assert_array_equal(curves.steps, np.arange(1, 31))
    assert ((curves.values >= 0) & (curves.values <= 1)).all()
    assert np.isfinite(curves.costs).all()
    assert (curves.costs > 0).all()
    assert 0.0 < curves.initial_value < 0.2  # untrained networks: about chance (0.1)
    assert curves.encode().shape == (200, 11)
    final, best = curves.values[:, -1], curves.values.max(axis=1)
    assert final.max() > 0.8  # good MLPs reach over 80% on 4,000 training images
    assert final.std() > 0.05  # not degenerate
    assert (final < 0.2).sum() >= 1  # some diverge or never learn
    assert ((best - final) > 0.01).sum() >= 5  # some overfit: they end below their peak
    assert ((final - curves.values[:, 19]) > 0.01).sum() >= 5  # some still improve after 20
    shipped = Path(benchdata.__file__).parent / "data" / "fashion_mnist_mlp_curves.json.gz"
    assert shipped.stat().st_size < 1_000_000


def test_curves_sweep_command_reproduces_the_shipped_table(tmp_path, capsys):
    out = tmp_path / "sweep.json.gz"
    assert main(["curves-sweep", "--out", str(out), "--configs", "2", "--epochs", "2"]) == 0
    assert "2 configurations x 2 epochs" in capsys.readouterr().out
    small, shipped = LearningCurves.load(out), fashion_mnist_curves()
    assert small.configs == shipped.configs[:2]
    # the same seeded data, configurations and training: accuracies agree (up to a few images
    # where another CPU's float rounding tips a prediction)
    np.testing.assert_allclose(small.values, shipped.values[:2, :2], atol=0.005)
    assert (small.costs > 0).all()
