"""Private training under DDP (gloo, 2 and 3 processes under torchrun) against one process.

``distributed_cases.py`` runs every case on each rank; the same code without a process group is
the single-process oracle, and the clipping itself is checked against the brute-force oracle.
Tolerance: float32, 1e-5 relative to the largest entry (the ranks' partial sums are added in a
different order than one process adds the examples; observed errors are ~1e-7). The noise is
compared exactly: rank 0 draws it from the same generator state as one process would, and the
other ranks add exact zeros to it.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import distributed_cases as cases
import pytest
import torch
from oracle import RTOL, brute_force

from kernels_common.testing import markdown_python_blocks

HERE = Path(__file__).parent
WORLDS = (2, 3)


def run_processes(command: list[str], timeout: float = 240) -> str:
    """Run ``command`` (a torchrun launch) in its own process group, one thread per process, on
    the PyTorch reference kernels (no Triton interpreter); kill the whole group if it outlives
    ``timeout`` (a rank waiting in a collective must not outlive the test); return stdout.

    A launch in which a rank was killed by SIGABRT or SIGSEGV is run once more: on this CPU
    build, gloo's worker threads now and then abort a rank as it shuts down, after its work is
    done ("terminate called without an active exception"). A second failure fails the test."""
    try:
        return _run_processes(command, timeout)
    except AssertionError as error:
        if not re.search(r"\(SIG(ABRT|SEGV)\)", str(error)):
            raise
        return _run_processes(command, timeout)


def _run_processes(command: list[str], timeout: float) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"timed out after {timeout} s:\n{stdout[-3000:]}{stderr[-6000:]}")
    assert process.returncode == 0, stdout[-3000:] + stderr[-6000:]
    return stdout


def torchrun(world: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(world), *args]  # fmt: skip


def _torchrun(world: int, out: Path) -> list[dict]:
    run_processes(torchrun(world, str(HERE / "distributed_worker.py"), str(out)))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"world{w}")
def ranks(request, tmp_path_factory) -> list[dict]:
    return _torchrun(request.param, tmp_path_factory.mktemp(f"world{request.param}"))


@pytest.fixture(scope="module")
def single() -> dict:
    return cases.run_all(0, 1)


def assert_close(actual: dict, expected: dict, rtol: float = RTOL) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        scale = max(float(value.abs().max()), 1e-30)
        err = float((actual[name] - value).abs().max())
        assert err <= rtol * scale, f"{name}: max error {err:.3g}, scale {scale:.3g}"


def assert_identical_on_ranks(ranks: list[dict], key: str) -> None:
    first = ranks[0][key]
    for other in ranks[1:]:
        for name in first:
            assert torch.equal(other[key][name], first[name]), f"{key}/{name} differs"


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
@pytest.mark.parametrize("reverse", [False, True], ids=["ddp_of_private", "private_of_ddp"])
def test_ddp_equals_one_process_and_brute_force(ranks, single, clipping, reverse):
    key = f"one_backward_{clipping}_{reverse}"
    for step in range(2):
        x = cases.inputs(seed=step + 1)
        # Σ_b clip(g_b) / B; the release divides by the N examples counted on all ranks
        expected = brute_force(cases.net(), cases.loss, x, x, clipping, cases.C)
        assert_close(single[key][f"step{step}"], expected)
        assert_identical_on_ranks([r[key] for r in ranks], f"step{step}")
        assert_close(ranks[0][key][f"step{step}"], expected)


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
def test_no_sync_accumulates_one_logical_batch(ranks, single, clipping):
    key = f"no_sync_{clipping}"
    assert_identical_on_ranks([r[key] for r in ranks], "grads")
    assert_close(ranks[0][key]["grads"], single[key]["grads"])
    assert single[key]["steps"] == 1
    assert [r[key]["steps"] for r in ranks] == [1] * len(ranks)


def test_poisson_batches_split_over_ranks(ranks, single):
    """The local batches partition the global Poisson batch (some empty); the noisy release,
    the steps and ε equal one process's."""
    world = len(ranks)
    sizes = [r["poisson"]["sizes"] for r in ranks]
    assert [sum(s) for s in zip(*sizes, strict=True)] == single["poisson"]["sizes"]
    assert any(0 in s for s in sizes), "the case must include an empty local batch"
    for step in range(len(single["poisson"]["sizes"])):
        key = f"step{step}"
        assert_identical_on_ranks([r["poisson"] for r in ranks], key)
        assert_close(ranks[0]["poisson"][key], single["poisson"][key])
    epsilons = {r["poisson"]["epsilon"] for r in ranks}
    assert epsilons == {single["poisson"]["epsilon"]}, (world, epsilons)
    assert math.isfinite(single["poisson"]["epsilon"])


