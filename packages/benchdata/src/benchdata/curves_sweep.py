"""The Fashion-MNIST MLP sweep behind `fashion_mnist_curves()`: real curves from real training.

`benchdata curves-sweep --out FILE [--configs 200 --epochs 30 --seed 0]` samples configurations
from `SWEEP_SPACE` with a seeded generator and trains each on a fixed seeded subset of
Fashion-MNIST (4,000 training and 2,000 validation images from the official training split, 2,000
test images from the official test split; pixels scaled to [0, 1], flattened to 784). After every
epoch it records the validation accuracy, the test accuracy and the wall-clock seconds of that
epoch (its training pass plus the validation pass a freeze-thaw optimizer pays to see the value;
the test pass is bookkeeping and not counted). Before the first epoch it evaluates the untrained
network, whose mean validation accuracy is the table's `initial_value`.

Each configuration is an MLP `784 -> width -> ... -> 10` (`depth` hidden layers, ReLU, dropout
after each hidden layer) trained with cross-entropy by SGD with momentum 0.9 or Adam, weight decay
as an L2 term in the optimizer, constant learning rate, reshuffled batches every epoch. Torch runs
on one thread. Accuracies are reproducible from the seed; the seconds are measurements and are not.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from benchdata.curves import LearningCurves
from benchdata.vision import fashion_mnist

logger = logging.getLogger(__name__)

SWEEP_SPACE: dict[str, dict[str, Any]] = {
    "learning_rate": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    "width": {"type": "int", "low": 16, "high": 256, "log": True},
    "depth": {"type": "int", "low": 1, "high": 3, "log": False},
    "weight_decay": {"type": "float", "low": 1e-6, "high": 1e-2, "log": True},
    "dropout": {"type": "float", "low": 0.0, "high": 0.5, "log": False},
    "batch_size": {"type": "categorical", "choices": [32, 64, 128, 256]},
    "optimizer": {"type": "categorical", "choices": ["sgd_momentum", "adam"]},
}
# sized to fit: 200 configurations x 30 epochs take about 7 minutes on one core (a sample of 40
# measured first: 8,000 training images and widths up to 512 would have taken 18)
SPLIT_SIZES = {"train": 4000, "valid": 2000, "test": 2000}
SGD_MOMENTUM = 0.9


def sample_configs(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` configurations drawn from `SWEEP_SPACE`: log-uniform where `log`, else uniform; ints
    rounded; categoricals uniform."""
    rng = np.random.default_rng([seed, 1])
    configs = []
    for _ in range(n):
        config: dict[str, Any] = {}
        for name, entry in SWEEP_SPACE.items():
            if entry["type"] == "categorical":
                config[name] = entry["choices"][int(rng.integers(len(entry["choices"])))]
                continue
            scale = math.log if entry["log"] else float
            low, high = scale(entry["low"]), scale(entry["high"])
            value = rng.uniform(low, high)
            value = math.exp(value) if entry["log"] else value
            if entry["type"] == "int":
                value = int(min(max(round(value), entry["low"]), entry["high"]))
            else:
                value = float(min(max(value, entry["low"]), entry["high"]))
            config[name] = value
        configs.append(config)
    return configs


def sweep_data(seed: int, path: str | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The seeded split: `{"train" | "valid" | "test": (images, labels)}`, images float32
    `(N, 784)` in [0, 1], labels int64 `(N,)`."""
    rng = np.random.default_rng([seed, 0])
    train, test = fashion_mnist("train", path=path), fashion_mnist("test", path=path)
    order = rng.permutation(len(train.labels))
    n_train, n_valid = SPLIT_SIZES["train"], SPLIT_SIZES["valid"]
    picks = {
        "train": (train, order[:n_train]),
        "valid": (train, order[n_train : n_train + n_valid]),
        "test": (test, rng.permutation(len(test.labels))[: SPLIT_SIZES["test"]]),
    }
    return {
        split: (
            torch.from_numpy(data.images[index].reshape(len(index), -1).astype(np.float32) / 255),
            torch.from_numpy(data.labels[index]),
        )
        for split, (data, index) in picks.items()
    }


def build_mlp(config: dict[str, Any]) -> nn.Sequential:
    layers: list[nn.Module] = []
    width_in = 784
    for _ in range(config["depth"]):
        layers += [nn.Linear(width_in, config["width"]), nn.ReLU(), nn.Dropout(config["dropout"])]
        width_in = config["width"]
    return nn.Sequential(*layers, nn.Linear(width_in, 10))


def _accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        predicted = model(images).argmax(dim=1)  # a diverged (NaN) network predicts one class
    return float((predicted == labels).double().mean())


def train_curve(
    config: dict[str, Any], data: dict, epochs: int, seed: int
) -> tuple[float, list[float], list[float], list[float]]:
    """Train one configuration: (accuracy before training, validation accuracies, test
    accuracies, seconds of each epoch)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = build_mlp(config)
    if config["optimizer"] == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(
            model.parameters(), lr=config["learning_rate"], weight_decay=config["weight_decay"]
        )
    else:
        optimizer = torch.optim.SGD(
            model.parameters(),
            lr=config["learning_rate"],
            momentum=SGD_MOMENTUM,
            weight_decay=config["weight_decay"],
        )
    loss_fn = nn.CrossEntropyLoss()
    images, labels = data["train"]
    initial = _accuracy(model, *data["valid"])
    valid, test, seconds = [], [], []
    for _ in range(epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(labels), generator=generator)
        for batch in order.split(config["batch_size"]):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(images[batch]), labels[batch]).backward()
            optimizer.step()
        valid.append(_accuracy(model, *data["valid"]))
        seconds.append(time.perf_counter() - start)
        test.append(_accuracy(model, *data["test"]))
    return initial, valid, test, seconds


def run_sweep(
    configs: int = 200, epochs: int = 30, seed: int = 0, *, path: str | None = None
) -> LearningCurves:
    """Train `configs` sampled MLPs for `epochs` epochs each on one thread; see the module doc.

    Args:
        configs: how many configurations to sample and train.
        epochs: epochs per configuration (steps of the table).
        seed: seeds the data split, the configurations and every training run.
        path: a Fashion-MNIST folder (`fashion_mnist(path=...)`); default the Debian package's.
    Returns:
        `LearningCurves` named "fashion_mnist_mlp", values `(configs, epochs)`.
    """
    if configs < 1 or epochs < 1:
        raise ValueError(f"configs and epochs must be >= 1, got {configs} and {epochs}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = sweep_data(seed, path)
        sampled = sample_configs(configs, seed)
        initial, valid, test, costs = [], [], [], []
        start = time.perf_counter()
        for index, config in enumerate(sampled):
            curve = train_curve(config, data, epochs, seed=seed * 1_000_003 + index)
            initial.append(curve[0])
            valid.append(curve[1])
            test.append(curve[2])
            # a measured time never rounds to a zero cost
            costs.append([max(round(s, 4), 1e-4) for s in curve[3]])
            if (index + 1) % max(1, configs // 20) == 0 or index + 1 == configs:
                logger.info(
                    "curves-sweep: %d/%d configurations, %.0f s",
                    index + 1,
                    configs,
                    time.perf_counter() - start,
                )
    finally:
        torch.set_num_threads(threads)
    return LearningCurves(
        name="fashion_mnist_mlp",
        fidelity="epoch",
        configs=tuple(sampled),
        space=SWEEP_SPACE,
        values=np.array(valid),
        costs=np.array(costs),
        test_values=np.array(test),
        steps=np.arange(1, epochs + 1),
        initial_value=float(np.mean(initial)),
    )
