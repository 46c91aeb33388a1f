"""The continuation predictor: learning on labelled synthetic data, metrics against
scikit-learn, features from a trace, save/load."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import matthews_corrcoef, roc_auc_score

from lpc_cache import (
    ContinuationPredictor,
    HashingEncoder,
    PredictorConfig,
    Request,
    Trace,
    combined_text,
    mcc,
    mcc_threshold,
    roc_auc,
    split_conversations,
    trace_features,
    train_rows,
)


def synthetic(n: int, config: PredictorConfig, seed: int):
    """Labels from a noisy nonlinear rule of the features (about 25% label noise)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, config.input_dim)).astype(np.float32)
    score = x[:, 0] * x[:, 1] + x[:, 2] - 0.5 * x[:, -1] + rng.normal(scale=0.7, size=n)
    return x, (score > 0.3).astype(np.float32)


def test_training_reduces_validation_loss_and_beats_chance():
    config = PredictorConfig(embedding_dim=8, history=1, epochs=20, seed=0)
    x_train, y_train = synthetic(3000, config, 0)
    x_val, y_val = synthetic(600, config, 1)
    x_test, y_test = synthetic(1000, config, 2)
    predictor = ContinuationPredictor(config)
    history = predictor.fit(x_train, y_train, x_val, y_val)
    best = min(history["val_loss"])
    # the class-weighted BCE of a constant predictor is about ln 2 = 0.69; a learnable rule
    # with 25% label noise leaves clearly less
    assert history["val_loss"][0] > 0.6
    assert best < 0.8 * history["val_loss"][0]
    assert history["val_loss"][history["best_epoch"]] == best
    p = predictor.predict_proba(x_test)
    assert mcc(y_test, p > 0.5) > 0.4
    assert roc_auc(y_test, p) > 0.8


def test_metrics_match_scikit_learn():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=500)
    scores = np.round(rng.uniform(size=500) + 0.3 * y, 2)  # rounded: many ties
    assert roc_auc(y, scores) == pytest.approx(roc_auc_score(y, scores), abs=1e-12)
    pred = scores > 0.6
    assert mcc(y, pred) == pytest.approx(matthews_corrcoef(y, pred), abs=1e-12)
    assert mcc(y, np.ones_like(y)) == 0.0  # undefined -> 0, as scikit-learn


def test_save_load_round_trip(tmp_path):
    config = PredictorConfig(embedding_dim=4, history=0, epochs=2)
    x, y = synthetic(200, config, 0)
    predictor = ContinuationPredictor(config)
    predictor.fit(x[:150], y[:150], x[150:], y[150:])
    predictor.save(tmp_path / "p")
    loaded = ContinuationPredictor.load(tmp_path / "p")
    assert loaded.config == config
    np.testing.assert_array_equal(loaded.predict_proba(x), predictor.predict_proba(x))
    with pytest.raises(FileNotFoundError):
        ContinuationPredictor.load(tmp_path / "missing")


def test_trace_features_stack_history_and_turn_count():
    encoder = HashingEncoder(dim=16)
    texts = ["alpha beta", "gamma", "delta delta", "other conversation"]
    prompt = np.arange(4, dtype=np.int32)
    requests = [
        Request(0.0, "a", 0, prompt, 1, False, texts[0]),
        Request(1.0, "b", 0, prompt, 1, True, texts[3]),
        Request(2.0, "a", 1, prompt, 1, False, texts[1]),
        Request(3.0, "a", 2, prompt, 1, True, texts[2]),
    ]
    config = PredictorConfig(embedding_dim=16, history=2, features="stacked")
    x, y = trace_features(Trace(requests), encoder, config)
    emb = encoder.encode(texts)
    assert x.shape == (4, 16 * 3 + 1)
    np.testing.assert_array_equal(y, [1, 0, 1, 0])
    np.testing.assert_allclose(x[3, :16], emb[2])  # current prompt
    np.testing.assert_allclose(x[3, 16:32], emb[1])  # previous
    np.testing.assert_allclose(x[3, 32:48], emb[0])  # two back
    np.testing.assert_allclose(x[2, 32:48], 0.0)  # a's turn 1 has only one previous prompt
    np.testing.assert_allclose(x[:, -1], np.log1p([1, 1, 2, 3]))
    with pytest.raises(ValueError, match="user_text"):
        trace_features(Trace([Request(0.0, "a", 0, prompt, 1, True)]), encoder, config)

    # the paper's combined text: one embedding of the window's prompts, oldest first
    combined = PredictorConfig(embedding_dim=16, history=1)
    x, _ = trace_features(Trace(requests), encoder, combined)
    assert x.shape == (4, 16 + 1) == (4, combined.input_dim)
    sep = "\nThe next user query is: "
    windows = [texts[0], texts[3], texts[0] + sep + texts[1], texts[1] + sep + texts[2]]
    np.testing.assert_allclose(x[:, :16], encoder.encode(windows))
    np.testing.assert_allclose(x[:, -1], np.log1p([1, 1, 2, 3]))


