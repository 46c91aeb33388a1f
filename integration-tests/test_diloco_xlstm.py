"""DiLoCo-trained xLSTM: scaling-laws' DiLoCo trainer with M = 2 gloo processes training
tfla-mlstm's xLSTM LM on the fortunes corpus (each replica on its own half of the bytes).

Checked: replicas hold bit-identical parameters after every outer step and different ones inside
the inner phase; the first outer steps equal DiLoCo written out by hand in one process; the
held-out loss ends below the corpus' unigram entropy; and the ways this combination cannot work
fail loudly (recurrent state carried in buffers, a checkpoint resumed with another number of
replicas, a Triton backend where Triton cannot run).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # replicas import the job from here

from diloco_xlstm_jobs import (
    XLSTMJob,
    build_xlstm,
    fortunes_tokens,
    lm_loss,
    shard,
    xlstm_job,
)

from scaling_laws.diloco import (
    DiLoCoConfig,
    DiLoCoTrainer,
    WorkerFailed,
    latest_checkpoint,
    launch_local,
)

M = 2
CONFIG = DiLoCoConfig(
    total_steps=80, inner_steps=10, inner_lr=1e-2, warmup_steps=10, outer_lr=0.7, seed=0
)
SYNCS = list(range(10, 81, 10))
PROBES = (5, 15, 25)  # mid inner phase
ORACLE_SYNCS = (10, 20, 30)  # outer steps replayed by hand


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    checkpoints = tmp_path_factory.mktemp("diloco-xlstm")
    job = XLSTMJob(
        CONFIG, probe_steps=PROBES, record_syncs=ORACLE_SYNCS, checkpoint_dir=str(checkpoints)
    )
    results = launch_local(xlstm_job, M, (job,), timeout_s=300)
    return results, checkpoints


def test_replicas_agree_after_every_outer_step_and_differ_inside(run):
    (rank0, rank1), _ = run
    assert [step for step, _ in rank0["syncs"]] == SYNCS
    assert rank0["syncs"] == rank1["syncs"]  # sha256 of all parameters: bit-identical
    assert rank0["outer_steps"] == rank1["outer_steps"] == len(SYNCS)
    # inside the inner phase each replica has taken AdamW steps on its own shard
    assert [step for step, _ in rank0["probes"]] == list(PROBES)
    for (step, a), (_, b) in zip(rank0["probes"], rank1["probes"], strict=True):
        assert a != b, f"replicas identical in the inner phase at step {step}"
    assert not np.array_equal(rank0["losses"], rank1["losses"])
    # one flat fp32 pseudo-gradient of every parameter per outer step, nothing else
    params = sum(p.numel() for p in build_xlstm().parameters())
    assert rank0["communicated_bytes"] == len(SYNCS) * params * 4


def test_held_out_loss_falls_below_the_unigram_entropy(run):
    """Start: a random model (~6 nats/byte, above ln 256 = 5.55). A model that ignores context
    cannot beat the bytes' unigram entropy (3.30 nats, computed from the training split), so
    ending below it means the DiLoCo-trained xLSTM uses context. The held-out batch (64 windows
    of 64 bytes) estimates the loss with a standard error of ~0.07 nats (measured from the spread
    of per-window means of a model at this loss; bytes within a window are correlated, so the
    per-byte figure, 0.025, understates it); the margin asked for, 0.2 nats, is ~3 of those."""
    (rank0, rank1), _ = run
    tokens = fortunes_tokens("train").numpy()
    p = np.bincount(tokens, minlength=256) / len(tokens)
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    print(
        f"DiLoCo xLSTM (M={M}, H={CONFIG.inner_steps}, {CONFIG.total_steps} steps): held-out "
        f"loss {rank0['val_start']:.3f} -> {rank0['val_end']:.3f} nats/byte "
        f"(unigram entropy {entropy:.3f})"
    )
    assert rank0["val_start"] > np.log(256)
    assert rank0["val_end"] == rank1["val_end"]  # same parameters, same batch
    assert rank0["val_end"] < entropy - 0.2


def test_first_outer_steps_equal_diloco_written_out_by_hand(run):
    """The oracle: two xLSTM replicas in this process, each AdamW on its own shard (generator
    seed + rank, the same lr schedule and clipping), every H steps Δ = mean_m(θ_g − θ_m),
    Nesterov b ← μb + Δ, θ_g ← θ_g − lr·(Δ + μb), replicas reset to θ_g, inner AdamW states kept.

    (With H = 1, outer lr 1 and no momentum DiLoCo is parameter averaging of AdamW steps, which
    is not data-parallel AdamW: Adam's per-replica normalisation is not linear in the gradient.
    So the oracle is DiLoCo itself, written without the trainer.)

    Exact equality, not a tolerance: AdamW on this model amplifies any difference in rounding
    chaotically (adding 1e-7 noise to θ_g after the first outer step moved weights by 2e-2 by
    the second; writing θ_g −= lr·(Δ + μb) with two roundings instead of one moved them by 8e-3),
    so a tolerance either hides real errors or fails on rounding. The oracle performs the same
    floating-point operations as the trainer (gloo's sum of two fp32 buffers is a + b; the
    Nesterov update written with the same multiply-adds as torch's SGD), and single-threaded like
    the launched replicas, so the parameters after three outer steps agree bit for bit.
    """
    (rank0, _), _ = run
    from benchdata import lm_batch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each launched replica runs
    try:
        replicas = [build_xlstm() for _ in range(M)]
        start = [p.detach().clone() for p in build_xlstm().parameters()]
        global_params = [p.clone() for p in start]
        momenta = [torch.zeros_like(g) for g in global_params]
        optimizers = [
            torch.optim.AdamW(
                m.parameters(),
                lr=CONFIG.inner_lr,
                betas=CONFIG.inner_betas,
                weight_decay=CONFIG.inner_weight_decay,
            )
            for m in replicas
        ]
        shards = [shard(fortunes_tokens("train"), r, M) for r in range(M)]
        generators = [torch.Generator().manual_seed(CONFIG.seed + r) for r in range(M)]
        mu, outer_lr = CONFIG.outer_momentum, CONFIG.outer_lr
        expected = {}
        for step in range(max(ORACLE_SYNCS)):
            for rank, (model, optimizer) in enumerate(zip(replicas, optimizers, strict=True)):
                for group in optimizer.param_groups:
                    group["lr"] = CONFIG.inner_lr_at(step)
                optimizer.zero_grad()
                batch = lm_batch(shards[rank], 8, 64, generators[rank])
                lm_loss(model, batch).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), CONFIG.max_grad_norm)
                optimizer.step()
            if (step + 1) % CONFIG.inner_steps == 0:
                with torch.no_grad():
                    for i, g in enumerate(global_params):
                        local = [list(m.parameters())[i] for m in replicas]
                        delta = ((g - local[0]) + (g - local[1])) / 2
                        momenta[i] = momenta[i] * mu + delta
                        g.add_(torch.add(delta, momenta[i], alpha=mu), alpha=-outer_lr)
                        for p in local:
                            p.copy_(g)
                expected[step + 1] = [g.numpy().copy() for g in global_params]
    finally:
        torch.set_num_threads(threads)
    for sync in ORACLE_SYNCS:
        for ours, reference in zip(rank0["recorded"][sync], expected[sync], strict=True):
            assert np.array_equal(ours, reference), f"differs from the oracle after step {sync}"
    moved = max(
        float(np.abs(a - b.numpy()).max())
        for a, b in zip(expected[max(ORACLE_SYNCS)], start, strict=True)
    )
    assert moved > 1e-2  # the comparison is of trained weights, not of the initialisation


def test_resuming_with_another_number_of_replicas_fails(run):
    """The M = 2 checkpoint holds two replicas' inner AdamW states and data streams: one process
    cannot continue it (M is the world size), and says so."""
    _, checkpoints = run
    path = latest_checkpoint(checkpoints)
    assert path is not None
    assert path.name == f"step_{CONFIG.total_steps:08d}"
    trainer = DiLoCoTrainer(build_xlstm(), lm_loss, CONFIG)
    with pytest.raises(ValueError, match="checkpoint has 2 replicas, this job has 1"):
        trainer.load(path)


def test_recurrent_state_carried_in_buffers_fails_at_the_first_sync():
    """Stateful xLSTM training keeps each layer's (C, n, m) in buffers across batches. DiLoCo
    averages parameters only, so every replica's state follows its own shard: the trainer finds
    the buffers differ at the first sync and stops every replica with their names."""
    config = DiLoCoConfig(total_steps=4, inner_steps=2, inner_lr=1e-2)
    job = XLSTMJob(config, batch_size=2, eval_sequences=2, stateful=True)
    with pytest.raises(WorkerFailed, match=r"model buffers \['C0', 'n0', 'm0', 'C1'.* differ"):
        launch_local(xlstm_job, M, (job,), timeout_s=120)


def test_triton_backend_where_triton_cannot_run_fails(monkeypatch):
    """On a CPU-only gloo run an xLSTM built for the Triton backend cannot run its kernels:
    without TRITON_INTERPRET the first inner step raises (Triton needs CUDA tensors, or is not
    installed) instead of silently training on another path."""
    from kernels_common.backend import BackendUnavailableError

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("KERNELS_COMMON_BACKEND", raising=False)
    trainer = DiLoCoTrainer(
        build_xlstm(backend="triton"), lm_loss, DiLoCoConfig(total_steps=2, inner_steps=1)
    )
    batch = (torch.zeros(1, 64, dtype=torch.long), torch.zeros(1, 64, dtype=torch.long))
    with pytest.raises(BackendUnavailableError, match="backend 'triton' needs"):
        trainer.train_step(batch)
    assert trainer.step == 0
