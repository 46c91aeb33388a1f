"""DiLoCo trainer: reduction to plain AdamW, identical replicas across gloo processes, exact
kill-and-resume, communication accounting, checkpoint round trips and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scaling_laws.diloco import (
    DiLoCoConfig,
    DiLoCoTrainer,
    WorkerFailed,
    fit_joint_law,
    fit_model_size_law,
    latest_checkpoint,
    launch_local,
)
from scaling_laws.diloco.jobs import FAILURE_EXIT_CODE, JobSpec, build_model, train_job
from scaling_laws.diloco.launch import _first_failure, _Raised

MLP_PARAMS = 8 * 32 + 32 + 32 + 1  # Linear(8, 32) + Linear(32, 1)


def _spec(tmp_dir=None, **overrides) -> JobSpec:
    config = overrides.pop("config", None) or DiLoCoConfig(
        total_steps=12, inner_steps=4, inner_lr=3e-2, warmup_steps=2, outer_lr=0.7
    )
    fields = {"model": "mlp", "data": "synthetic", "batch_size": 8}
    if tmp_dir is not None:
        fields.update(checkpoint_dir=str(tmp_dir), checkpoint_every=3)
    fields.update(overrides)
    return JobSpec(config, **fields)


def test_one_replica_one_inner_step_is_plain_adamw():
    """M = 1, H = 1, outer lr 1, no momentum: θ_global − 1·(θ_global − θ_local) = θ_local.

    In floating point x − (x − y) equals y exactly when x − y is exact (Sterbenz: y/2 ≤ x ≤ 2y),
    which holds for almost every weight after one small AdamW step; otherwise the error is at most
    one rounding of x − y, i.e. ≤ 1 ulp of |x| per step. Over 30 steps of a model with weights of
    order 1 that bounds the gap by ~30 · 1.2e-7 · max|θ|; we allow 1e-5 absolute.
    """
    config = DiLoCoConfig(
        total_steps=30,
        inner_steps=1,
        inner_lr=1e-2,
        warmup_steps=3,
        outer_lr=1.0,
        outer_momentum=0.0,
        nesterov=False,
    )
    spec = JobSpec(config, model="mlp", data="synthetic")
    result = train_job(0, 1, spec)

    # the oracle: a hand-written AdamW loop with the same lr schedule, clipping and batches
    model = build_model(spec)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=config.inner_weight_decay
    )
    generator = torch.Generator().manual_seed(config.seed)
    teacher = torch.randn(8, generator=torch.Generator().manual_seed(1234))
    for step in range(30):
        for group in optimizer.param_groups:
            group["lr"] = config.inner_lr_at(step)
        x = torch.randn(spec.batch_size, 8, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x @ teacher)[:, None])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    moved = 0.0
    for ours, reference, start in zip(
        result["final"], model.parameters(), build_model(spec).parameters(), strict=True
    ):
        np.testing.assert_allclose(ours, reference.detach().numpy(), rtol=0, atol=1e-5)
        moved = max(moved, float((reference - start).abs().max().detach()))
    assert moved > 0.1  # training moved the weights far beyond the tolerance
    assert result["communicated_bytes"] == 0
    assert result["outer_steps"] == 30


def test_in_process_checkpoint_resume_is_exact(tmp_path):
    uninterrupted = train_job(0, 1, _spec())
    first = _spec(tmp_path, fail_at_step=None)
    # run 7 of 12 steps, checkpointing every 3 (latest: step 6, mid outer interval)
    model = build_model(first)
    from scaling_laws.diloco.jobs import _data

    batch_fn, loss_fn, _ = _data(first)
    trainer = DiLoCoTrainer(model, loss_fn, first.config)
    for _ in range(7):
        trainer.train_step(batch_fn(trainer.step, 0, trainer.generator))
        if trainer.step % 3 == 0:
            trainer.save(tmp_path / f"step_{trainer.step:08d}")
    assert latest_checkpoint(tmp_path).name == "step_00000006"
    resumed = train_job(0, 1, first)
    for a, b in zip(uninterrupted["final"], resumed["final"], strict=True):
        assert np.array_equal(a, b)


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    """One 2-process gloo run with checkpoints every 3 steps (the uninterrupted reference)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    return launch_local(train_job, 2, (_spec(folder),), timeout_s=120)


def test_replicas_identical_after_every_outer_step(two_replicas):
    rank0, rank1 = two_replicas
    assert [s for s, _ in rank0["digests"]] == [4, 8, 12]
    assert rank0["digests"] == rank1["digests"]
    # the replicas saw different data in between (otherwise the test could not fail)
    assert not np.array_equal(rank0["losses"], rank1["losses"])
    # one flat fp32 pseudo-gradient per outer step
    assert rank0["communicated_bytes"] == 3 * MLP_PARAMS * 4