def test_noise_drawn_once(ranks, single):
    """Noise only: the release equals one process's noise exactly (one draw, not one per rank),
    is identical on every rank, and its variance is σ²C²/B²."""
    steps = len(single["noise"])
    for step in range(steps):
        assert_identical_on_ranks([r["noise"] for r in ranks], f"step{step}")
        for name, value in single["noise"][f"step{step}"].items():
            assert torch.equal(ranks[0]["noise"][f"step{step}"][name], value), name
    samples = torch.cat(
        [g.flatten() for s in range(steps) for g in ranks[0]["noise"][f"step{s}"].values()]
    )
    expected = (1.0 * cases.C / 4) ** 2  # σ = 1, C = 1, expected_batch_size = 4
    # the sample variance of n Gaussians has relative standard deviation √(2/n): 6 of them
    bound = 6 * math.sqrt(2 / samples.numel())
    assert samples.numel() > 5000
    assert abs(float(samples.var()) / expected - 1) < bound


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
def test_sensitivity_bounded_on_every_rank(ranks, clipping):
    """One example's gradient scaled by ~10⁶: the released sum changes by at most C, wherever
    that example sits."""
    results = ranks[0][f"sensitivity_{clipping}"]
    for owner in range(len(ranks)):
        with_it, without = results[f"owner{owner}_True"], results[f"owner{owner}_False"]
        change = torch.cat([(with_it[k] - without[k]).flatten() for k in with_it]).norm()
        assert 0.5 * cases.C < float(change) <= cases.C * (1 + 1e-4), (owner, float(change))


@pytest.mark.parametrize(
    ("key", "layer"),
    [("failure", "2.weight"), ("failure_inf", "0.weight"), ("failure_unused", "0.weight")],
    ids=["nan_every_layer", "inf_first_layer", "inf_find_unused_parameters"],
)
def test_failed_rank_discards_the_batch_everywhere(ranks, single, key, layer):
    """A non-finite norm on the last rank, in every layer (NaN) or only in the first one to
    run forward (inf: DDP has already marked the later layers ready), also with DDP's
    find_unused_parameters (its own all-reduce runs inside the backward): the batch is
    discarded on every rank, nobody waits, and the next batch is released normally."""
    world = len(ranks)
    failing = ranks[-1][key]
    assert failing["error"] == (
        f"FloatingPointError: non-finite per-example gradient norm in {layer!r}; the step was "
        "discarded"
    )
    for other in ranks[:-1]:
        assert other[key]["error"] == (
            f"RuntimeError: 1 of {world} ranks discarded this logical batch (a failed backward "
            "pass or abort()); it was discarded on every rank"
        )
    # nothing released: .grad is None, or the zeros DDP copies from its (unused) buckets
    assert all(r[key]["nothing_released"] for r in ranks)
    # the next batch is released normally, and the failed one was not counted
    assert_identical_on_ranks([r[key] for r in ranks], "after")
    assert_close(ranks[0][key]["after"], single["failure"]["after"])
    assert {r[key]["steps"] for r in ranks} == {2}


