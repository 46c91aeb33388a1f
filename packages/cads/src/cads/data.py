"""Real data split into sources of mixed quality (both from ``benchdata``, installed offline).

* :func:`mixed_fashion_mnist`: Fashion-MNIST training images dealt into disjoint sources: clean,
  labels replaced by another random class at several rates, near-duplicates (a few images each
  repeated), and corrupted images (strong Gaussian pixel noise); validation images are clean and
  from the training split, test images from the test split.
* :func:`mixed_text`: byte windows for a small LM. The target domain is the fortunes corpus:
  clean fortunes, ShareGPT assistant and user turns (other domains), fortunes with a share of
  their bytes replaced by random printable ones, and a few fortune windows repeated; validation
  and test windows come from the fortunes held-out split, so the held-out loss measures the
  target domain.

Every corruption is seeded and documented; ``source_names`` say what each source is.
"""

from __future__ import annotations

import numpy as np
import torch

from cads.models import _seeded, byte_lm, small_cnn
from cads.task import SelectionTask, classification_loss, token_loss

__all__ = ["IMAGE_SOURCES", "TEXT_SOURCES", "mixed_fashion_mnist", "mixed_text", "toy_task"]

IMAGE_SOURCES = (
    "clean",
    "label-noise-20",
    "label-noise-50",
    "label-noise-80",
    "duplicates",
    "corrupted",
)
TEXT_SOURCES = (
    "fortunes",
    "sharegpt-assistant",
    "sharegpt-user",
    "fortunes-corrupted",
    "fortunes-duplicates",
)
DUPLICATE_COPIES = 10  # each image / window of a duplicates source appears this many times
CORRUPTION_STD = 2.0  # Gaussian pixel noise, in units of the standardised pixels
BYTE_CORRUPTION = 0.3  # share of bytes replaced in a corrupted text window


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _noisy_labels(labels: np.ndarray, rate: float, rng, classes: int = 10) -> np.ndarray:
    labels = labels.copy()
    flip = rng.random(len(labels)) < rate
    labels[flip] = (labels[flip] + rng.integers(1, classes, flip.sum())) % classes
    return labels