def test_data_parallel_replicas_identical_every_step():
    spec = _spec(config=DiLoCoConfig(total_steps=6, algorithm="data_parallel", inner_lr=3e-2))
    rank0, rank1, rank2 = launch_local(train_job, 3, (spec,), timeout_s=120)
    assert len(rank0["digests"]) == 6
    assert rank0["digests"] == rank1["digests"] == rank2["digests"]
    assert rank0["communicated_bytes"] == 6 * MLP_PARAMS * 4  # one gradient all-reduce a step
    # the oracle: one AdamW on the mean of the three replicas' gradients (each replica's batch
    # from generator seed + rank), clipped after averaging. gloo may sum three fp32 buffers in
    # another order than (a + b) + c: ~1 ulp per gradient, a few ulps of the weights after 6
    # steps, hence 1e-6 absolute
    from scaling_laws.diloco.jobs import _data

    config = spec.config
    batch_fn, loss_fn, _ = _data(spec)
    model = build_model(spec)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.inner_lr,
        betas=config.inner_betas,
        weight_decay=config.inner_weight_decay,
    )
    generators = [torch.Generator().manual_seed(config.seed + r) for r in range(3)]
    for step in range(config.total_steps):
        grads = []
        for rank in range(3):
            model.zero_grad()
            loss_fn(model, batch_fn(step, rank, generators[rank])).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = (grads[0][i] + grads[1][i] + grads[2][i]) / 3
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = config.inner_lr_at(step)
        optimizer.step()
    for ours, reference in zip(rank0["final"], model.parameters(), strict=True):
        np.testing.assert_allclose(ours, reference.detach().numpy(), rtol=0, atol=1e-6)


def test_kill_and_resume_reproduces_the_uninterrupted_run(two_replicas, tmp_path):
    killed = _spec(tmp_path, fail_at_step=7, fail_rank=1)
    with pytest.raises(WorkerFailed) as failure:
        launch_local(train_job, 2, (killed,), timeout_s=60)
    assert failure.value.exitcode == FAILURE_EXIT_CODE
    assert latest_checkpoint(tmp_path).name == "step_00000006"
    resumed = launch_local(train_job, 2, (_spec(tmp_path),), timeout_s=120)
    for rank in range(2):
        for a, b in zip(two_replicas[rank]["final"], resumed[rank]["final"], strict=True):
            assert np.array_equal(a, b)  # bit-exact
        assert resumed[rank]["digests"][-1] == two_replicas[rank]["digests"][-1]
        assert resumed[rank]["communicated_bytes"] == two_replicas[rank]["communicated_bytes"]


def test_checkpoint_mismatch_and_bad_config(tmp_path):
    trainer = DiLoCoTrainer(torch.nn.Linear(2, 1), lambda m, b: m(b).sum(), DiLoCoConfig())
    trainer.save(tmp_path / "step_00000000")
    # a folder left by a save killed before its rename is never taken for a checkpoint
    (tmp_path / "step_00000009.partial").mkdir()
    (tmp_path / "step_00000009.partial" / "meta.json").write_text("{}")
    assert latest_checkpoint(tmp_path).name == "step_00000000"
    other = DiLoCoTrainer(
        torch.nn.Linear(2, 1), lambda m, b: m(b).sum(), DiLoCoConfig(outer_lr=0.5)
    )
    with pytest.raises(ValueError, match="config differs"):
        other.load(tmp_path / "step_00000000")
    with pytest.raises(FileNotFoundError):
        other.load(tmp_path / "missing")
    with pytest.raises(ValueError, match="algorithm"):
        DiLoCoConfig(algorithm="fedavg")
    with pytest.raises(ValueError, match="inner_steps"):
        DiLoCoConfig(inner_steps=0)
    with pytest.raises(ValueError, match="nesterov"):
        DiLoCoConfig(outer_momentum=0.0)
    with pytest.raises(TypeError, match=r"nn\.Module"):
        DiLoCoTrainer(lambda x: x, lambda m, b: b, DiLoCoConfig())
    with pytest.raises(ValueError, match="nprocs"):
        launch_local(train_job, 0)


def test_paper_laws_recovered_from_their_own_values():
    n = np.array([35e6, 90e6, 180e6, 335e6, 550e6, 1.3e9, 2.4e9])
    law = fit_model_size_law(n, 19.762 * n**-0.0992, n_bootstrap=0)
    assert law.coefficient == pytest.approx(19.762, rel=1e-9)
    assert law.exponents[0] == pytest.approx(-0.0992, abs=1e-12)
    nn, mm = np.meshgrid(n, [1.0, 2.0, 4.0, 8.0])
    joint = fit_joint_law(
        nn.ravel(), mm.ravel(), 22256 * nn.ravel() ** -0.8827 * mm.ravel() ** 0.2929
    )
    assert joint.exponents == pytest.approx((-0.8827, 0.2929), abs=1e-9)
    with pytest.raises(ValueError, match="two replica counts"):
        fit_joint_law(n, np.ones_like(n), n)