@pytest.mark.parametrize("key", ["local_empty", "local_empty_fsdp"], ids=["ddp", "fsdp2"])
def test_rank_local_empty_batches(ranks, single, key):
    """Ranks whose local batch is empty run a zero-weighted placeholder (the documented idiom)
    on a model with a buffer: every release equals one process's, noise included."""
    world = len(ranks)
    assert any(b and not all(b[r::world] for r in range(world)) for b in cases.GLOBAL_BATCHES)
    for step in range(len(cases.GLOBAL_BATCHES)):
        assert_identical_on_ranks([r[key] for r in ranks], f"step{step}")
        assert_close(ranks[0][key][f"step{step}"], single[key][f"step{step}"])


def test_fsdp_own_no_sync_and_escape(ranks, single):
    """FSDP2's set_requires_gradient_sync(False) defers the release like DDP's no_sync(); a
    gradient reaching a sharded parameter outside its layer fails the batch."""
    for r in ranks:
        more = r["fsdp_more"]
        assert more["no_sync_steps"] == 1
        assert_close(more["no_sync"], single["fsdp"]["accumulated"])
        assert "received a gradient outside its DP layer" in more["escape"]


def test_mismatched_setups_are_refused(ranks):
    for r in ranks:
        found = r["mismatches"]
        assert found["seed"].startswith("DistributedPoissonSampler got different seeds")
        assert found["settings"].startswith("the ranks' private models have different privacy")
        assert found["ddp_outer"].startswith(
            "the DistributedDataParallel module holds trainable parameters outside the private"
        )
        assert found["fsdp_outer"].startswith(
            "private parameters ['2.weight', '2.bias'] are not sharded by a fully_shard unit"
        )


def test_checkpoint_resumes_noise_and_accounting(ranks, single):
    for result in [single, *ranks]:
        state = result["checkpoint"]
        for name, value in state["third"].items():
            assert torch.equal(state["resumed"][name], value), name
        assert state["resumed_epsilon"] == state["epsilon"]
    assert_close(ranks[0]["checkpoint"]["third"], single["checkpoint"]["third"])


def test_ranks_out_of_step_are_refused(ranks):
    for r in ranks:
        assert "the ranks are out of step" in r["out_of_step"]["error"]


def test_refusals(ranks):
    refusals = ranks[0]["refusals"]
    assert refusals["hook"].startswith("this DistributedDataParallel module already has a comm")
    assert refusals["fsdp_flat"].startswith("clipping='flat' is not supported under FSDP2")
    assert refusals["fsdp_no_expected_batch_size"].startswith(
        "under FSDP2 (fully_shard) set expected_batch_size"
    )


def test_fsdp_per_layer_equals_one_process(ranks, single):
    """FSDP2 (each Linear and the root sharded): the gathered gradients equal one process's
    and brute force; accumulated micro-batches are one logical batch."""
    for step in range(2):
        x = cases.inputs(seed=step + 1)
        expected = brute_force(cases.net(), cases.loss, x, x, "per_layer", cases.C)
        assert_close(single["fsdp"][f"step{step}"], expected)
        assert_identical_on_ranks([r["fsdp"] for r in ranks], f"step{step}")
        assert_close(ranks[0]["fsdp"][f"step{step}"], expected)
    assert_close(ranks[0]["fsdp"]["accumulated"], single["fsdp"]["accumulated"])


def test_fsdp_noise_is_one_draw(ranks, single):
    """Each rank adds its rows of one full draw: the gathered noise is one process's, exactly."""
    for step in range(3):
        for name, value in single["fsdp"][f"noise{step}"].items():
            for r in ranks:
                assert torch.equal(r["fsdp"][f"noise{step}"][name], value), (step, name)