def mixed_fashion_mnist(
    per_source: int = 500,
    val_size: int = 1000,
    test_size: int = 2000,
    *,
    sources: tuple[str, ...] = IMAGE_SOURCES,
    clean_size: int | None = None,
    downsample: int = 2,
    seed: int = 0,
    path=None,
) -> SelectionTask:
    """Fashion-MNIST as a pool of ``per_source`` images per source, the clean source holding
    ``clean_size`` (default ``per_source // 5``: premium data is scarce, as in the paper's
    setups: 1,000 Alpaca-GPT4 beside 9,000 Alpaca examples, 10,000 DomainNet Real images beside
    the other domains in full), average-pooled by ``downsample`` (28×28 → 14×14 at 2),
    standardised with the first source's pixel statistics (the clean one by default); the model
    is :func:`cads.models.small_cnn`."""
    from benchdata import fashion_mnist

    clean_size = max(1, per_source // 5) if clean_size is None else clean_size
    _check_sizes(per_source=per_source, val_size=val_size, test_size=test_size,
                 downsample=downsample, clean_size=clean_size)  # fmt: skip
    unknown = [s for s in sources if s not in IMAGE_SOURCES]
    if unknown or not sources:
        raise ValueError(f"unknown image source(s) {unknown}; known: {IMAGE_SOURCES}")
    if downsample not in (1, 2):
        raise ValueError(f"downsample must be 1 (28x28) or 2 (14x14), got {downsample}")
    rng = np.random.default_rng(seed)
    train, test = fashion_mnist("train", path=path), fashion_mnist("test", path=path)
    size = {s: clean_size if s == "clean" else per_source for s in sources}
    unique_needed = {s: -(-n // DUPLICATE_COPIES) if s == "duplicates" else n
                     for s, n in size.items()}  # fmt: skip
    needed = sum(unique_needed.values()) + val_size
    if needed > len(train.labels) or test_size > len(test.labels):
        raise ValueError(
            f"asked for {needed} training and {test_size} test images; Fashion-MNIST "
            f"has {len(train.labels)} and {len(test.labels)}"
        )
    order = rng.permutation(len(train.labels))
    images = torch.from_numpy(train.images.astype(np.float32) / 255.0)
    images = torch.nn.functional.avg_pool2d(images[:, None], downsample)
    first_rows = order[: size[sources[0]]]  # the first source's pixels set the scale
    mean, std = images[first_rows].mean(), images[first_rows].std()
    images = (images - mean) / std
    inputs, targets, ids, cursor = [], [], [], 0
    for j, name in enumerate(sources):
        rows = order[cursor : cursor + unique_needed[name]]
        cursor += unique_needed[name]
        x, y = images[rows], train.labels[rows].astype(np.int64)
        if name.startswith("label-noise-"):
            y = _noisy_labels(y, int(name.rsplit("-", 1)[1]) / 100, rng)
        elif name == "duplicates":
            x, y = (
                x.repeat(DUPLICATE_COPIES, 1, 1, 1)[:per_source],
                np.tile(y, DUPLICATE_COPIES)[:per_source],
            )
        elif name == "corrupted":
            noise = torch.from_numpy(rng.standard_normal(x.shape).astype(np.float32))
            x = x + CORRUPTION_STD * noise
        inputs.append(x)
        targets.append(torch.from_numpy(y))
        ids.append(torch.full((len(y),), j))
    val_rows = order[cursor : cursor + val_size]
    test_rows = rng.permutation(len(test.labels))[:test_size]
    test_images = torch.from_numpy(test.images[test_rows].astype(np.float32) / 255.0)
    test_images = (torch.nn.functional.avg_pool2d(test_images[:, None], downsample) - mean) / std
    side = 28 // downsample
    return SelectionTask(
        inputs=torch.cat(inputs),
        targets=torch.cat(targets),
        sources=torch.cat(ids),
        source_names=tuple(sources),
        val_inputs=images[val_rows],
        val_targets=torch.from_numpy(train.labels[val_rows].astype(np.int64)),
        test_inputs=test_images,
        test_targets=torch.from_numpy(test.labels[test_rows].astype(np.int64)),
        model_fn=lambda seed: small_cnn(seed, side=side),
        loss_fn=classification_loss,
        metric="accuracy",
    )


def _windows(texts: list[str], count: int, length: int, rng) -> np.ndarray:
    """``count`` distinct byte windows ``(count, length)`` of the texts joined by newlines."""
    data = np.frombuffer("\n".join(texts).encode("utf-8"), dtype=np.uint8)
    available = len(data) // length
    if available < count:
        raise ValueError(f"the texts hold {available} windows of {length} bytes, {count} needed")
    starts = rng.choice(available, count, replace=False) * length
    return np.stack([data[s : s + length] for s in starts]).astype(np.int64)


def mixed_text(
    per_source: int = 400,
    val_size: int = 400,
    test_size: int = 400,
    *,
    context: int = 32,
    sources: tuple[str, ...] = TEXT_SOURCES,
    clean_size: int | None = None,
    seed: int = 0,
    sharegpt_conversations: int = 3000,
) -> SelectionTask:
    """Byte windows of ``context + 1`` bytes (inputs ``(N, context)``, targets the next bytes),
    ``per_source`` per source and ``clean_size`` clean fortunes (default ``per_source // 5``, the
    scarce premium source, as for the images); the model is :func:`cads.models.byte_lm`
    (width 32, 3 causal conv layers)."""
    from benchdata import fortunes_corpus
    from benchdata import sharegpt_conversations as load_sharegpt

    clean_size = max(1, per_source // 5) if clean_size is None else clean_size
    _check_sizes(per_source=per_source, val_size=val_size, test_size=test_size, context=context,
                 clean_size=clean_size)  # fmt: skip
    unknown = [s for s in sources if s not in TEXT_SOURCES]
    if unknown or not sources:
        raise ValueError(f"unknown text source(s) {unknown}; known: {TEXT_SOURCES}")
    rng = np.random.default_rng(seed)
    corpus = fortunes_corpus()
    length = context + 1
    fortunes = _windows(corpus.train, clean_size + per_source * len(sources), length, rng)
    held_out = _windows(corpus.validation, val_size + test_size, length, rng)
    conversations = load_sharegpt(sharegpt_conversations)
    by_role = {
        role: [t["text"] for c in conversations for t in c if t["role"] == role]
        for role in ("assistant", "user")
    }
    windows, ids, cursor = [], [], 0
    for j, name in enumerate(sources):
        count = clean_size if name == "fortunes" else per_source
        own, cursor = fortunes[cursor : cursor + count], cursor + count
        if name.startswith("sharegpt-"):
            own = _windows(by_role[name.split("-")[1]], per_source, length, rng)
        elif name == "fortunes-corrupted":
            replace = rng.random(own.shape) < BYTE_CORRUPTION
            own = np.where(replace, rng.integers(32, 127, own.shape), own)
        elif name == "fortunes-duplicates":
            unique = own[: -(-per_source // DUPLICATE_COPIES)]
            own = np.tile(unique, (DUPLICATE_COPIES, 1))[:per_source]
        windows.append(torch.from_numpy(own))
        ids.append(torch.full((len(own),), j))
    pool, held = torch.cat(windows), torch.from_numpy(held_out)
    return SelectionTask(
        inputs=pool[:, :-1],
        targets=pool[:, 1:],
        sources=torch.cat(ids),
        source_names=tuple(sources),
        val_inputs=held[:val_size, :-1],
        val_targets=held[:val_size, 1:],
        test_inputs=held[val_size:, :-1],
        test_targets=held[val_size:, 1:],
        model_fn=lambda seed: byte_lm(seed, width=32, layers=3),
        loss_fn=token_loss,
        metric="loss",
    )


def toy_task(
    per_source: int = 64, *, dim: int = 8, classes: int = 3, seed: int = 0
) -> SelectionTask:
    """A seconds-fast synthetic task for examples and tests: Gaussian class clusters in ``dim``
    dimensions, a clean source and a source with every label replaced at random, a linear
    classifier. Validation and test data are clean."""
    _check_sizes(per_source=per_source, dim=dim, classes=classes)
    generator = torch.Generator().manual_seed(seed)
    centres = 2.0 * torch.randn(classes, dim, generator=generator)

    def draw(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, classes, (count,), generator=generator)
        return centres[labels] + torch.randn(count, dim, generator=generator), labels

    (x_clean, y_clean), (x_noisy, _) = draw(per_source), draw(per_source)
    y_noisy = torch.randint(0, classes, (per_source,), generator=generator)
    (x_val, y_val), (x_test, y_test) = draw(4 * per_source), draw(4 * per_source)

    def model_fn(seed: int) -> torch.nn.Module:
        return _seeded(seed, lambda: torch.nn.Linear(dim, classes))

    return SelectionTask(
        inputs=torch.cat([x_clean, x_noisy]),
        targets=torch.cat([y_clean, y_noisy]),
        sources=torch.cat([torch.zeros(per_source), torch.ones(per_source)]).long(),
        source_names=("clean", "random-labels"),
        val_inputs=x_val,
        val_targets=y_val,
        test_inputs=x_test,
        test_targets=y_test,
        model_fn=model_fn,
    )