def test_two_replicas_match_a_hand_written_diloco(two_replicas):
    """The 2-process run against DiLoCo written out in one process: two AdamW replicas on their
    own batches (generator seed + rank), every H = 4 steps Δ = mean(θ_g − θ_m), Nesterov
    b ← μb + Δ, θ_g ← θ_g − lr·(Δ + μb), replicas reset to θ_g.

    gloo sums two fp32 buffers (a + b is commutative, so the same bits) and divides by 2; torch's
    SGD applies the same operations, but fused kernels may round differently: over 3 outer steps
    of weights of order 1 that is a few ulps, hence 1e-6 absolute.
    """
    spec = _spec()
    config = spec.config
    from scaling_laws.diloco.jobs import _data

    batch_fn, loss_fn, _ = _data(spec)
    global_params = [p.detach().clone() for p in build_model(spec).parameters()]
    buffers = [torch.zeros_like(g) for g in global_params]
    replicas = [build_model(spec) for _ in range(2)]
    optimizers = [
        torch.optim.AdamW(
            m.parameters(),
            lr=config.inner_lr,
            betas=config.inner_betas,
            weight_decay=config.inner_weight_decay,
        )
        for m in replicas
    ]
    generators = [torch.Generator().manual_seed(config.seed + r) for r in range(2)]
    for step in range(config.total_steps):
        for rank, (model, optimizer) in enumerate(zip(replicas, optimizers, strict=True)):
            for group in optimizer.param_groups:
                group["lr"] = config.inner_lr_at(step)
            optimizer.zero_grad()
            loss_fn(model, batch_fn(step, rank, generators[rank])).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
        if (step + 1) % config.inner_steps == 0:
            with torch.no_grad():
                for i, g in enumerate(global_params):
                    locals_ = [list(m.parameters())[i] for m in replicas]
                    delta = ((g - locals_[0]) + (g - locals_[1])) / 2
                    buffers[i] = config.outer_momentum * buffers[i] + delta
                    g -= config.outer_lr * (delta + config.outer_momentum * buffers[i])
                    for p in locals_:
                        p.copy_(g)
    for rank in range(2):
        for ours, reference in zip(two_replicas[rank]["final"], global_params, strict=True):
            np.testing.assert_allclose(ours, reference.numpy(), rtol=0, atol=1e-6)
    start = [p.detach() for p in build_model(spec).parameters()]
    moved = max(float((g - s).abs().max()) for g, s in zip(global_params, start, strict=True))
    assert moved > 0.05  # the outer steps moved the weights far beyond the tolerance


def test_the_root_cause_is_reported_not_the_collective_errors_it_caused():
    """Replica 1 raises first; replica 0 then fails in an all-reduce with a later traceback;
    replica 2 dies without raising (killed), which no peer can cause: it is the root cause."""
    first, later = _Raised("ValueError: the real error"), _Raised("RuntimeError: peer closed")
    first.time, later.time = 10.0, 10.5
    assert _first_failure({0: 1, 1: 1}, {0: later, 1: first}) == (1, 1, first.text)
    assert _first_failure({0: 1, 1: 1}, {0: first, 1: later}) == (0, 1, first.text)
    assert _first_failure({0: 1, 1: 1, 2: -9}, {0: later, 1: first}) == (2, -9, None)
    assert _first_failure({0: 3, 1: 3}, {}) == (0, 3, None)  # nothing to tell them apart: rank


def test_a_replica_that_raises_stops_the_job_and_reports_its_traceback():
    """No deadlock: replica 0 waits in the step-4 all-reduce that replica 1 (raised after step 2)
    never joins; the launcher stops it long before the 300 s collective timeout, and the error
    names the failing replica and carries its traceback."""
    import time

    spec = _spec(fail_at_step=2, fail_rank=1, fail_by_raising=True)
    started = time.perf_counter()
    with pytest.raises(WorkerFailed, match="fault drill: replica 1 raised after step 2") as error:
        launch_local(train_job, 2, (spec,), timeout_s=300)
    assert error.value.rank == 1
    assert error.value.exitcode == 1
    assert "Traceback" in error.value.traceback
    assert time.perf_counter() - started < 120


def test_replicas_whose_buffers_drift_apart_fail_loudly(monkeypatch):
    """BatchNorm's running statistics follow each replica's own batches and DiLoCo averages
    parameters only: the first sync finds the buffers differ and every replica raises (no hang).
    A buffer that stays constant passes the same check."""
    import pathlib

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent))
    from diloco_workers import buffer_job

    with pytest.raises(
        WorkerFailed, match=r"model buffers \['norm.running_mean', 'norm.running_var'\] differ"
    ):
        launch_local(buffer_job, 2, (True,), timeout_s=60)
    rank0, rank1 = launch_local(buffer_job, 2, (False,), timeout_s=60)
    assert [s for s, _ in rank0] == [2, 4]
    assert rank0 == rank1
    # a buffer the forward replaces by a new tensor is compared too (not the one it replaced)
    with pytest.raises(WorkerFailed, match=r"model buffers \['last'\] differ"):
        launch_local(buffer_job, 2, (False, True), timeout_s=60)