def test_fsdp_failed_rank_discards_the_batch_everywhere(ranks, single):
    """The failing rank finishes its backward (FSDP2's reduce-scatters must match) and every
    rank raises at the release; the next batch is released normally."""
    world = len(ranks)
    assert ranks[-1]["fsdp"]["error"].startswith("FloatingPointError: non-finite per-example")
    for other in ranks[:-1]:
        assert other["fsdp"]["error"].startswith(f"RuntimeError: 1 of {world} ranks discarded")
    assert all(r["fsdp"]["nothing_released"] for r in ranks)
    assert_close(ranks[0]["fsdp"]["after"], single["fsdp"]["after"])
    assert {r["fsdp"]["steps"] for r in ranks} == {single["fsdp"]["steps"]} == {4}
    assert {r["fsdp"]["epsilon"] for r in ranks} == {single["fsdp"]["epsilon"]}


def test_sampler_without_process_group():
    a = cases.flashdp.DistributedPoissonSampler(50, 0.2, seed=4, steps=3, rank=1, world_size=3)
    whole = cases.flashdp.PoissonSampler(50, 0.2, 3, torch.Generator().manual_seed(4))
    assert list(a) == [indices[1::3] for indices in whole]
    assert a.expected_batch_size == 10
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 3\)"):
        cases.flashdp.DistributedPoissonSampler(50, 0.2, seed=4, rank=3, world_size=3)
    with pytest.raises(TypeError, match="seed must be an int"):
        cases.flashdp.DistributedPoissonSampler(50, 0.2, seed=None)


def test_gpt2_example_under_torchrun(tmp_path):
    """The README's example: a small GPT-2 trained privately on 2 processes."""
    pytest.importorskip("transformers")
    example = HERE.parent / "examples" / "ddp_gpt2.py"
    stdout = run_processes(torchrun(2, str(example), "--steps", "3", "--epsilon", "8"))
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("ε = "), last
    assert last.endswith("after 3 steps"), last
    assert float(last.split()[2]) <= 8.0


def test_distributed_benchmark_runs(tmp_path):
    """The DDP / FSDP2 benchmark script (quick shape, one round) writes its table, Opacus'
    distributed DP-SGD beside flashdp."""
    script = HERE.parent / "benchmarks" / "bench_distributed.py"
    run_processes([sys.executable, str(script), "--quick", "--repeat", "1", "--out", str(tmp_path)])
    table = (tmp_path / "bench_flashdp_distributed.md").read_text()
    rows = ("DDP non-DP", "DDP flashdp per_layer", "DDP flashdp flat", "FSDP2 flashdp")
    rows += ("Opacus DPDDP per_layer hooks", "Opacus DPDDP ghost")  # the anchor (test extra)
    for row in rows:
        assert f"| {row}" in table


def test_readme_torchrun_example(tmp_path):
    """The README's DDP block, run as written on 2 processes: ε printed and equal on both."""
    (block,) = [
        b for b in markdown_python_blocks(HERE.parent / "README.md") if b.startswith("# torchrun ")
    ]
    script = tmp_path / "train.py"
    script.write_text(block)
    stdout = run_processes(torchrun(2, str(script)))
    # `<rank> <epsilon>` lines; some torch releases' gloo also prints its connections to stdout
    lines = [line for line in stdout.splitlines() if re.fullmatch(r"\d+ \S+", line)]
    printed = sorted(line.split() for line in lines)
    assert [rank for rank, _ in printed] == ["0", "1"], f"stdout was:\n{stdout[-3000:]}"
    assert printed[0][1] == printed[1][1]
    assert 0 < float(printed[0][1]) < math.inf


def test_abort_inside_no_sync(ranks, single):
    for r in ranks:
        found = r["abort_in_no_sync"]
        assert found["error"].startswith("this logical batch was discarded on every rank")
        assert found["steps"] == 3  # the first iteration and the two after the discarded one
        for step in range(2):
            assert_close(found[f"after{step}"], single["one_backward_per_layer_False"]["step0"])