def test_combined_text_splits_the_word_budget():
    """Budget 8 over 2 prompts: 4 words each; a longer prompt keeps 2 first and 2 last words."""
    long = "w1 w2 w3 w4 w5 w6 w7"
    assert combined_text(["a b", long], 8) == "a b\nThe next user query is: w1 w2 ... w6 w7"
    assert combined_text([long], 3) == "w1 ... w6 w7"
    assert combined_text([], 8) == ""
    with pytest.raises(ValueError, match="features"):
        PredictorConfig(features="mean")


def test_bad_inputs():
    with pytest.raises(ValueError, match="hidden"):
        PredictorConfig(hidden=0)
    predictor = ContinuationPredictor(PredictorConfig(embedding_dim=4, history=0))
    x = np.zeros((10, 5), dtype=np.float32)
    with pytest.raises(ValueError, match="shape"):
        predictor.predict_proba(np.zeros((10, 7), dtype=np.float32))
    with pytest.raises(ValueError, match="both classes"):
        predictor.fit(x, np.ones(10, dtype=np.float32), x, np.ones(10, dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        predictor.predict_proba(np.full((2, 5), np.nan, dtype=np.float32))


def test_split_conversations_is_a_seeded_partition():
    ids = [f"c{i}" for i in range(101)]
    a, b, c = split_conversations(ids, (0.4, 0.1, 0.5), seed=3)
    assert sorted(a + b + c) == sorted(ids)
    assert (len(a), len(b)) == (40, 10)
    assert split_conversations(ids, (0.4, 0.1, 0.5), seed=3)[0] == a


def test_construction_is_seeded_and_leaves_the_global_rng_alone():
    config = PredictorConfig(embedding_dim=4, history=0, seed=3)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = ContinuationPredictor(config)
    assert torch.equal(torch.rand(3), expected)
    b = ContinuationPredictor(config)
    for wa, wb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(wa, wb)


def test_authors_network_matches_their_description():
    """Linear -> BatchNorm -> ReLU -> Dropout(0.3), twice, two logits; softmax[:, 1] is
    p(continue); unweighted cross-entropy; Adam 5e-5, batch 256, 20 epochs, raw turn index."""
    config = PredictorConfig.authors(embedding_dim=8, history=0)
    assert (config.lr, config.batch_size, config.epochs) == (5e-5, 256, 20)
    assert (config.class_weighted, config.turn_feature, config.dropout) == (False, "raw", 0.3)
    predictor = ContinuationPredictor(config)
    kinds = [type(m).__name__ for m in predictor.model]
    assert kinds == ["Linear", "BatchNorm1d", "ReLU", "Dropout"] * 2 + ["Linear"]
    assert predictor.model[-1].out_features == 2
    x, y = synthetic(300, config, 0)
    predictor.fit(x[:250], y[:250], x[250:], y[250:])
    with torch.no_grad():
        logits = predictor.model.eval()(torch.from_numpy(x[250:]))
    expected = torch.softmax(logits, dim=-1)[:, 1].double().numpy()
    np.testing.assert_allclose(predictor.predict_proba(x[250:]), expected, rtol=1e-6)
    # unweighted: the loss is plain cross-entropy of the two logits
    target = torch.from_numpy(y[250:]).long()
    plain = torch.nn.functional.cross_entropy(logits, target).item()
    assert predictor._loss(torch.from_numpy(x[250:]), torch.from_numpy(y[250:]), 0.3).item() == (
        pytest.approx(plain, rel=1e-6)
    )
    with pytest.raises(ValueError, match="network"):
        PredictorConfig(network="resnet")
    with pytest.raises(ValueError, match="turn_feature"):
        PredictorConfig(turn_feature="sqrt")


def test_class_weights_are_inverse_frequencies():
    """Weighted BCE (one logit) and weighted cross-entropy (two) against a hand computation."""
    logits = torch.tensor([[0.3], [-1.2], [2.0]])
    y = torch.tensor([1.0, 0.0, 0.0])
    share = 0.25  # positives in the training labels
    config = PredictorConfig(embedding_dim=2, history=0)
    predictor = ContinuationPredictor(config)
    predictor.model = lambda x: logits  # the loss of given logits
    p = torch.sigmoid(logits.squeeze(-1))
    hand = -(3.0 * torch.log(p[0]) + torch.log(1 - p[1]) + torch.log(1 - p[2])) / 3
    assert predictor._loss(torch.zeros(3, 3), y, share).item() == pytest.approx(hand.item())
    two = torch.tensor([[0.1, 0.4], [0.5, -0.7], [1.0, 3.0]])
    authors = ContinuationPredictor(
        PredictorConfig.authors(embedding_dim=2, history=0, class_weighted=True)
    )
    authors.model = lambda x: two
    logp = torch.log_softmax(two, dim=-1)
    w = torch.tensor([1 / 0.75, 1 / 0.25])  # total/negatives, total/positives
    hand = -(w[1] * logp[0, 1] + w[0] * logp[1, 0] + w[0] * logp[2, 0]) / (w[1] + 2 * w[0])
    assert authors._loss(torch.zeros(3, 3), y, share).item() == pytest.approx(hand.item())


def test_raw_turn_feature():
    encoder = HashingEncoder(dim=4)
    prompt = np.arange(4, dtype=np.int32)
    requests = [Request(float(t), "a", t, prompt, 1, t == 2, f"q{t}") for t in range(3)]
    x, _ = trace_features(
        Trace(requests), encoder, PredictorConfig(embedding_dim=4, turn_feature="raw")
    )
    np.testing.assert_array_equal(x[:, -1], [0, 1, 2])


def test_authors_fit_is_repeatable_and_trains_on_turns_up_to_20(tmp_path):
    config = PredictorConfig.authors(embedding_dim=8, history=0, epochs=3)
    assert config.patience == 3  # every epoch runs
    x, y = synthetic(400, config, 0)
    a, b = ContinuationPredictor(config), ContinuationPredictor(config)
    torch.manual_seed(1)
    a.fit(x[:300], y[:300], x[300:], y[300:])
    torch.manual_seed(2)  # the caller's random state does not matter
    b.fit(x[:300], y[:300], x[300:], y[300:])
    np.testing.assert_array_equal(a.predict_proba(x), b.predict_proba(x))
    prompt = np.arange(4, dtype=np.int32)
    requests = [Request(float(t), "a", t, prompt, 1, t == 24, "q") for t in range(25)]
    assert train_rows(Trace(requests), config).tolist() == [True] * 21 + [False] * 4
    assert train_rows(Trace(requests), PredictorConfig()).all()


def test_a_config_saved_without_its_encoder_is_minilm(tmp_path):
    config = PredictorConfig(embedding_dim=4, history=0, epochs=1)
    predictor = ContinuationPredictor(config)
    predictor.save(tmp_path / "p")
    stored = json.loads((tmp_path / "p" / "config.json").read_text())
    del stored["encoder"]  # as the package wrote it before it recorded the encoder
    (tmp_path / "p" / "config.json").write_text(json.dumps(stored))
    assert ContinuationPredictor.load(tmp_path / "p").config.encoder == "minilm"


def test_mcc_threshold_ties_and_no_positive():
    # two cuts give MCC 1/3: after the top score and after the top three; the higher wins
    y = np.array([1, 0, 1, 0, 0, 1])
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    best = max(mcc(y, scores > c) for c in [-np.inf, *scores])
    t = mcc_threshold(y, scores)
    assert mcc(y, scores > t) == pytest.approx(best)
    assert t == max(c for c in scores if mcc(y, scores > c) == pytest.approx(best))
    # anti-correlated scores: predicting no positive (MCC 0) beats every cut
    y = np.array([0, 0, 1, 1])
    t = mcc_threshold(y, np.array([0.9, 0.8, 0.2, 0.1]))
    assert not np.any(np.array([0.9, 0.8, 0.2, 0.1]) > t)
    with pytest.raises(ValueError, match="equal"):
        mcc_threshold(np.array([0, 1]), np.array([0.2, 0.3, 0.4]))


def test_mcc_threshold_is_the_brute_force_best():
    rng = np.random.default_rng(1)
    for trial in range(20):
        y = rng.integers(0, 2, size=60)
        scores = np.round(rng.uniform(size=60) + 0.4 * y * (trial % 3), 1)  # ties
        t = mcc_threshold(y, scores)
        brute = max(mcc(y, scores > c) for c in [-np.inf, *np.unique(scores)])
        assert mcc(y, scores > t) == pytest.approx(brute, abs=1e-12)
