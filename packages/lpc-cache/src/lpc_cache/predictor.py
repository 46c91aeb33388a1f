"""The paper's conversation-continuation predictor: P(another user turn follows).

Features of a request (``features="combined"``, the paper's): one embedding of the text made of
its user prompt and the previous ``history`` (4) user prompts of the conversation, oldest first,
a ``word_budget`` (512 words) split evenly across them (a longer prompt keeps its first and last
words), joined by ``"\nThe next user query is: "``; then the turn count (``log(1 + turns)`` or,
as in the authors' code, the raw 0-based turn index). ``features="stacked"`` instead
concatenates one embedding per prompt (zeros where the conversation is shorter).

Two networks (``network``):

* ``"mlp"``, the paper's description: a 3-layer MLP (``hidden`` = 128 units, ReLU) giving one
  logit; class-weighted BCE (positives weighted by ``negatives / positives``), Adam, at most
  ``epochs`` (20) epochs, early stop after ``patience`` epochs without a better validation loss.
* ``"authors"``, the authors' training script (``PredictorConfig.authors()``): Linear -> BatchNorm
  -> ReLU -> Dropout(0.3), twice, then two logits and a softmax; unweighted cross-entropy, Adam
  at 5e-5, batch 256, 20 epochs, the raw turn index.

Both keep the weights of the best validation loss. Saved as ``model.safetensors`` +
``config.json``.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from kernels_common.cli import atomic_file, read_json, read_safetensors
from lpc_cache.encoders import TextEncoder
from lpc_cache.trace import Trace

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PredictorConfig:
    """Predictor architecture and training (defaults: the paper's).

    Attributes:
        embedding_dim: the text encoder's output size (384 for MiniLM).
        history: previous user prompts in the features.
        features: ``"combined"`` (the paper's: one embedding of the prompts joined into one
            text) or ``"stacked"`` (one embedding per prompt, concatenated).
        word_budget: words of the combined text, split evenly across its prompts.
        hidden: units of the two hidden layers.
        epochs: maximum training epochs.
        batch_size: examples per Adam step.
        lr: Adam learning rate.
        patience: stop after this many epochs without a better validation loss.
        seed: initialisation and shuffling seed.
        network: ``"mlp"`` (the paper's description) or ``"authors"`` (BatchNorm, dropout, two
            logits: the authors' code).
        dropout: dropout after each hidden layer of the ``"authors"`` network.
        class_weighted: weight the loss by the inverse class frequencies.
        turn_feature: ``"log1p"`` (``log(1 + turns)``) or ``"raw"`` (the 0-based turn index,
            the authors' feature).
        max_train_turn: train only on turns up to this 0-based index (the authors' code: 20),
            or None for all; see :func:`train_rows`.
        encoder: name of the text encoder the features come from (``"e5"``, ``"minilm"``;
            see :func:`~lpc_cache.encoders.make_encoder`), recorded so a saved predictor is
            applied with the encoder it was trained with.
    """

    embedding_dim: int = 384
    history: int = 4
    features: str = "combined"
    word_budget: int = 512
    hidden: int = 128
    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3
    patience: int = 5
    seed: int = 0
    network: str = "mlp"
    dropout: float = 0.3
    class_weighted: bool = True
    turn_feature: str = "log1p"
    max_train_turn: int | None = None
    encoder: str = "e5"

    @classmethod
    def authors(cls, **overrides) -> PredictorConfig:
        """The authors' training script: BatchNorm + dropout 0.3 network with two logits,
        unweighted cross-entropy, Adam 5e-5, batch 256, 20 epochs (no early stop), raw turn
        index, trained on turns 0-20 only; ``overrides`` set any other field (e.g.
        ``embedding_dim``)."""
        settings = {
            "network": "authors",
            "class_weighted": False,
            "turn_feature": "raw",
            "lr": 5e-5,
            "batch_size": 256,
            "epochs": 20,
            "max_train_turn": 20,
        }
        settings.update(overrides)
        settings.setdefault("patience", settings["epochs"])  # every epoch runs
        return cls(**settings)

    def __post_init__(self) -> None:
        if self.features not in FEATURES:
            raise ValueError(f"features must be one of {FEATURES}, got {self.features!r}")
        if self.network not in NETWORKS:
            raise ValueError(f"network must be one of {NETWORKS}, got {self.network!r}")
        if self.turn_feature not in TURN_FEATURES:
            raise ValueError(
                f"turn_feature must be one of {TURN_FEATURES}, got {self.turn_feature!r}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.max_train_turn is not None and self.max_train_turn < 0:
            raise ValueError(f"max_train_turn must be None or >= 0, got {self.max_train_turn}")
        for name in ("embedding_dim", "hidden", "epochs", "batch_size", "patience", "word_budget"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.history < 0:
            raise ValueError(f"history must be >= 0, got {self.history}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")

    @property
    def input_dim(self) -> int:
        slots = 1 if self.features == "combined" else self.history + 1
        return self.embedding_dim * slots + 1


FEATURES = ("combined", "stacked")
NETWORKS = ("mlp", "authors")
TURN_FEATURES = ("log1p", "raw")
SEPARATOR = "\nThe next user query is: "


def combined_text(prompts: list[str], word_budget: int = 512) -> str:
    """The paper's predictor input: ``prompts`` (oldest first) with ``word_budget`` words split
    evenly among them; a longer prompt keeps its first half and last half of its share around
    ``"..."``; joined by :data:`SEPARATOR`."""
    if not prompts:
        return ""
    share = max(word_budget // len(prompts), 1)
    parts = []
    for prompt in prompts:
        words = prompt.split()
        if len(words) > share:
            head = share // 2
            words = [*words[:head], "...", *words[len(words) - (share - head) :]]
        parts.append(" ".join(words))
    return SEPARATOR.join(parts)


def trace_features(
    trace: Trace, encoder: TextEncoder, config: PredictorConfig | None = None
) -> tuple:
    """Features and labels of every request of ``trace``, in trace order.

    Args:
        config: ``history``, ``features`` and ``word_budget`` (default: the paper's).

    Returns:
        ``(x, y)``: float32 ``(N, config.input_dim)`` (with the encoder's dimension) and float32
        ``(N,)`` (1 = the conversation continues).
    """
    config = config if config is not None else PredictorConfig()
    history = config.history
    missing = [i for i, r in enumerate(trace.requests) if r.user_text is None]
    if missing:
        raise ValueError(f"the predictor needs user_text; request {missing[0]} has none")
    by_conversation: dict[str, dict[int, str]] = defaultdict(dict)
    for r in trace.requests:
        by_conversation[r.conversation_id][r.turn] = r.user_text

    def window(r) -> list:  # the current prompt first, then older ones (None where absent)
        turns = by_conversation[r.conversation_id]
        return [turns.get(r.turn - slot) for slot in range(history + 1)]

    if config.features == "combined":
        keys = [
            combined_text([t for t in reversed(window(r)) if t is not None], config.word_budget)
            for r in trace.requests
        ]
    else:
        keys = [r.user_text for r in trace.requests]
    texts = list(dict.fromkeys(keys))
    row = {t: i for i, t in enumerate(texts)}
    table = encoder.encode(texts)
    if table.ndim != 2 or table.shape[0] != len(texts):
        raise ValueError(f"encoder returned shape {table.shape} for {len(texts)} texts")
    dim = table.shape[1]
    slots = 1 if config.features == "combined" else history + 1
    x = np.zeros((len(trace), dim * slots + 1), dtype=np.float32)
    for i, r in enumerate(trace.requests):
        if config.features == "combined":
            x[i, :dim] = table[row[keys[i]]]
        else:
            for slot, text in enumerate(window(r)):
                if text is not None:
                    x[i, slot * dim : (slot + 1) * dim] = table[row[text]]
        x[i, -1] = r.turn if config.turn_feature == "raw" else math.log1p(r.turn + 1)
    y = np.array([0.0 if r.last_turn else 1.0 for r in trace.requests], dtype=np.float32)
    return x, y


def train_rows(trace: Trace, config: PredictorConfig) -> np.ndarray:
    """Boolean mask of the requests of ``trace`` (trace order) a predictor trains on: those
    with a turn index up to ``config.max_train_turn`` (all when it is None)."""
    turns = np.array([r.turn for r in trace.requests], dtype=np.int64)
    if config.max_train_turn is None:
        return np.ones(len(turns), dtype=bool)
    return turns <= config.max_train_turn


def continuation_mlp(config: PredictorConfig) -> nn.Sequential:
    """The network: ``(B, input_dim) -> (B, 1)`` logits (``"mlp"``: the 3-layer MLP) or
    ``(B, 2)`` (``"authors"``: Linear, BatchNorm, ReLU, Dropout twice, then two logits)."""
    h = config.hidden
    if config.network == "authors":
        return nn.Sequential(
            nn.Linear(config.input_dim, h),
            nn.BatchNorm1d(h),
            nn.ReLU(),
            nn.Dropout(config.dropout),
            nn.Linear(h, h),
            nn.BatchNorm1d(h),
            nn.ReLU(),
            nn.Dropout(config.dropout),
            nn.Linear(h, 2),
        )
    return nn.Sequential(
        nn.Linear(config.input_dim, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1)
    )


def _check_xy(x: np.ndarray, y: np.ndarray | None, dim: int, what: str) -> None:
    if x.ndim != 2 or x.shape[1] != dim:
        raise ValueError(f"{what} features must have shape (N, {dim}), got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what} features contain NaN or inf")
    if y is not None and (y.shape != (len(x),) or not np.all((y == 0) | (y == 1))):
        raise ValueError(f"{what} labels must be 0/1 of shape ({len(x)},)")


class ContinuationPredictor:
    """Train, apply, save and load the continuation MLP.

    Example:
        >>> import numpy as np
        >>> config = PredictorConfig(embedding_dim=4, history=0, epochs=3)
        >>> rng = np.random.default_rng(0)
        >>> x = rng.normal(size=(200, config.input_dim)).astype(np.float32)
        >>> y = (x[:, 0] > 0).astype(np.float32)
        >>> predictor = ContinuationPredictor(config)
        >>> _ = predictor.fit(x[:150], y[:150], x[150:], y[150:])
        >>> predictor.predict_proba(x[150:]).shape
        (50,)
    """

    def __init__(self, config: PredictorConfig = PredictorConfig()) -> None:
        self.config = config
        with torch.random.fork_rng(devices=[]):  # seeded weights, the caller's RNG untouched
            torch.manual_seed(config.seed)
            self.model = continuation_mlp(config)

    def _loss(self, x: torch.Tensor, y: torch.Tensor, positives: float) -> torch.Tensor:
        """BCE (one logit) or cross-entropy (two), weighted by the inverse class frequencies of
        the training labels (``positives``: their share) when ``class_weighted``."""
        logits = self.model(x)
        weighted = self.config.class_weighted
        if logits.shape[-1] == 2:  # the authors': weights total/negatives and total/positives
            weight = torch.tensor([1 / (1 - positives), 1 / positives]) if weighted else None
            return nn.functional.cross_entropy(logits, y.long(), weight=weight)
        pos_weight = torch.tensor((1 - positives) / positives) if weighted else None
        return nn.functional.binary_cross_entropy_with_logits(
            logits.squeeze(-1), y, pos_weight=pos_weight
        )

    def fit(
        self, x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray
    ) -> dict:
        """Train with the configured loss (BCE or two-logit cross-entropy, class-weighted or
        not) and keep the best-validation weights. Shuffling and dropout are seeded by
        ``config.seed`` (the caller's random state is left alone), so a fit is repeatable.

        Runs on one thread (restored afterwards): for a 128-unit MLP on small batches,
        intra-op threading only adds synchronisation.

        Returns:
            ``{"train_loss": [...], "val_loss": [...], "best_epoch": int}`` (val_loss[0] is the
            untrained model's).
        """
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.random.fork_rng(devices=[]):  # dropout draws from the global generator
                torch.manual_seed(self.config.seed)
                return self._fit(x_train, y_train, x_val, y_val)
        finally:
            torch.set_num_threads(threads)

    def _fit(self, x_train, y_train, x_val, y_val) -> dict:
        cfg = self.config
        for x, y, what in ((x_train, y_train, "train"), (x_val, y_val, "validation")):
            _check_xy(x, y, cfg.input_dim, what)
            if len(x) == 0:
                raise ValueError(f"the {what} set is empty")
        positives = float(y_train.sum())
        if positives in (0.0, float(len(y_train))):
            raise ValueError("the training labels must contain both classes")
        share = positives / len(y_train)
        xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
        xv, yv = torch.from_numpy(x_val), torch.from_numpy(y_val)
        optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        generator = torch.Generator().manual_seed(cfg.seed)
        self.model.eval()  # BatchNorm and dropout as at inference, from the first evaluation
        with torch.no_grad():
            best = self._loss(xv, yv, share).item()
        history = {"train_loss": [], "val_loss": [best], "best_epoch": 0}
        best_state, waited = copy.deepcopy(self.model.state_dict()), 0
        for epoch in range(1, cfg.epochs + 1):
            self.model.train()
            order = torch.randperm(len(xt), generator=generator)
            total = 0.0
            for start in range(0, len(xt), cfg.batch_size):
                idx = order[start : start + cfg.batch_size]
                if len(idx) == 1 and cfg.network == "authors":
                    continue  # BatchNorm cannot train on one example
                loss = self._loss(xt[idx], yt[idx], share)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += loss.item() * len(idx)
            self.model.eval()
            with torch.no_grad():
                val = self._loss(xv, yv, share).item()
            history["train_loss"].append(total / len(xt))
            history["val_loss"].append(val)
            logger.info("epoch %d: train %.4f, validation %.4f", epoch, total / len(xt), val)
            if val < best:
                best, waited, history["best_epoch"] = val, 0, epoch
                best_state = copy.deepcopy(self.model.state_dict())
            else:
                waited += 1
                if waited >= cfg.patience:
                    break
        self.model.load_state_dict(best_state)
        self.model.eval()
        return history

    @torch.no_grad()
    def predict_proba(self, x: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        """P(continue) of float32 ``(N, input_dim)`` features -> float64 ``(N,)``."""
        _check_xy(x, None, self.config.input_dim, "input")
        self.model.eval()
        out = []
        for i in range(0, len(x), batch_size):
            logits = self.model(torch.from_numpy(x[i : i + batch_size]))
            if logits.shape[-1] == 2:  # p(continue) = softmax(logits)[:, 1]
                out.append(torch.softmax(logits, dim=-1)[:, 1])
            else:
                out.append(torch.sigmoid(logits.squeeze(-1)))
        return torch.cat(out).double().numpy() if out else np.zeros(0)

    def predict_trace(self, trace: Trace, encoder: TextEncoder) -> np.ndarray:
        """P(continue) for every request of ``trace`` (trace order): LPC's probabilities."""
        x, _ = trace_features(trace, encoder, self.config)
        return self.predict_proba(x)

    def save(self, directory: str | Path) -> Path:
        """Write ``model.safetensors`` and ``config.json`` into ``directory``. Both are written
        under temporary names first, so a failed save leaves no partial file."""
        from safetensors.torch import save_file

        directory = Path(directory)
        config = json.dumps(asdict(self.config), indent=2) + "\n"
        with (
            atomic_file(directory / "model.safetensors") as weights,
            atomic_file(directory / "config.json") as settings,
        ):
            save_file(self.model.state_dict(), weights)
            settings.write_text(config)
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> ContinuationPredictor:
        """Read a predictor saved by :meth:`save`; a missing, truncated or foreign
        ``config.json`` or ``model.safetensors`` raises an error that names the file."""

        directory = Path(directory)
        if not directory.is_dir():
            raise FileNotFoundError(f"no predictor folder at {directory}")
        for name in ("config.json", "model.safetensors"):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"no predictor {name} in {directory}")
        config_path, weights_path = directory / "config.json", directory / "model.safetensors"
        fields = read_json(config_path, "predictor config")
        if not isinstance(fields, dict):
            raise ValueError(f"{config_path}: expected a JSON object of PredictorConfig fields")
        # a config saved before the encoder was recorded: MiniLM, the only one there was
        fields.setdefault("encoder", "minilm")
        try:
            config = PredictorConfig(**fields)
        except TypeError as error:  # an unknown or missing field
            raise ValueError(f"{config_path} is not a predictor config ({error})") from None
        except ValueError as error:
            raise ValueError(f"{config_path}: {error}") from None
        state = read_safetensors(weights_path, "predictor weights file")
        predictor = cls(config)
        try:
            predictor.model.load_state_dict(state)
        except RuntimeError as error:  # missing, unexpected or mis-shaped tensors
            first = str(error).strip().splitlines()
            detail = " ".join(line.strip() for line in first[1:3]) or first[0]
            raise ValueError(f"{weights_path} does not match {config_path} ({detail})") from None
        predictor.model.eval()
        return predictor


def mcc(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Matthews correlation coefficient of 0/1 labels and predictions (0 when undefined)."""
    y_true, y_pred = np.asarray(y_true).astype(bool), np.asarray(y_pred).astype(bool)
    tp = float(np.sum(y_true & y_pred))
    tn = float(np.sum(~y_true & ~y_pred))
    fp = float(np.sum(~y_true & y_pred))
    fn = float(np.sum(y_true & ~y_pred))
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


def mcc_threshold(y_true: np.ndarray, scores: np.ndarray) -> float:
    """The threshold ``t`` maximising ``mcc(y_true, scores > t)`` (the authors' accuracy script
    picks it on one half of the data and reports the other). Every cut between distinct scores
    is tried, and predicting no positive at all; of equally good cuts the highest ``t`` (the
    fewest positives) is returned."""
    y = np.asarray(y_true).astype(bool)
    s = np.asarray(scores, dtype=float)
    if y.shape != s.shape or y.ndim != 1 or len(s) == 0:
        raise ValueError(f"labels {y.shape} and scores {s.shape} must be equal, non-empty 1-D")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores contain NaN or inf")
    order = np.argsort(-s, kind="mergesort")
    sorted_scores, sorted_y = s[order], y[order]
    # predicting positive for the top k: k = 0, or k at the end of a group of equal scores
    ends = np.r_[0, np.nonzero(np.diff(sorted_scores))[0] + 1, len(s)]
    tp = np.r_[0, np.cumsum(sorted_y)][ends].astype(float)
    fp = ends - tp
    pos, neg = float(y.sum()), float((~y).sum())
    fn, tn = pos - tp, neg - fp
    denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(denominator > 0, (tp * tn - fp * fn) / denominator, 0.0)
    k = ends[int(np.argmax(values))]  # the first maximum: the fewest positives
    # scores > t selects exactly the first k: t is the score of item k (or below all of them)
    if k == 0:
        return float(sorted_scores[0])
    if k < len(s):
        return float(sorted_scores[k])
    return float(np.nextafter(sorted_scores[-1], -np.inf))


def roc_auc(y_true: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties counted half)."""
    y_true = np.asarray(y_true).astype(bool)
    scores = np.asarray(scores, dtype=float)
    n_pos, n_neg = int(y_true.sum()), int((~y_true).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both classes")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y_true].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def split_conversations(
    conversation_ids: list[str], fractions: tuple[float, ...], seed: int = 0
) -> list[list[str]]:
    """Shuffle conversation ids (seeded) and cut them into groups of the given fractions (the
    last group takes the rest)."""
    if any(f < 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
        raise ValueError(f"fractions must be >= 0 and sum to at most 1, got {fractions}")
    ids = list(conversation_ids)
    np.random.default_rng(seed).shuffle(ids)
    groups, start = [], 0
    for fraction in fractions[:-1]:
        end = start + round(fraction * len(ids))
        groups.append(ids[start:end])
        start = end
    groups.append(ids[start:])
    return groups
